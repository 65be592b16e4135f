// #/sandboxes: the tenant's sandboxes (refreshed every 5 s), filters, and a create form.
import * as api from '../api.js';
import { h, replaceChildren, statusLine } from '../dom.js';
import { reportError, info } from '../messages.js';
import * as fmt from '../format.js';
import { poller } from '../poll.js';

const STATES = ['creating', 'running', 'paused', 'suspended', 'failed', 'deleted'];
const REFRESH_MS = 5000;
const MAX_METRICS = 50; // sandboxes whose newest sample is fetched per refresh
const METRICS_PARALLEL = 4;

export function sandboxesView(root, ctx) {
  let alive = true;
  let sandboxes = [];
  const samples = new Map(); // id -> newest metrics sample
  const metricErrors = new Map(); // id -> message

  // --- create form
  const template = h('input', { type: 'text', value: 'base', required: true, testid: 'create-template', id: 'create-template' });
  const cpus = h('input', { type: 'number', min: 1, step: 1, placeholder: 'default', testid: 'create-cpus', id: 'create-cpus' });
  const memory = h('input', { type: 'number', min: 128, step: 64, placeholder: 'default', testid: 'create-memory', id: 'create-memory' });
  const timeout = h('input', { type: 'number', min: 1, step: 1, placeholder: 'default', testid: 'create-timeout', id: 'create-timeout' });
  const createButton = h('button', { type: 'submit', testid: 'create-submit', text: 'Create' });
  const createStatus = statusLine('create-status');
  const createForm = h('form', { class: 'create inline-form', testid: 'create-form' },
    h('label', { for: 'create-template' }, 'Template ', template),
    h('label', { for: 'create-cpus' }, 'vCPUs ', cpus),
    h('label', { for: 'create-memory' }, 'Memory (MB) ', memory),
    h('label', { for: 'create-timeout' }, 'Timeout (s) ', timeout),
    createButton);
  createForm.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const body = { template: template.value.trim() || 'base' };
    if (cpus.value) body.cpus = Number(cpus.value);
    if (memory.value) body.memory_mb = Number(memory.value);
    if (timeout.value) body.timeout_s = Number(timeout.value);
    createButton.disabled = true;
    createStatus.busy(`Creating a sandbox from template "${body.template}"…`);
    try {
      const sb = await api.post('/v1/sandboxes', body);
      if (!alive) return;
      createStatus.ok(`Created ${sb.id} (${sb.state}).`);
      info(`Created ${sb.id}.`);
      refresh();
    } catch (e) {
      createStatus.error(`Create failed: ${api.describeError(e)}`);
      reportError('create a sandbox', e);
    } finally {
      createButton.disabled = false;
    }
  });

  // --- filters
  const stateFilter = h('select', { testid: 'filter-state', id: 'filter-state' },
    h('option', { value: '', text: 'all but deleted' }),
    STATES.map((s) => h('option', { value: s, text: s })),
    h('option', { value: STATES.join(','), text: 'all, deleted too' }));
  const textFilter = h('input', { type: 'search', placeholder: 'id, template or metadata', testid: 'filter-text', id: 'filter-text' });
  stateFilter.addEventListener('change', () => refresh());
  textFilter.addEventListener('input', () => render());
  const refreshButton = h('button', { type: 'button', testid: 'list-refresh', text: 'Refresh', onClick: () => refresh() });
  const listStatus = statusLine('list-status');
  const count = h('span', { class: 'muted', testid: 'sandbox-count' });

  const tbody = h('tbody', { testid: 'sandbox-rows' });
  const table = h('table', { class: 'list', testid: 'sandbox-table' },
    h('thead', {}, h('tr', {},
      ['ID', 'State', 'Template', 'Age', 'Size', 'CPU', 'Memory', 'Metadata'].map((t) => h('th', { text: t })))),
    tbody);

  root.append(
    h('section', { class: 'card' }, h('h2', { text: 'New sandbox' }), createForm, createStatus.el),
    h('section', { class: 'card', testid: 'sandbox-list' },
      h('div', { class: 'section-head' }, h('h2', { text: 'Sandboxes' }), count),
      h('div', { class: 'inline-form' },
        h('label', { for: 'filter-state' }, 'State ', stateFilter),
        h('label', { for: 'filter-text' }, 'Filter ', textFilter),
        refreshButton),
      listStatus.el,
      h('div', { class: 'table-wrap' }, table)));

  function matches(sb, needle) {
    if (!needle) return true;
    const hay = [sb.id, sb.template, sb.snapshot || '', fmt.metadataText(sb.metadata)].join('\n').toLowerCase();
    return hay.includes(needle);
  }

  function cpuCell(sb) {
    if (sb.state !== 'running') return '—';
    if (metricErrors.has(sb.id)) return 'error';
    const m = samples.get(sb.id);
    return m ? fmt.pct(m.cpu_used_pct) : '…';
  }

  function memCell(sb) {
    if (sb.state !== 'running') return '—';
    if (metricErrors.has(sb.id)) return 'error';
    const m = samples.get(sb.id);
    if (!m) return '…';
    const used = typeof m.guest_mem_used_bytes === 'number' ? m.guest_mem_used_bytes : m.mem_used_bytes;
    return `${fmt.bytes(used)} / ${fmt.mb(sb.memory_mb)}`;
  }

  function render() {
    const needle = textFilter.value.trim().toLowerCase();
    const shown = sandboxes.filter((sb) => matches(sb, needle));
    const now = Date.now();
    replaceChildren(tbody, shown.map((sb) => {
      const tr = h('tr', { testid: 'sandbox-row', 'data-id': sb.id, 'data-state': sb.state },
        h('td', {}, h('a', { href: '#/sandboxes/' + encodeURIComponent(sb.id), testid: 'sandbox-link', text: sb.id })),
        h('td', {}, h('span', { class: 'state state-' + sb.state, testid: 'sandbox-state', text: sb.state,
                                title: sb.state_reason || '' })),
        h('td', { text: sb.template + (sb.snapshot ? ` (from ${sb.snapshot})` : '') }),
        h('td', { text: fmt.age(sb.created_at, now), title: fmt.timestamp(sb.created_at) }),
        h('td', { text: `${sb.cpus} vCPU / ${fmt.mb(sb.memory_mb)}` }),
        h('td', { testid: 'sandbox-cpu', text: cpuCell(sb), title: metricErrors.get(sb.id) || '' }),
        h('td', { testid: 'sandbox-mem', text: memCell(sb), title: metricErrors.get(sb.id) || '' }),
        h('td', { class: 'meta', text: fmt.metadataText(sb.metadata) }));
      return tr;
    }));
    if (!shown.length) {
      tbody.appendChild(h('tr', { class: 'empty' }, h('td', { colspan: 8, class: 'muted',
        text: sandboxes.length ? 'No sandbox matches the filter.' : 'No sandboxes.' })));
    }
    count.textContent = shown.length === sandboxes.length
      ? `${sandboxes.length} sandbox${sandboxes.length === 1 ? '' : 'es'}`
      : `${shown.length} of ${sandboxes.length} shown`;
  }

  async function loadMetrics(list) {
    const running = list.filter((sb) => sb.state === 'running').slice(0, MAX_METRICS);
    const since = Math.floor(Date.now() / 1000) - 60;
    const errors = [];
    let next = 0;
    async function worker() {
      while (alive && next < running.length) {
        const sb = running[next++];
        try {
          const res = await api.get(api.sandboxPath(sb.id, '/metrics') + api.query({ start: since }));
          const series = Array.isArray(res && res.metrics) ? res.metrics : [];
          if (series.length) samples.set(sb.id, series[series.length - 1]);
          metricErrors.delete(sb.id);
        } catch (e) {
          metricErrors.set(sb.id, api.describeError(e));
          errors.push(`metrics of ${sb.id}: ${api.describeError(e)}`);
        }
      }
    }
    await Promise.all(Array.from({ length: METRICS_PARALLEL }, worker));
    return errors;
  }

  async function load() {
    try {
      const params = stateFilter.value ? { state: stateFilter.value } : {};
      const list = await api.listAll('/v1/sandboxes', params, 'sandboxes');
      if (!alive) return;
      sandboxes = list;
      for (const id of [...samples.keys()]) if (!list.some((sb) => sb.id === id)) samples.delete(id);
      render();
      const errors = await loadMetrics(list);
      if (!alive) return;
      render();
      if (errors.length) listStatus.error(errors.join('; '));
      else listStatus.ok(`Updated ${fmt.clock()}; refreshes every ${REFRESH_MS / 1000} s.`);
    } catch (e) {
      if (!alive) return;
      listStatus.error(`Cannot list sandboxes: ${api.describeError(e)}`);
    }
  }
  const poll = poller(load, REFRESH_MS);
  const refresh = () => poll.now();

  refresh();
  return () => { alive = false; poll.stop(); };
}
