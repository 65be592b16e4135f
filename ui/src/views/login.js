// #/login: trade an API key for a session cookie. The key goes to spaced once and is not kept
// by the page (the field is cleared; the browser keeps only the HttpOnly cookie).
import * as api from '../api.js';
import { h } from '../dom.js';

export function loginView(root, ctx) {
  const key = h('input', { type: 'password', id: 'api-key', name: 'api_key', autocomplete: 'off', spellcheck: 'false',
                           required: true, placeholder: 'e2b_…', testid: 'login-key' });
  const error = h('p', { class: 'status error', testid: 'login-error', role: 'alert', hidden: true });
  const submit = h('button', { type: 'submit', testid: 'login-submit', text: 'Log in' });
  const form = h('form', { class: 'login card', testid: 'login-form' },
    h('h1', { text: 'Log in to SPACE' }),
    h('label', { for: 'api-key', text: 'API key' }),
    key,
    h('p', { class: 'muted small',
             text: 'The key of your tenant (the operator\'s is in <data-dir>/api-key on the node). ' +
                   'The console keeps only a session cookie, never the key.' }),
    submit,
    error);
  let busy = false;
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    if (busy) return;
    busy = true;
    submit.disabled = true;
    error.hidden = true;
    try {
      const session = await api.request('POST', '/ui/session',
        { json: { api_key: key.value.trim() }, noSessionCheck: true, noCsrf: true });
      if (!session || typeof session.csrf_token !== 'string') {
        throw new api.ApiError(200, 'bad_response', 'spaced did not answer a session');
      }
      key.value = '';
      ctx.login(session);
    } catch (e) {
      error.textContent = e instanceof api.ApiError && e.status === 401
        ? `Login failed: ${api.describeError(e)}`
        : `Cannot log in: ${api.describeError(e)}`;
      error.hidden = false;
      key.select();
    } finally {
      busy = false;
      submit.disabled = false;
    }
  });
  root.appendChild(form);
  key.focus();
  return null;
}
