// A file browser over the guest's files: list a directory (GET .../files/list), go into
// directories, download (GET .../files?path=, a plain link: the cookie authenticates it),
// upload (PUT .../files, the file as the raw body), make a directory, delete.
import * as api from '../api.js';
import { h, replaceChildren, statusLine } from '../dom.js';
import { reportError } from '../messages.js';
import * as fmt from '../format.js';

const HOME = '/home/user';

export function joinPath(dir, name) {
  return dir.endsWith('/') ? dir + name : dir + '/' + name;
}

export function parentPath(path) {
  const p = path.length > 1 ? path.replace(/\/+$/, '') : path;
  const i = p.lastIndexOf('/');
  if (i <= 0) return '/';
  return p.slice(0, i);
}

export function filesSection(shared) {
  let cwd = HOME;
  let state = null;
  let loadedOnce = false;
  let destroyed = false;

  const pathInput = h('input', { type: 'text', value: cwd, class: 'mono', testid: 'files-path', 'aria-label': 'directory' });
  const goButton = h('button', { type: 'submit', testid: 'files-go', text: 'Go' });
  const upButton = h('button', { type: 'button', testid: 'files-up', text: 'Up' });
  const pathForm = h('form', { class: 'inline-form' }, pathInput, goButton, upButton);
  const upload = h('input', { type: 'file', multiple: true, testid: 'files-upload', 'aria-label': 'upload files' });
  const mkdirName = h('input', { type: 'text', placeholder: 'new directory', testid: 'files-mkdir-name', 'aria-label': 'new directory name' });
  const mkdirButton = h('button', { type: 'submit', testid: 'files-mkdir', text: 'Make directory' });
  const mkdirForm = h('form', { class: 'inline-form' }, mkdirName, mkdirButton);
  const tbody = h('tbody', { testid: 'file-rows' });
  const status = statusLine('files-status');
  const el = h('section', { class: 'card', testid: 'files-section' },
    h('div', { class: 'section-head' }, h('h2', { text: 'Files' })),
    pathForm,
    h('div', { class: 'inline-form' }, h('label', {}, 'Upload into this directory: ', upload)),
    mkdirForm,
    h('div', { class: 'table-wrap short' },
      h('table', { class: 'list' },
        h('thead', {}, h('tr', {}, ['Name', 'Size', 'Mode', 'Owner', 'Modified', ''].map((t) => h('th', { text: t })))),
        tbody)),
    status.el);

  const filesUrl = (path) => api.sandboxPath(shared.id, '/files') + api.query({ path });

  function row(entry) {
    const isDir = entry.type === 'dir';
    const path = entry.path || joinPath(cwd, entry.name);
    const nameCell = isDir
      ? h('button', { type: 'button', class: 'link', testid: 'file-open', text: entry.name + '/',
                      onClick: () => list(path) })
      : h('span', { text: entry.name + (entry.type === 'symlink' && entry.symlink_target ? ` → ${entry.symlink_target}` : '') });
    return h('tr', { testid: 'file-row', 'data-name': entry.name, 'data-type': entry.type || '' },
      h('td', { class: 'mono name' }, nameCell),
      h('td', { text: isDir ? '' : fmt.bytes(entry.size) }),
      h('td', { class: 'mono', text: entry.permissions || (entry.mode !== undefined ? String(entry.mode) : '') }),
      h('td', { text: [entry.owner, entry.group].filter(Boolean).join(':') }),
      h('td', { text: entry.modified_at ? fmt.timestamp(entry.modified_at) : '' }),
      h('td', { class: 'row-actions' },
        isDir ? null : h('a', { href: filesUrl(path), download: entry.name, testid: 'file-download', class: 'button small',
                                text: 'Download' }),
        h('button', { type: 'button', class: 'small danger', testid: 'file-delete', text: 'Delete',
                      onClick: () => remove(path, isDir) })));
  }

  async function list(path) {
    path = (path || '').trim() || HOME;
    status.busy(`Listing ${path}…`);
    try {
      const res = await api.get(api.sandboxPath(shared.id, '/files/list') + api.query({ path, depth: 1 }),
        { headers: { 'X-Space-No-Resume': '1' } });
      if (destroyed) return;
      const entries = (Array.isArray(res && res.entries) ? res.entries : []).slice();
      entries.sort((a, b) => ((b.type === 'dir') - (a.type === 'dir')) || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
      cwd = path;
      pathInput.value = cwd;
      replaceChildren(tbody, entries.map(row));
      if (!entries.length) tbody.appendChild(h('tr', {}, h('td', { colspan: 6, class: 'muted', text: 'Empty directory.' })));
      status.ok(`${cwd}: ${entries.length} entr${entries.length === 1 ? 'y' : 'ies'}.`);
    } catch (e) {
      if (!destroyed) status.error(`Cannot list ${path}: ${api.describeError(e)}`);
    }
  }

  async function remove(path, isDir) {
    if (!window.confirm(`Delete ${path}${isDir ? ' and everything in it' : ''}?`)) return;
    try {
      await api.del(filesUrl(path));
      status.ok(`Deleted ${path}.`);
      await list(cwd);
    } catch (e) {
      status.error(`Cannot delete ${path}: ${api.describeError(e)}`);
      reportError(`delete ${path}`, e);
    }
  }

  pathForm.addEventListener('submit', (ev) => { ev.preventDefault(); list(pathInput.value); });
  upButton.addEventListener('click', () => list(parentPath(cwd)));
  mkdirForm.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const name = mkdirName.value.trim();
    if (!name) return;
    const path = name.startsWith('/') ? name : joinPath(cwd, name);
    try {
      await api.post(api.sandboxPath(shared.id, '/files/mkdir'), { path });
      mkdirName.value = '';
      await list(cwd);
      status.ok(`Made ${path}.`);
    } catch (e) {
      status.error(`Cannot make ${path}: ${api.describeError(e)}`);
      reportError(`mkdir ${path}`, e);
    }
  });
  upload.addEventListener('change', async () => {
    const chosen = Array.from(upload.files || []);
    if (!chosen.length) return;
    const dir = cwd;
    upload.disabled = true;
    let done = 0;
    try {
      for (const file of chosen) {
        const path = joinPath(dir, file.name);
        status.busy(`Uploading ${file.name} (${fmt.bytes(file.size)})…`);
        await api.request('PUT', filesUrl(path), { body: file });
        done++;
      }
      await list(dir);
      status.ok(`Uploaded ${done} file${done === 1 ? '' : 's'} into ${dir}.`);
    } catch (e) {
      status.error(`Upload failed after ${done} file${done === 1 ? '' : 's'}: ${api.describeError(e)}`);
      reportError('upload', e);
    } finally {
      upload.value = '';
      upload.disabled = false;
    }
  });

  return {
    el,
    update(sb) {
      state = sb.state;
      const running = state === 'running';
      for (const c of [pathInput, goButton, upButton, upload, mkdirName, mkdirButton]) c.disabled = !running;
      if (running && !loadedOnce) { loadedOnce = true; list(cwd); }
      if (!running && !loadedOnce) status.ok(`Files are browsable while the sandbox runs (it is ${state}).`);
    },
    destroy() { destroyed = true; },
  };
}
