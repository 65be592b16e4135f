// #/sandboxes/<id>: one sandbox: its state and actions, a terminal, its console log, processes,
// files, metrics charts and snapshots. The sandbox is read again every 5 s (reading it does not
// count as activity, so an open page alone does not keep it from idling; the terminal, the
// console log and the process list do, while they refresh).
import * as api from '../api.js';
import { h, replaceChildren, statusLine } from '../dom.js';
import { reportError, info } from '../messages.js';
import * as fmt from '../format.js';
import { poller } from '../poll.js';
import { terminalSection } from '../sections/terminal.js';
import { logsSection } from '../sections/logs.js';
import { processesSection } from '../sections/processes.js';
import { filesSection } from '../sections/files.js';
import { metricsSection } from '../sections/metrics.js';
import { snapshotsSection } from '../sections/snapshots.js';

const REFRESH_MS = 5000;

export function sandboxView(root, ctx, id) {
  let alive = true;
  let sandbox = null;

  const title = h('h1', { class: 'mono', testid: 'sb-id', text: id });
  const stateBadge = h('span', { class: 'state', testid: 'sb-state', text: '…' });
  const facts = h('dl', { class: 'facts', testid: 'sb-facts' });
  const reason = h('p', { class: 'muted', testid: 'sb-reason' });
  const loadStatus = statusLine('sb-status');
  const actionStatus = statusLine('action-status');

  const buttons = {};
  function actionButton(name, label, handler) {
    const b = h('button', { type: 'button', testid: 'action-' + name, text: label, disabled: true });
    b.addEventListener('click', () => run(name, handler));
    buttons[name] = b;
    return b;
  }
  const snapName = h('input', { type: 'text', placeholder: 'name (optional)', maxlength: 128, testid: 'snapshot-name',
                                'aria-label': 'snapshot name' });
  const timeoutInput = h('input', { type: 'number', min: 1, step: 1, placeholder: 'seconds', testid: 'timeout-seconds',
                                    'aria-label': 'timeout in seconds' });

  let busy = false;
  async function run(name, handler) {
    if (busy) return;
    busy = true;
    updateButtons();
    try {
      await handler();
    } catch (e) {
      actionStatus.error(`${name} failed: ${api.describeError(e)}`);
      reportError(`${name} ${id}`, e);
      poll.now();
    } finally {
      busy = false;
      updateButtons();
    }
  }

  const transition = (verb) => async () => {
    actionStatus.busy(`${verb[0].toUpperCase() + verb.slice(1)} in progress…`);
    const sb = await api.post(api.sandboxPath(id, '/' + verb), {});
    setSandbox(sb);
    actionStatus.ok(`${verb}: the sandbox is ${sb.state}.`);
  };

  const actions = h('div', { class: 'actions', testid: 'sb-actions' },
    actionButton('pause', 'Pause', transition('pause')),
    actionButton('resume', 'Resume', transition('resume')),
    actionButton('suspend', 'Suspend', transition('suspend')),
    actionButton('delete', 'Delete', async () => {
      if (!window.confirm(`Delete sandbox ${id}? Its VM and disk are gone for good.`)) return;
      actionStatus.busy('Deleting…');
      terminal.close();
      await api.del(api.sandboxPath(id));
      info(`Deleted ${id}.`);
      ctx.navigate('#/sandboxes');
    }),
    h('span', { class: 'group' },
      snapName,
      actionButton('snapshot', 'Snapshot', async () => {
        const body = {};
        if (snapName.value.trim()) body.name = snapName.value.trim();
        actionStatus.busy('Taking a snapshot…');
        const snap = await api.post(api.sandboxPath(id, '/snapshots'), body);
        snapName.value = '';
        actionStatus.ok(`Snapshot ${snap.id} taken (${fmt.bytes(snap.size_bytes)}).`);
        snapshots.refresh();
      })),
    h('span', { class: 'group' },
      timeoutInput,
      actionButton('timeout', 'Set timeout', async () => {
        const s = Number(timeoutInput.value);
        if (!timeoutInput.value || !Number.isInteger(s) || s < 1) {
          actionStatus.error('Set timeout: give a whole number of seconds.');
          return;
        }
        const sb = await api.post(api.sandboxPath(id, '/timeout'), { timeout_s: s });
        setSandbox(sb);
        actionStatus.ok(`Timeout set: expires ${fmt.until(sb.expires_at)}.`);
      })));

  const allowed = {
    pause: ['running'],
    resume: ['paused', 'suspended'],
    suspend: ['running', 'paused'],
    delete: ['creating', 'running', 'paused', 'suspended', 'failed'],
    snapshot: ['running', 'paused'],
    timeout: ['running', 'paused', 'suspended'],
  };
  function updateButtons() {
    for (const [name, b] of Object.entries(buttons)) {
      b.disabled = busy || !sandbox || !allowed[name].includes(sandbox.state);
    }
  }

  function fact(label, value, testid) {
    return [h('dt', { text: label }), h('dd', { text: value, testid })];
  }

  function renderHeader() {
    const sb = sandbox;
    stateBadge.textContent = sb.state;
    stateBadge.className = 'state state-' + sb.state;
    stateBadge.dataset.state = sb.state;
    replaceChildren(facts,
      fact('Template', sb.template),
      sb.snapshot ? fact('From snapshot', sb.snapshot) : null,
      fact('Size', `${sb.cpus} vCPU, ${fmt.mb(sb.memory_mb)}`),
      fact('Created', `${fmt.timestamp(sb.created_at)} (${fmt.age(sb.created_at)} ago)`),
      fact('Expires', `${fmt.timestamp(sb.expires_at)} (${fmt.until(sb.expires_at)}; timeout ${sb.timeout_s} s, then ${sb.on_timeout})`, 'sb-expires'),
      fact('Idle suspend', sb.idle_suspend_s ? fmt.duration(sb.idle_suspend_s) : 'never'),
      fact('Metadata', fmt.metadataText(sb.metadata) || '—'));
    reason.textContent = sb.state_reason ? `Reason: ${sb.state_reason}` : '';
  }

  const shared = { id, navigate: ctx.navigate, get sandbox() { return sandbox; }, refreshSandbox: () => poll.now() };
  const terminal = terminalSection(shared);
  const logs = logsSection(shared);
  const processes = processesSection(shared);
  const files = filesSection(shared);
  const metrics = metricsSection(shared);
  const snapshots = snapshotsSection(shared);
  const sections = [terminal, logs, processes, files, metrics, snapshots];

  // The sections appear once the sandbox has been read (not for an unknown one).
  const grid = h('div', { class: 'grid', hidden: true },
    terminal.el, logs.el, processes.el, files.el, metrics.el, snapshots.el);

  function setSandbox(sb) {
    if (!alive || !sb) return;
    sandbox = sb;
    grid.hidden = false;
    renderHeader();
    updateButtons();
    for (const s of sections) s.update(sb);
  }

  root.append(
    h('p', {}, h('a', { href: '#/sandboxes', text: '← Sandboxes' })),
    h('section', { class: 'card sb-header', testid: 'sb-header' },
      h('div', { class: 'section-head' }, title, stateBadge),
      reason, facts, actions, actionStatus.el, loadStatus.el),
    grid);

  async function load() {
    try {
      const sb = await api.get(api.sandboxPath(id));
      if (!alive) return;
      setSandbox(sb);
      loadStatus.ok(`Updated ${fmt.clock()}.`);
    } catch (e) {
      if (!alive) return;
      loadStatus.error(`Cannot read ${id}: ${api.describeError(e)}`);
      if (e instanceof api.ApiError && e.status === 404) {
        poll.stop(); // no such sandbox for this tenant (or gone for good): nothing to refresh
        stateBadge.textContent = 'not found';
        stateBadge.className = 'state state-failed';
      }
    }
  }
  const poll = poller(load, REFRESH_MS);
  poll.now();

  return () => {
    alive = false;
    poll.stop();
    for (const s of sections) {
      try { s.destroy(); } catch (e) { reportError('closing the page', e); }
    }
  };
}
