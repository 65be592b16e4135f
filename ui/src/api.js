// spaced's REST API as the console uses it: same origin, the session cookie authenticates
// (the browser sends it; the page never sees it), and every request but GET/HEAD carries the
// session's CSRF token. Every failure becomes an ApiError whose message is spaced's own.

export class ApiError extends Error {
  constructor(status, code, message, extra = {}) {
    super(message);
    this.name = 'ApiError';
    this.status = status; // 0: no HTTP answer at all
    this.code = code;
    this.state = extra.state;
  }
}

let csrfToken = null;
let onSessionLost = null;

export function setCsrfToken(token) { csrfToken = token; }

// Called once when a request that needed the session gets 401 (it expired or was revoked).
export function setSessionLostHandler(fn) { onSessionLost = fn; }

export function describeError(err) {
  if (err instanceof ApiError) {
    if (err.status === 0) return err.message;
    return `${err.message} (${err.code}, HTTP ${err.status})`;
  }
  return String(err && err.message ? err.message : err);
}

async function errorOf(res) {
  let code = 'http_' + res.status;
  let message = `HTTP ${res.status} ${res.statusText}`.trim();
  let extra = {};
  let text = '';
  try { text = await res.text(); } catch { /* the body is optional */ }
  if (text) {
    try {
      const body = JSON.parse(text);
      if (body && body.error && typeof body.error === 'object') {
        if (typeof body.error.code === 'string') code = body.error.code;
        if (typeof body.error.message === 'string') message = body.error.message;
        if (typeof body.error.state === 'string') extra.state = body.error.state;
      } else {
        message = text.slice(0, 500);
      }
    } catch {
      message = text.slice(0, 500);
    }
  }
  return new ApiError(res.status, code, message, extra);
}

export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) {
    if (v === undefined || v === null || v === '') continue;
    if (Array.isArray(v)) v.forEach((x) => q.append(k, String(x)));
    else q.append(k, String(v));
  }
  const s = q.toString();
  return s ? '?' + s : '';
}

export function sandboxPath(id, rest = '') {
  return '/v1/sandboxes/' + encodeURIComponent(id) + rest;
}

// request('POST', '/v1/sandboxes', {json: {...}}) -> parsed JSON (or text / null / Response).
//   as: 'json' (default; null for 204), 'text', 'response'
export async function request(method, path, opts = {}) {
  const headers = { ...(opts.headers || {}) };
  let body;
  if (opts.json !== undefined) {
    headers['Content-Type'] = 'application/json';
    body = JSON.stringify(opts.json);
  } else if (opts.body !== undefined) {
    body = opts.body;
    if (!headers['Content-Type']) headers['Content-Type'] = 'application/octet-stream';
  }
  if (method !== 'GET' && method !== 'HEAD' && csrfToken && !opts.noCsrf) {
    headers['X-CSRF-Token'] = csrfToken;
  }
  let res;
  try {
    res = await fetch(path, {
      method, headers, body, credentials: 'same-origin', cache: 'no-store', redirect: 'error',
      signal: opts.signal,
    });
  } catch (e) {
    if (e && e.name === 'AbortError') throw e;
    throw new ApiError(0, 'network', `cannot reach spaced (${method} ${path}): ${e && e.message ? e.message : e}`);
  }
  if (!res.ok) {
    const err = await errorOf(res);
    if (res.status === 401 && !opts.noSessionCheck && onSessionLost) onSessionLost(err);
    throw err;
  }
  const as = opts.as || 'json';
  if (as === 'response') return res;
  if (as === 'text') return res.text();
  if (res.status === 204) return null;
  const text = await res.text();
  if (!text) return null;
  try {
    return JSON.parse(text);
  } catch {
    throw new ApiError(res.status, 'bad_response', `${method} ${path}: the answer is not JSON`);
  }
}

export const get = (path, opts) => request('GET', path, opts);
export const post = (path, json, opts = {}) => request('POST', path, { ...opts, json: json === undefined ? {} : json });
export const del = (path, opts) => request('DELETE', path, opts);

// Follows next_cursor (lists of sandboxes or snapshots) up to maxItems.
export async function listAll(path, params, key, maxItems = 5000) {
  const items = [];
  let cursor = null;
  do {
    const page = await get(path + query({ ...params, limit: 1000, cursor }));
    const got = Array.isArray(page && page[key]) ? page[key] : [];
    items.push(...got);
    cursor = page && page.next_cursor;
  } while (cursor && items.length < maxItems);
  return items;
}
