// The console's pure helpers, without a browser or spaced: the Prometheus reader and the
// quantile estimate the node page draws, formatting, and the file browser's path arithmetic.
//   node --test tests/ui/units.test.mjs
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as prom from '../../ui/src/prom.js';
import * as fmt from '../../ui/src/format.js';
import { joinPath, parentPath } from '../../ui/src/sections/files.js';

const scrape = (buckets, sum) => {
  const bounds = ['0.5', '1', '2.5', '+Inf'];
  let out = '# HELP space_sandbox_create_seconds Time to create a running sandbox.\n' +
            '# TYPE space_sandbox_create_seconds histogram\n';
  buckets.forEach((c, i) => { out += `space_sandbox_create_seconds_bucket{le="${bounds[i]}"} ${c}\n`; });
  return out + `space_sandbox_create_seconds_sum ${sum}\nspace_sandbox_create_seconds_count ${buckets[buckets.length - 1]}\n`;
};

test('prometheus text: gauges, labels with escapes, histograms', () => {
  const s = prom.parse([
    '# TYPE space_sandboxes gauge',
    'space_sandboxes{state="running"} 3',
    'space_sandboxes{state="paused"} 1',
    'space_node_vcpus_limit 8',
    'space_sandbox_cpu_used_percent{tenant="a\\"b,c}",sandbox="sb_x"} 12.5',
    'space_api_errors_total{code="permission_denied"} 2 1700000000000',
    '',
  ].join('\n'));
  assert.equal(prom.value(s, 'space_sandboxes', { state: 'running' }), 3);
  assert.equal(prom.value(s, 'space_node_vcpus_limit'), 8);
  assert.equal(prom.value(s, 'space_sandbox_cpu_used_percent', { tenant: 'a"b,c}' }), 12.5);
  assert.equal(prom.value(s, 'space_api_errors_total', { code: 'permission_denied' }), 2);
  assert.equal(prom.sum(s, 'space_sandboxes'), 4);
  assert.equal(prom.value(s, 'nope'), undefined);

  const h = prom.histogram(prom.parse(scrape([1, 3, 4, 4], 3.2)), 'space_sandbox_create_seconds');
  assert.deepEqual(h.buckets.map((b) => b.le), [0.5, 1, 2.5, Infinity]);
  assert.equal(h.count, 4);
  assert.equal(h.sum, 3.2);
});

test('quantiles from bucket deltas, as histogram_quantile', () => {
  const parse = (text) => prom.histogram(prom.parse(text), 'space_sandbox_create_seconds');
  const a = parse(scrape([0, 0, 0, 0], 0));
  const b = parse(scrape([2, 6, 10, 10], 12));
  const d = prom.delta(a, b);
  assert.equal(d.count, 10);
  // rank 5 of 10 falls in (0.5, 1] holding ranks 3..6: 0.5 + 0.5 * (5-2)/4
  assert.equal(prom.quantile(0.5, d), 0.875);
  // rank 9.5 in (1, 2.5] holding 7..10: 1 + 1.5 * (9.5-6)/4
  assert.ok(Math.abs(prom.quantile(0.95, d) - 2.3125) < 1e-9);
  // the +Inf bucket answers the highest finite bound
  const c = parse(scrape([2, 6, 10, 20], 40));
  assert.equal(prom.quantile(0.99, prom.delta(b, c)), 2.5);
  // nothing new, or a reset counter (spaced restarted): no estimate
  assert.equal(prom.delta(b, b), null);
  assert.equal(prom.delta(b, a), null);
  assert.ok(Number.isNaN(prom.quantile(0.5, null)));
});

test('formatting', () => {
  assert.equal(fmt.bytes(0), '0 B');
  assert.equal(fmt.bytes(1536), '1.5 KiB');
  assert.equal(fmt.bytes(512 * 1024 * 1024), '512 MiB');
  assert.equal(fmt.bytes(undefined), '—');
  assert.equal(fmt.mb(512), '512 MB');
  assert.equal(fmt.mb(2048), '2 GB');
  assert.equal(fmt.pct(5.25), '5.3 %');
  assert.equal(fmt.seconds(0.25), '250 ms');
  assert.equal(fmt.seconds(2.345), '2.35 s');
  assert.equal(fmt.duration(42), '42s');
  assert.equal(fmt.duration(192), '3m 12s');
  assert.equal(fmt.duration(2 * 3600 + 300), '2h 05m');
  assert.equal(fmt.duration(4 * 86400 + 3600), '4d 1h');
  assert.equal(fmt.age('2026-01-01T00:00:00.000Z', Date.parse('2026-01-01T00:01:05Z')), '1m 05s');
  assert.equal(fmt.metadataText({ team: 'ml', run: '7' }), 'team=ml, run=7');
});

test('file browser paths', () => {
  assert.equal(joinPath('/tmp', 'a'), '/tmp/a');
  assert.equal(joinPath('/', 'a'), '/a');
  assert.equal(parentPath('/home/user'), '/home');
  assert.equal(parentPath('/home/user/'), '/home');
  assert.equal(parentPath('/home'), '/');
  assert.equal(parentPath('/'), '/');
});
