// The sandbox's host-side samples (GET .../metrics: every 5 s, the last hour) as three charts:
// CPU %, memory and disk. The whole hour first, then only what is new.
import * as api from '../api.js';
import { h, statusLine } from '../dom.js';
import { LineChart } from '../chart.js';
import * as fmt from '../format.js';
import { poller } from '../poll.js';

const REFRESH_MS = 5000;

export function metricsSection(shared) {
  const status = statusLine('metrics-status');
  const cpu = new LineChart({ title: 'CPU (% of its vCPUs)', testid: 'chart-cpu', format: (v) => fmt.pct(v), max: 100,
                              series: [{ key: 'cpu', label: 'used' }] });
  const mem = new LineChart({ title: 'Memory', testid: 'chart-memory', format: fmt.bytes, maxIsFloor: true, max: 1 << 20,
                              series: [{ key: 'host', label: 'QEMU resident' }, { key: 'guest', label: 'guest used' }] });
  const disk = new LineChart({ title: 'Disk', testid: 'chart-disk', format: fmt.bytes, maxIsFloor: true, max: 1 << 20,
                               series: [{ key: 'host', label: 'overlay on host' }, { key: 'guest', label: 'guest used' }] });
  const el = h('section', { class: 'card', testid: 'metrics-section' },
    h('div', { class: 'section-head' }, h('h2', { text: 'Metrics' })),
    h('div', { class: 'charts' }, cpu.el, mem.el, disk.el),
    status.el);
  let lastTs = null; // unix seconds of the newest sample drawn
  let started = false;
  let destroyed = false;
  const num = (v) => (typeof v === 'number' && Number.isFinite(v) ? v : NaN);

  async function load() {
    try {
      const params = lastTs === null ? {} : { start: lastTs };
      const res = await api.get(api.sandboxPath(shared.id, '/metrics') + api.query(params));
      if (destroyed) return;
      const samples = (Array.isArray(res && res.metrics) ? res.metrics : [])
        .filter((m) => typeof m.timestamp_unix === 'number' && (lastTs === null || m.timestamp_unix > lastTs));
      for (const m of samples) {
        const t = m.timestamp_unix * 1000;
        cpu.push('cpu', t, num(m.cpu_used_pct));
        mem.push('host', t, num(m.mem_used_bytes));
        mem.push('guest', t, num(m.guest_mem_used_bytes));
        disk.push('host', t, num(m.disk_used_bytes));
        disk.push('guest', t, num(m.guest_disk_used_bytes));
        if (typeof m.mem_total_bytes === 'number') mem.max = m.mem_total_bytes;
        lastTs = m.timestamp_unix;
      }
      for (const c of [cpu, mem, disk]) c.render();
      const n = cpu.pointCount();
      status.ok(n ? `${n} sample${n === 1 ? '' : 's'} (one every 5 s while it runs); updated ${fmt.clock()}.`
                  : `No samples yet: spaced samples a running sandbox every 5 s; updated ${fmt.clock()}.`);
    } catch (e) {
      if (!destroyed) status.error(`Cannot read metrics: ${api.describeError(e)}`);
    }
  }
  const poll = poller(load, REFRESH_MS);

  return {
    el,
    update() {
      if (!started) { started = true; poll.now(); }
    },
    destroy() { destroyed = true; poll.stop(); },
  };
}
