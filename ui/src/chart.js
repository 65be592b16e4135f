// A small line chart drawn as SVG by hand: a few series over time, a y axis from 0 (or the
// chart's min) to its max or the data's, labels with the chart's formatter, and a legend with
// each series' newest value.
import { h, svg, clear } from './dom.js';
import { clock } from './format.js';

const W = 320;
const H = 120;
const PAD = { left: 46, right: 8, top: 8, bottom: 18 };

export class LineChart {
  // series: [{key, label}]; format(v) -> text; min/max: fixed y bounds (max: a floor for the
  // top when maxIsFloor)
  constructor({ title, series, format = String, min = 0, max, maxIsFloor = false, testid, maxPoints = 720 }) {
    this.series = series;
    this.format = format;
    this.min = min;
    this.max = max;
    this.maxIsFloor = maxIsFloor;
    this.maxPoints = maxPoints;
    this.data = new Map(series.map((s) => [s.key, []]));
    this.plot = svg('svg', { class: 'chart-svg', viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none', role: 'img',
                             'aria-label': title });
    this.legend = h('div', { class: 'chart-legend' });
    this.el = h('figure', { class: 'chart', testid },
      h('figcaption', { text: title }), this.plot, this.legend);
    this.render();
  }

  // Replace a series' points: [[t_ms, v], ...] ascending in t.
  set(key, points) {
    this.data.set(key, points.slice(-this.maxPoints));
    this.render();
  }

  // Add a point (drawn at the next render()).
  push(key, t, v) {
    const pts = this.data.get(key);
    if (!pts) return;
    if (pts.length && pts[pts.length - 1][0] >= t) return;
    pts.push([t, v]);
    if (pts.length > this.maxPoints) pts.splice(0, pts.length - this.maxPoints);
  }

  pointCount() {
    let n = 0;
    for (const pts of this.data.values()) n += pts.length;
    return n;
  }

  render() {
    const all = [];
    for (const pts of this.data.values()) for (const p of pts) if (Number.isFinite(p[1])) all.push(p);
    clear(this.plot);
    clear(this.legend);
    const x0 = PAD.left;
    const x1 = W - PAD.right;
    const y0 = H - PAD.bottom;
    const y1 = PAD.top;
    let tMin = Infinity;
    let tMax = -Infinity;
    let vMax = -Infinity;
    for (const [t, v] of all) {
      if (t < tMin) tMin = t;
      if (t > tMax) tMax = t;
      if (v > vMax) vMax = v;
    }
    let top;
    if (this.max !== undefined && !this.maxIsFloor) top = this.max;
    else top = Math.max(this.max ?? 0, Number.isFinite(vMax) ? vMax * 1.1 : 0);
    if (!(top > this.min)) top = this.min + 1;
    const yOf = (v) => y0 - ((Math.min(Math.max(v, this.min), top) - this.min) / (top - this.min)) * (y0 - y1);
    const span = tMax > tMin ? tMax - tMin : 1;
    const xOf = (t) => (tMax > tMin ? x0 + ((t - tMin) / span) * (x1 - x0) : (x0 + x1) / 2);

    // grid and y labels
    for (const v of [this.min, (this.min + top) / 2, top]) {
      const y = yOf(v);
      this.plot.appendChild(svg('line', { class: 'grid', x1: x0, x2: x1, y1: y, y2: y }));
      this.plot.appendChild(svg('text', { class: 'axis', x: x0 - 4, y: y + 3, 'text-anchor': 'end', text: this.format(v) }));
    }
    if (all.length) {
      this.plot.appendChild(svg('text', { class: 'axis', x: x0, y: H - 4, 'text-anchor': 'start', text: clock(tMin) }));
      this.plot.appendChild(svg('text', { class: 'axis', x: x1, y: H - 4, 'text-anchor': 'end', text: clock(tMax) }));
    } else {
      this.plot.appendChild(svg('text', { class: 'axis', x: (x0 + x1) / 2, y: (y0 + y1) / 2, 'text-anchor': 'middle',
                                          text: 'no samples yet' }));
    }
    this.series.forEach((s, i) => {
      const pts = (this.data.get(s.key) || []).filter((p) => Number.isFinite(p[1]));
      if (pts.length > 1) {
        const d = pts.map(([t, v]) => `${xOf(t).toFixed(1)},${yOf(v).toFixed(1)}`).join(' ');
        this.plot.appendChild(svg('polyline', { class: `line s${i}`, points: d }));
      }
      if (pts.length) {
        const [t, v] = pts[pts.length - 1];
        this.plot.appendChild(svg('circle', { class: `dot s${i}`, cx: xOf(t).toFixed(1), cy: yOf(v).toFixed(1), r: 2.5 }));
      }
      const latest = pts.length ? this.format(pts[pts.length - 1][1]) : '—';
      this.legend.appendChild(h('span', { class: `key s${i}`, 'data-series': s.key },
        h('i', { class: 'swatch' }), `${s.label}: `, h('b', { text: latest })));
    });
  }
}
