// #/node: the node's capacity and create latency from /metrics (Prometheus text, the operator's
// only), polled every 5 s; the charts grow while the page is open. Create latency per interval
// is estimated from the histogram's buckets between two polls (p50, p95), as
// histogram_quantile would.
import * as api from '../api.js';
import { h, statusLine } from '../dom.js';
import { LineChart } from '../chart.js';
import * as fmt from '../format.js';
import * as prom from '../prom.js';
import { poller } from '../poll.js';

const REFRESH_MS = 5000;
const CREATE = 'space_sandbox_create_seconds';
const count = (v) => (Number.isInteger(v) ? String(v) : v.toFixed(1));

export function nodeView(root, ctx) {
  const session = ctx.session;
  root.appendChild(h('h1', { text: 'Node' }));
  if (!session.operator) {
    root.appendChild(h('section', { class: 'card notice', testid: 'node-forbidden' },
      h('p', { text: `Node figures (capacity, create latency) are for the node's operator only. You are logged in as tenant "${session.tenant}", which is not the operator.` }),
      h('p', { class: 'muted', text: 'Your own limits and usage are those of GET /v1/quota (spacectl quota).' })));
    return null;
  }

  let destroyed = false;
  const status = statusLine('node-status');
  const figure = (label, testid) => {
    const value = h('b', { testid, text: '…' });
    return { el: h('div', { class: 'figure' }, h('span', { class: 'muted', text: label }), value), value };
  };
  const vcpus = figure('vCPUs reserved / limit', 'node-vcpus');
  const memory = figure('Memory reserved / limit', 'node-memory');
  const sandboxes = figure('Sandboxes (running, paused, suspended)', 'node-sandboxes');
  const warm = figure('Warm pool ready', 'node-warm');
  const creates = figure('Creates (since spaced started)', 'node-creates');
  const latency = figure('Create latency p50 / p95 (all)', 'node-latency');

  const cpuChart = new LineChart({ title: 'vCPUs', testid: 'chart-node-vcpus', format: count,
    maxIsFloor: true, max: 2, series: [{ key: 'reserved', label: 'reserved' }, { key: 'limit', label: 'limit' }] });
  const memChart = new LineChart({ title: 'Memory (MB)', testid: 'chart-node-memory', format: (v) => fmt.mb(v),
    maxIsFloor: true, series: [{ key: 'reserved', label: 'reserved' }, { key: 'limit', label: 'limit' }] });
  const sbChart = new LineChart({ title: 'Sandboxes', testid: 'chart-node-sandboxes', format: count,
    maxIsFloor: true, max: 2,
    series: [{ key: 'running', label: 'running' }, { key: 'paused', label: 'paused' },
             { key: 'suspended', label: 'suspended' }, { key: 'warm', label: 'warm pool' }] });
  const latChart = new LineChart({ title: 'Create latency per 5 s (creates in it)', testid: 'chart-node-latency',
    format: fmt.seconds, maxIsFloor: true, max: 1, series: [{ key: 'p50', label: 'p50' }, { key: 'p95', label: 'p95' }] });
  const countChart = new LineChart({ title: 'Creates per 5 s', testid: 'chart-node-creates', format: count,
    maxIsFloor: true, max: 2, series: [{ key: 'n', label: 'creates' }] });

  root.append(
    h('section', { class: 'card' }, h('h2', { text: 'Capacity' }),
      h('div', { class: 'figures' }, vcpus.el, memory.el, sandboxes.el, warm.el, creates.el, latency.el), status.el),
    h('section', { class: 'card' }, h('h2', { text: 'Over time (since this page opened)' }),
      h('div', { class: 'charts' }, cpuChart.el, memChart.el, sbChart.el, latChart.el, countChart.el)));

  let prev = null; // the previous poll's create histogram

  async function load() {
    try {
      const text = await api.get('/metrics', { as: 'text' });
      if (destroyed) return;
      const s = prom.parse(text);
      const t = Date.now();
      const v = (name, labels) => prom.value(s, name, labels);
      const vr = v('space_node_vcpus_reserved');
      const vl = v('space_node_vcpus_limit');
      const mr = v('space_node_memory_reserved_mb');
      const ml = v('space_node_memory_limit_mb');
      const byState = (st) => v('space_sandboxes', { state: st }) ?? 0;
      const wp = v('space_warm_pool_ready');
      vcpus.value.textContent = `${vr ?? '—'} / ${vl ?? '—'}`;
      memory.value.textContent = `${fmt.mb(mr)} / ${fmt.mb(ml)}`;
      sandboxes.value.textContent = `${byState('running')}, ${byState('paused')}, ${byState('suspended')}`;
      warm.value.textContent = wp === undefined ? '—' : String(wp);
      cpuChart.push('reserved', t, vr ?? NaN); cpuChart.push('limit', t, vl ?? NaN);
      memChart.push('reserved', t, mr ?? NaN); memChart.push('limit', t, ml ?? NaN);
      for (const st of ['running', 'paused', 'suspended']) sbChart.push(st, t, byState(st));
      sbChart.push('warm', t, wp ?? NaN);

      const hist = prom.histogram(s, CREATE);
      if (hist) {
        creates.value.textContent = String(hist.count);
        latency.value.textContent = hist.count
          ? `${fmt.seconds(prom.quantile(0.5, hist))} / ${fmt.seconds(prom.quantile(0.95, hist))}` : '—';
        if (prev) {
          const d = prom.delta(prev, hist);
          countChart.push('n', t, d ? d.count : 0);
          if (d) {
            latChart.push('p50', t, prom.quantile(0.5, d));
            latChart.push('p95', t, prom.quantile(0.95, d));
          }
        }
        prev = hist;
      } else {
        creates.value.textContent = '—';
      }
      for (const c of [cpuChart, memChart, sbChart, latChart, countChart]) c.render();
      status.ok(`Updated ${fmt.clock()}; polled every ${REFRESH_MS / 1000} s.`);
    } catch (e) {
      if (destroyed) return;
      if (e instanceof api.ApiError && e.status === 403) {
        status.error(`Node figures are for the operator: ${api.describeError(e)}`);
      } else {
        status.error(`Cannot read /metrics: ${api.describeError(e)}`);
      }
    }
  }
  const poll = poller(load, REFRESH_MS);
  poll.now();
  return () => { destroyed = true; poll.stop(); };
}

