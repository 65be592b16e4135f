// The message list under the header: every failed action says what spaced answered. An error
// repeated (a poll failing again) is counted, not listed twice.
import { h } from './dom.js';
import { describeError } from './api.js';

const MAX = 6;
let list = null;

function box() {
  if (!list) list = document.querySelector('[data-testid="messages"]');
  return list;
}

function add(kind, text) {
  const ul = box();
  if (!ul) return;
  for (const li of ul.children) {
    if (li.dataset.text === text && li.dataset.kind === kind) {
      const n = Number(li.dataset.count || '1') + 1;
      li.dataset.count = String(n);
      li.querySelector('.count').textContent = ` (×${n})`;
      ul.prepend(li);
      return;
    }
  }
  const li = h('li', { class: 'message ' + kind, testid: 'message-' + kind, role: kind === 'error' ? 'alert' : 'status' },
    h('span', { class: 'text', text }),
    h('span', { class: 'count' }),
    h('button', { type: 'button', class: 'dismiss', title: 'Dismiss', 'aria-label': 'Dismiss', text: '×',
      onClick: () => li.remove() }));
  li.dataset.text = text;
  li.dataset.kind = kind;
  ul.prepend(li);
  while (ul.children.length > MAX) ul.lastElementChild.remove();
  if (kind === 'info') setTimeout(() => li.remove(), 8000);
}

// reportError('pause sb_...', err): shows "pause sb_...: <spaced's message> (code, HTTP n)".
export function reportError(context, err) {
  if (err && err.name === 'AbortError') return;
  add('error', context ? `${context}: ${describeError(err)}` : describeError(err));
}

export function info(text) { add('info', text); }

export function clearMessages() {
  const ul = box();
  if (ul) while (ul.firstChild) ul.removeChild(ul.firstChild);
}
