// The terminal: xterm.js on spaced's PTY WebSocket (docs/api.md, "Terminals"). Keystrokes go out
// as binary frames, the terminal's size as {"type":"resize"} text frames; what comes back in
// binary frames is the process's output, text frames say started / exit / error. Opened once
// the sandbox is first seen running; after it closes, Connect opens a new shell.
import { Terminal } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';
import * as api from '../api.js';
import { h, statusLine } from '../dom.js';
import { reportError } from '../messages.js';

export function terminalSection(shared) {
  const status = statusLine('term-status');
  const screen = h('div', { class: 'terminal', testid: 'terminal' });
  const connectButton = h('button', { type: 'button', testid: 'term-connect', text: 'Connect', disabled: true });
  const closeButton = h('button', { type: 'button', testid: 'term-disconnect', text: 'Disconnect', disabled: true });
  const el = h('section', { class: 'card wide', testid: 'terminal-section' },
    h('div', { class: 'section-head' }, h('h2', { text: 'Terminal' }),
      h('span', { class: 'buttons' }, connectButton, closeButton)),
    screen, status.el);

  const term = new Terminal({
    cursorBlink: true,
    fontFamily: 'ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace',
    fontSize: 14,
    scrollback: 5000,
    allowProposedApi: false,
    // The guest chooses a link's text (OSC 8): a link it prints never opens anything.
    linkHandler: { activate() {} },
  });
  const fit = new FitAddon();
  term.loadAddon(fit);
  let opened = false;
  let ws = null;
  let started = false;
  let ended = false; // the process's exit or error came
  let autoConnected = false;
  let destroyed = false;
  let lastState = null;
  const encoder = new TextEncoder();

  function send(data) {
    if (ws && ws.readyState === WebSocket.OPEN) ws.send(data);
  }

  term.onData((d) => send(encoder.encode(d)));
  term.onBinary((d) => send(Uint8Array.from(d, (c) => c.charCodeAt(0) & 0xff)));
  term.onResize(({ cols, rows }) => send(JSON.stringify({ type: 'resize', cols, rows })));

  function refit() {
    if (!opened || destroyed || !screen.isConnected || screen.clientWidth === 0) return;
    try { fit.fit(); } catch { /* not laid out yet */ }
  }
  let frame = 0;
  const observer = new ResizeObserver(() => {
    cancelAnimationFrame(frame);
    frame = requestAnimationFrame(refit);
  });

  function setButtons() {
    const live = ws && (ws.readyState === WebSocket.CONNECTING || ws.readyState === WebSocket.OPEN);
    connectButton.disabled = !!live || lastState !== 'running';
    closeButton.disabled = !live;
  }

  function ensureOpen() {
    if (opened) return;
    term.open(screen);
    opened = true;
    observer.observe(screen);
    refit();
  }

  function connect() {
    ensureOpen();
    refit();
    if (ws) { try { ws.close(); } catch { /* already closed */ } }
    started = false;
    ended = false;
    const proto = location.protocol === 'https:' ? 'wss' : 'ws';
    const url = `${proto}://${location.host}${api.sandboxPath(shared.id, '/pty')}${api.query({ cols: term.cols, rows: term.rows })}`;
    status.busy('Connecting…');
    const sock = new WebSocket(url);
    sock.binaryType = 'arraybuffer';
    ws = sock;
    setButtons();
    sock.onopen = () => {
      if (ws !== sock) return;
      status.busy('Connected; waiting for the shell…');
      setButtons();
    };
    sock.onmessage = (ev) => {
      if (ws !== sock) return;
      if (typeof ev.data !== 'string') {
        term.write(new Uint8Array(ev.data));
        return;
      }
      let msg;
      try { msg = JSON.parse(ev.data); } catch { return; }
      if (msg.type === 'started') {
        started = true;
        status.ok(`Connected: shell pid ${msg.pid}.`);
        // Only when nothing else has the keyboard: the shell starts a moment after the page
        // opens, and typing already going into a field (a timeout, a name) must stay there.
        const active = document.activeElement;
        if (!active || active === document.body) term.focus();
      } else if (msg.type === 'exit') {
        ended = true;
        status.ok(`The shell ended: ${msg.status || 'exit code ' + msg.exit_code}. Connect opens a new one.`);
      } else if (msg.type === 'error') {
        ended = true;
        const text = `${msg.message || 'error'} (${msg.code || 'error'})`;
        status.error(`Terminal error: ${text}`);
        reportError(`terminal of ${shared.id}`, new api.ApiError(0, msg.code || 'error', text));
      }
    };
    sock.onclose = async (ev) => {
      if (ws !== sock) return;
      ws = null;
      setButtons();
      if (destroyed || ended) return;
      if (started) {
        status.error(`The terminal's connection closed (code ${ev.code}${ev.reason ? ': ' + ev.reason : ''}).`);
        return;
      }
      // A refused upgrade shows the page nothing but code 1006: say what the sandbox is.
      let why = `WebSocket closed with code ${ev.code}${ev.reason ? ': ' + ev.reason : ''}`;
      try {
        const sb = await api.get(api.sandboxPath(shared.id));
        why += `; the sandbox is ${sb.state}${sb.state_reason ? ' (' + sb.state_reason + ')' : ''}`;
      } catch (e) {
        why += `; ${api.describeError(e)}`;
      }
      if (destroyed) return;
      status.error(`The terminal did not start: ${why}.`);
      reportError(`terminal of ${shared.id}`, new Error(`did not start: ${why}`));
    };
  }

  connectButton.addEventListener('click', () => connect());
  closeButton.addEventListener('click', () => {
    if (!ws) return;
    ended = true;
    ws.close(1000, 'closed by the user');
    status.ok('Disconnected (the shell is ended).');
  });

  return {
    el,
    // Ends the session quietly (before the page deletes the sandbox under it).
    close() {
      if (!ws) return;
      ended = true;
      try { ws.close(1000, 'sandbox deleted'); } catch { /* gone */ }
      status.ok('Disconnected.');
    },
    update(sb) {
      lastState = sb.state;
      if (sb.state === 'running' && !autoConnected) {
        autoConnected = true;
        connect();
      }
      if (sb.state === 'deleted' || sb.state === 'failed') {
        if (!ws && !autoConnected) status.ok(`No terminal: the sandbox is ${sb.state}.`);
      } else if (!autoConnected && !ws) {
        status.ok(`The terminal opens when the sandbox runs (it is ${sb.state}).`);
      }
      setButtons();
    },
    destroy() {
      destroyed = true;
      observer.disconnect();
      cancelAnimationFrame(frame);
      if (ws) { try { ws.close(1000, 'page closed'); } catch { /* gone */ } }
      ws = null;
      term.dispose();
    },
  };
}
