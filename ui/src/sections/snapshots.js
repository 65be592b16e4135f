// The sandbox's snapshots (GET /v1/snapshots?sandbox_id=) and, under each, the sandboxes
// branched from it; take one (header), branch one into N sandboxes, delete one.
import * as api from '../api.js';
import { h, replaceChildren, statusLine } from '../dom.js';
import { reportError, info } from '../messages.js';
import * as fmt from '../format.js';
import { poller } from '../poll.js';

const REFRESH_MS = 10000;
const ALL_STATES = 'creating,running,paused,suspended,failed,deleted';

export function snapshotsSection(shared) {
  const tree = h('ul', { class: 'tree', testid: 'snapshot-tree' });
  const origin = h('p', { class: 'muted', testid: 'snapshot-origin' });
  const status = statusLine('snapshots-action'); // what the last action did
  const loadStatus = statusLine('snapshots-status');
  const refreshButton = h('button', { type: 'button', testid: 'snapshots-refresh', text: 'Refresh' });
  const el = h('section', { class: 'card wide', testid: 'snapshots-section' },
    h('div', { class: 'section-head' }, h('h2', { text: 'Snapshots and branches' }), h('span', { class: 'buttons' }, refreshButton)),
    origin, tree, status.el, loadStatus.el);
  const countInputs = new Map(); // snapshot id -> its count input (kept across refreshes)
  let destroyed = false;
  let started = false;
  let originShown = null;
  let busy = false;

  function countInput(snapId) {
    let input = countInputs.get(snapId);
    if (!input) {
      input = h('input', { type: 'number', min: 1, max: 64, step: 1, value: '1', class: 'count', testid: 'branch-count',
                           'aria-label': 'number of sandboxes' });
      countInputs.set(snapId, input);
    }
    return input;
  }

  async function branch(snap) {
    const count = Number(countInput(snap.id).value || '1');
    if (!Number.isInteger(count) || count < 1 || count > 64) {
      status.error('Branch: the count is a whole number from 1 to 64.');
      return;
    }
    if (busy) return;
    busy = true;
    status.busy(`Branching ${snap.id} into ${count} sandbox${count === 1 ? '' : 'es'}…`);
    try {
      const res = await api.post(`/v1/snapshots/${encodeURIComponent(snap.id)}/branch`, { count });
      const ids = (res && Array.isArray(res.sandboxes) ? res.sandboxes : []).map((s) => s.id);
      status.ok(`Branched ${snap.id}: ${ids.join(', ')}.`);
      info(`Started ${ids.length} sandbox${ids.length === 1 ? '' : 'es'} from ${snap.id}.`);
    } catch (e) {
      status.error(`Branch of ${snap.id} failed: ${api.describeError(e)}`);
      reportError(`branch ${snap.id}`, e);
    } finally {
      busy = false;
      poll.now();
    }
  }

  async function remove(snap) {
    if (!window.confirm(`Delete snapshot ${snap.id}${snap.name ? ' (' + snap.name + ')' : ''}? Sandboxes started from it keep running.`)) return;
    try {
      await api.del(`/v1/snapshots/${encodeURIComponent(snap.id)}`);
      status.ok(`Deleted ${snap.id}.`);
    } catch (e) {
      status.error(`Cannot delete ${snap.id}: ${api.describeError(e)}`);
      reportError(`delete ${snap.id}`, e);
    } finally {
      poll.now();
    }
  }

  function childItem(sb) {
    return h('li', { testid: 'branch-child', 'data-id': sb.id, 'data-state': sb.state },
      h('a', { href: '#/sandboxes/' + encodeURIComponent(sb.id), class: 'mono', text: sb.id }), ' ',
      h('span', { class: 'state state-' + sb.state, text: sb.state }),
      h('span', { class: 'muted', text: ` created ${fmt.age(sb.created_at)} ago` }));
  }

  function render(snaps, children) {
    replaceChildren(tree, snaps.map((snap) => {
      const kids = children.filter((sb) => sb.snapshot === snap.id);
      return h('li', { testid: 'snapshot-node', 'data-id': snap.id },
        h('div', { class: 'node' },
          h('span', { class: 'mono', text: snap.id }),
          snap.name ? h('b', { class: 'snap-name', testid: 'snapshot-node-name', text: ` ${snap.name}` }) : null,
          h('span', { class: 'muted', text: ` ${fmt.timestamp(snap.created_at)}, ${fmt.bytes(snap.size_bytes)}, ${snap.cpus} vCPU / ${fmt.mb(snap.memory_mb)}` }),
          h('span', { class: 'row-actions' },
            countInput(snap.id),
            h('button', { type: 'button', class: 'small', testid: 'branch-submit', text: 'Branch', onClick: () => branch(snap) }),
            h('button', { type: 'button', class: 'small danger', testid: 'snapshot-delete', text: 'Delete',
                          onClick: () => remove(snap) }))),
        kids.length ? h('ul', { class: 'children' }, kids.map(childItem)) : null);
    }));
    if (!snaps.length) tree.appendChild(h('li', { class: 'muted', text: 'No snapshots of this sandbox.' }));
    for (const id of [...countInputs.keys()]) if (!snaps.some((s) => s.id === id)) countInputs.delete(id);
  }

  async function showOrigin(sb) {
    if (!sb.snapshot || originShown === sb.snapshot) return;
    originShown = sb.snapshot;
    replaceChildren(origin, `Started from snapshot ${sb.snapshot}`);
    try {
      const snap = await api.get(`/v1/snapshots/${encodeURIComponent(sb.snapshot)}`);
      if (destroyed) return;
      replaceChildren(origin, `Started from snapshot ${snap.id}${snap.name ? ' (' + snap.name + ')' : ''} of `,
        h('a', { href: '#/sandboxes/' + encodeURIComponent(snap.sandbox_id), class: 'mono', text: snap.sandbox_id }), '.');
    } catch (e) {
      if (e instanceof api.ApiError && e.status === 404) {
        replaceChildren(origin, `Started from snapshot ${sb.snapshot} (deleted since).`);
      } else if (!destroyed) {
        replaceChildren(origin, `Started from snapshot ${sb.snapshot} (cannot read it: ${api.describeError(e)}).`);
      }
    }
  }

  async function load() {
    try {
      const snaps = await api.listAll('/v1/snapshots', { sandbox_id: shared.id }, 'snapshots');
      let children = [];
      if (snaps.length) {
        const ids = new Set(snaps.map((s) => s.id));
        children = (await api.listAll('/v1/sandboxes', { state: ALL_STATES }, 'sandboxes'))
          .filter((sb) => sb.snapshot && ids.has(sb.snapshot));
      }
      if (destroyed) return;
      render(snaps, children);
      loadStatus.ok(`${snaps.length} snapshot${snaps.length === 1 ? '' : 's'}; updated ${fmt.clock()}.`);
    } catch (e) {
      if (!destroyed) loadStatus.error(`Cannot list snapshots: ${api.describeError(e)}`);
    }
  }
  const poll = poller(load, REFRESH_MS);
  refreshButton.addEventListener('click', () => poll.now());

  return {
    el,
    refresh: () => poll.now(),
    update(sb) {
      if (!started) { started = true; poll.now(); }
      showOrigin(sb);
    },
    destroy() { destroyed = true; poll.stop(); },
  };
}
