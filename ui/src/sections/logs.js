// The guest's console (GET .../logs): its last 64 KiB as text, refreshed every 5 s while "auto"
// is on and the sandbox holds a VM. Reading it counts as activity (it keeps the sandbox from
// idling), hence the switch.
import * as api from '../api.js';
import { h, statusLine } from '../dom.js';
import * as fmt from '../format.js';
import { poller } from '../poll.js';

const TAIL = 65536;
const REFRESH_MS = 5000;

export function logsSection(shared) {
  const pre = h('pre', { class: 'console', testid: 'console-log', tabindex: 0 });
  const status = statusLine('console-status');
  const auto = h('input', { type: 'checkbox', checked: true, testid: 'console-auto' });
  const refreshButton = h('button', { type: 'button', testid: 'console-refresh', text: 'Refresh' });
  const el = h('section', { class: 'card', testid: 'console-section' },
    h('div', { class: 'section-head' }, h('h2', { text: 'Console log' }),
      h('span', { class: 'buttons' }, h('label', {}, auto, ' auto'), refreshButton)),
    pre, status.el);
  let state = null;
  let destroyed = false;

  async function load() {
    if (!state) return;
    if (!['running', 'paused'].includes(state)) {
      status.ok(`No console: the sandbox is ${state} (it has no VM).`);
      return;
    }
    try {
      const text = await api.get(api.sandboxPath(shared.id, '/logs') + api.query({ tail_bytes: TAIL }), { as: 'text' });
      if (destroyed) return;
      const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.textContent = text;
      if (atBottom) pre.scrollTop = pre.scrollHeight;
      status.ok(`${fmt.bytes(new TextEncoder().encode(text).length)} shown (the last ${fmt.bytes(TAIL)} at most); updated ${fmt.clock()}.`);
    } catch (e) {
      if (!destroyed) status.error(`Cannot read the console: ${api.describeError(e)}`);
    }
  }
  const poll = poller(load, () => (auto.checked ? REFRESH_MS : null));
  refreshButton.addEventListener('click', () => poll.now());
  auto.addEventListener('change', () => { if (auto.checked) poll.now(); });

  return {
    el,
    update(sb) {
      const first = state === null;
      const changed = state !== sb.state;
      state = sb.state;
      if (first || changed) poll.now();
    },
    destroy() { destroyed = true; poll.stop(); },
  };
}
