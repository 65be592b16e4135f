// Small formatting helpers (no locale surprises: the test reads these strings).

export function bytes(n) {
  if (typeof n !== 'number' || !Number.isFinite(n)) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  let v = n;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i === 0 ? String(Math.round(v)) : v.toFixed(v >= 100 ? 0 : 1)) + ' ' + units[i];
}

export function mb(n) {
  if (typeof n !== 'number' || !Number.isFinite(n)) return '—';
  return n >= 1024 ? (n / 1024).toFixed(n % 1024 ? 1 : 0) + ' GB' : Math.round(n) + ' MB';
}

export function pct(n) {
  if (typeof n !== 'number' || !Number.isFinite(n)) return '—';
  return n.toFixed(n < 10 ? 1 : 0) + ' %';
}

export function seconds(s) {
  if (typeof s !== 'number' || !Number.isFinite(s)) return '—';
  if (s < 1) return Math.round(s * 1000) + ' ms';
  return s.toFixed(s < 10 ? 2 : 1) + ' s';
}

// "42s", "3m 12s", "2h 05m", "4d 1h"
export function duration(totalSeconds) {
  if (!Number.isFinite(totalSeconds)) return '—';
  const neg = totalSeconds < 0;
  let s = Math.floor(Math.abs(totalSeconds));
  const d = Math.floor(s / 86400); s -= d * 86400;
  const hh = Math.floor(s / 3600); s -= hh * 3600;
  const m = Math.floor(s / 60); s -= m * 60;
  let out;
  if (d) out = `${d}d ${hh}h`;
  else if (hh) out = `${hh}h ${String(m).padStart(2, '0')}m`;
  else if (m) out = `${m}m ${String(s).padStart(2, '0')}s`;
  else out = `${s}s`;
  return neg ? '-' + out : out;
}

export function age(iso, now = Date.now()) {
  const t = Date.parse(iso);
  return Number.isFinite(t) ? duration((now - t) / 1000) : '—';
}

export function until(iso, now = Date.now()) {
  const t = Date.parse(iso);
  if (!Number.isFinite(t)) return '—';
  return t >= now ? 'in ' + duration((t - now) / 1000) : duration((now - t) / 1000) + ' ago';
}

export function clock(ms = Date.now()) {
  const d = new Date(ms);
  return [d.getHours(), d.getMinutes(), d.getSeconds()].map((x) => String(x).padStart(2, '0')).join(':');
}

export function timestamp(iso) {
  const t = Date.parse(iso);
  if (!Number.isFinite(t)) return String(iso || '—');
  return new Date(t).toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
}

export function metadataText(metadata) {
  if (!metadata || typeof metadata !== 'object') return '';
  return Object.entries(metadata).map(([k, v]) => `${k}=${v}`).join(', ');
}
