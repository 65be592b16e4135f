// Reads the Prometheus text format (0.0.4) that spaced's /metrics serves, and estimates
// quantiles from histogram buckets as Prometheus's histogram_quantile does.

function parseLabels(s) {
  const labels = {};
  let i = 0;
  while (i < s.length) {
    while (s[i] === ' ' || s[i] === ',') i++;
    if (i >= s.length) break;
    const eq = s.indexOf('=', i);
    if (eq < 0) break;
    const name = s.slice(i, eq).trim();
    i = eq + 1;
    if (s[i] !== '"') break;
    i++;
    let value = '';
    while (i < s.length && s[i] !== '"') {
      if (s[i] === '\\' && i + 1 < s.length) {
        const c = s[i + 1];
        value += c === 'n' ? '\n' : c;
        i += 2;
      } else {
        value += s[i++];
      }
    }
    i++; // the closing quote
    labels[name] = value;
  }
  return labels;
}

function parseValue(s) {
  if (s === '+Inf') return Infinity;
  if (s === '-Inf') return -Infinity;
  if (s === 'NaN') return NaN;
  return Number(s);
}

// -> [{name, labels: {...}, value}]
export function parse(text) {
  const samples = [];
  for (const raw of String(text).split('\n')) {
    const line = raw.trim();
    if (!line || line.startsWith('#')) continue;
    let name;
    let labels = {};
    let rest;
    const brace = line.indexOf('{');
    const space = line.indexOf(' ');
    if (brace >= 0 && (space < 0 || brace < space)) {
      name = line.slice(0, brace);
      // the label block ends at the last '}' (values may hold '}' only inside quotes)
      const close = line.lastIndexOf('}');
      if (close < brace) continue;
      labels = parseLabels(line.slice(brace + 1, close));
      rest = line.slice(close + 1).trim();
    } else {
      if (space < 0) continue;
      name = line.slice(0, space);
      rest = line.slice(space + 1).trim();
    }
    const value = parseValue(rest.split(/\s+/)[0]);
    samples.push({ name, labels, value });
  }
  return samples;
}

function matches(labels, want) {
  for (const [k, v] of Object.entries(want || {})) if (labels[k] !== v) return false;
  return true;
}

// The value of the first sample called name with these labels (undefined if none).
export function value(samples, name, labels) {
  const s = samples.find((x) => x.name === name && matches(x.labels, labels));
  return s ? s.value : undefined;
}

export function sum(samples, name, filter = () => true) {
  let total;
  for (const s of samples) {
    if (s.name === name && filter(s.labels)) total = (total || 0) + s.value;
  }
  return total;
}

// -> {buckets: [{le, count}] ascending (cumulative counts), count, sum} or null
export function histogram(samples, name) {
  const buckets = samples
    .filter((s) => s.name === name + '_bucket' && s.labels.le !== undefined)
    .map((s) => ({ le: parseValue(s.labels.le), count: s.value }))
    .sort((a, b) => a.le - b.le);
  if (!buckets.length) return null;
  return { buckets, count: value(samples, name + '_count') ?? buckets[buckets.length - 1].count,
           sum: value(samples, name + '_sum') ?? 0 };
}

// What was observed between two scrapes of the same histogram (null if nothing, or if the
// counter was reset: spaced restarted).
export function delta(before, after) {
  if (!before || !after || after.buckets.length !== before.buckets.length) return null;
  const buckets = after.buckets.map((b, i) => ({ le: b.le, count: b.count - before.buckets[i].count }));
  const count = after.count - before.count;
  if (count <= 0 || buckets.some((b) => b.count < 0)) return null;
  return { buckets, count, sum: after.sum - before.sum };
}

// histogram_quantile: linear interpolation inside the bucket the rank falls in; a rank in the
// +Inf bucket answers the highest finite bound.
export function quantile(q, hist) {
  if (!hist || !hist.buckets.length) return NaN;
  const total = hist.buckets[hist.buckets.length - 1].count;
  if (!(total > 0)) return NaN;
  const rank = q * total;
  let prevLe = 0;
  let prevCount = 0;
  for (const b of hist.buckets) {
    if (b.count >= rank) {
      if (b.le === Infinity) return prevLe;
      const inBucket = b.count - prevCount;
      if (inBucket <= 0) return b.le;
      return prevLe + (b.le - prevLe) * ((rank - prevCount) / inBucket);
    }
    prevLe = b.le;
    prevCount = b.count;
  }
  return prevLe;
}
