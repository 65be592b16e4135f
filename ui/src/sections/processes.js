// The guest's processes (GET .../processes), with SIGTERM / SIGKILL buttons. Refreshed every
// 5 s while "auto" is on and the sandbox runs (listing counts as activity).
import * as api from '../api.js';
import { h, replaceChildren, statusLine } from '../dom.js';
import { reportError } from '../messages.js';
import * as fmt from '../format.js';
import { poller } from '../poll.js';

const REFRESH_MS = 5000;

export function processesSection(shared) {
  const tbody = h('tbody', { testid: 'process-rows' });
  const status = statusLine('processes-status');
  const auto = h('input', { type: 'checkbox', checked: true, testid: 'processes-auto' });
  const refreshButton = h('button', { type: 'button', testid: 'processes-refresh', text: 'Refresh' });
  const el = h('section', { class: 'card', testid: 'processes-section' },
    h('div', { class: 'section-head' }, h('h2', { text: 'Processes' }),
      h('span', { class: 'buttons' }, h('label', {}, auto, ' auto'), refreshButton)),
    h('div', { class: 'table-wrap short' },
      h('table', { class: 'list' },
        h('thead', {}, h('tr', {}, ['PID', 'Command', 'Cwd', 'Tag', ''].map((t) => h('th', { text: t })))),
        tbody)),
    status.el);
  let state = null;
  let destroyed = false;

  async function signal(pid, sig) {
    try {
      await api.post(api.sandboxPath(shared.id, `/processes/${encodeURIComponent(pid)}/signal`), { signal: sig });
      status.ok(`Sent ${sig} to ${pid}.`);
      poll.now();
    } catch (e) {
      status.error(`${sig} to ${pid} failed: ${api.describeError(e)}`);
      reportError(`signal ${pid} in ${shared.id}`, e);
    }
  }

  // A guest may run tens of thousands of processes with long command lines: the table shows the
  // first MAX_ROWS, each cut short, so a redraw never stalls the page.
  const MAX_ROWS = 500;
  const MAX_COMMAND = 1024;
  function render(all) {
    const list = all.slice(0, MAX_ROWS);
    replaceChildren(tbody, list.map((p) => {
      const command = [p.cmd, ...(Array.isArray(p.args) ? p.args : [])].join(' ').slice(0, MAX_COMMAND);
      return h('tr', { testid: 'process-row', 'data-pid': String(p.pid) },
        h('td', { class: 'mono', text: String(p.pid) }),
        h('td', { class: 'mono cmd', text: command, title: command }),
        h('td', { class: 'mono', text: p.cwd || '' }),
        h('td', { class: 'mono', text: p.tag || '' }),
        h('td', { class: 'row-actions' },
          h('button', { type: 'button', class: 'small', text: 'TERM', title: 'send SIGTERM',
                        onClick: () => signal(p.pid, 'SIGTERM') }),
          h('button', { type: 'button', class: 'small danger', text: 'KILL', title: 'send SIGKILL',
                        onClick: () => signal(p.pid, 'SIGKILL') })));
    }));
    if (!list.length) tbody.appendChild(h('tr', {}, h('td', { colspan: 5, class: 'muted', text: 'No processes.' })));
    if (all.length > list.length) {
      tbody.appendChild(h('tr', {}, h('td', { colspan: 5, class: 'muted',
        text: `${all.length - list.length} more processes are not shown.` })));
    }
  }

  async function load() {
    if (!state) return;
    if (state !== 'running') {
      status.ok(`Processes are listed while the sandbox runs (it is ${state}).`);
      return;
    }
    try {
      // A poll only looks: it must not resume a sandbox suspended since the page last read it.
      const res = await api.get(api.sandboxPath(shared.id, '/processes'), { headers: { 'X-Space-No-Resume': '1' } });
      if (destroyed) return;
      const list = Array.isArray(res && res.processes) ? res.processes : [];
      render(list);
      status.ok(`${list.length} process${list.length === 1 ? '' : 'es'}; updated ${fmt.clock()}.`);
    } catch (e) {
      if (!destroyed) status.error(`Cannot list processes: ${api.describeError(e)}`);
    }
  }
  const poll = poller(load, () => (auto.checked ? REFRESH_MS : null));
  refreshButton.addEventListener('click', () => poll.now());
  auto.addEventListener('change', () => { if (auto.checked) poll.now(); });

  return {
    el,
    update(sb) {
      const changed = state !== sb.state;
      state = sb.state;
      if (changed) poll.now();
    },
    destroy() { destroyed = true; poll.stop(); },
  };
}
