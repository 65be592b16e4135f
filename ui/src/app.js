// SPACE web console: a hash-routed single page over spaced's REST API.
//   #/login  #/sandboxes  #/sandboxes/<id>  #/node
import * as api from './api.js';
import { replaceChildren } from './dom.js';
import { reportError, info, clearMessages } from './messages.js';
import { loginView } from './views/login.js';
import { sandboxesView } from './views/sandboxes.js';
import { sandboxView } from './views/sandbox.js';
import { nodeView } from './views/node.js';

const routes = [
  [/^#\/login$/, loginView, false],
  [/^#\/sandboxes$/, sandboxesView, true],
  [/^#\/sandboxes\/([A-Za-z0-9_-]+)$/, sandboxView, true],
  [/^#\/node$/, nodeView, true],
];

const state = {
  session: null, // {tenant, operator, csrf_token}
  afterLogin: null, // where to go once logged in
  cleanup: null, // the current view's teardown
};

function viewRoot() { return document.getElementById('view'); }

function setSession(session) {
  state.session = session;
  api.setCsrfToken(session ? session.csrf_token : null);
  const nav = document.querySelector('[data-testid="nav"]');
  const logout = document.querySelector('[data-testid="logout"]');
  const who = document.querySelector('[data-testid="whoami"]');
  nav.hidden = !session;
  logout.hidden = !session;
  who.textContent = session ? `tenant ${session.tenant}${session.operator ? ' (operator)' : ''}` : '';
}

function navigate(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

function route() {
  const hash = location.hash || '#/sandboxes';
  let match = null;
  let found = null;
  for (const r of routes) {
    match = r[0].exec(hash);
    if (match) { found = r; break; }
  }
  if (!found) { navigate(state.session ? '#/sandboxes' : '#/login'); return; }
  const [, view, needsSession] = found;
  if (needsSession && !state.session) {
    state.afterLogin = hash;
    navigate('#/login');
    return;
  }
  if (!needsSession && state.session) { navigate('#/sandboxes'); return; }

  if (state.cleanup) {
    try { state.cleanup(); } catch (e) { reportError('leaving the page', e); }
    state.cleanup = null;
  }
  for (const a of document.querySelectorAll('.nav a')) {
    a.classList.toggle('active', hash.startsWith(a.getAttribute('href')));
  }
  const root = replaceChildren(viewRoot());
  const ctx = {
    session: state.session,
    navigate,
    login: (session) => {
      setSession(session);
      const to = state.afterLogin || '#/sandboxes';
      state.afterLogin = null;
      navigate(to);
    },
  };
  state.cleanup = view(root, ctx, ...match.slice(1).map(decodeURIComponent)) || null;
}

function sessionLost(err) {
  if (!state.session) return;
  setSession(null);
  reportError('your session ended; log in again', err);
  state.afterLogin = location.hash;
  navigate('#/login');
}

async function logout() {
  const button = document.querySelector('[data-testid="logout"]');
  button.disabled = true;
  let note = 'Logged out.';
  try {
    await api.request('DELETE', '/ui/session', { noSessionCheck: true });
  } catch (e) {
    if (!(e instanceof api.ApiError && e.status === 401)) {
      reportError('log out', e);
      button.disabled = false;
      return;
    }
    note = `Logged out (the session had already ended: ${api.describeError(e)}).`;
  }
  button.disabled = false;
  setSession(null);
  state.afterLogin = null;
  clearMessages();
  info(note);
  navigate('#/login');
}

async function start() {
  api.setSessionLostHandler(sessionLost);
  document.querySelector('[data-testid="logout"]').addEventListener('click', logout);
  window.addEventListener('hashchange', route);
  try {
    const s = await api.get('/ui/session', { noSessionCheck: true });
    setSession(s);
  } catch (e) {
    setSession(null);
    if (!(e instanceof api.ApiError && e.status === 401)) reportError('restore the session', e);
  }
  route();
}

if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
else start();
