// A small SVG line chart: series of [time, value] points over a shared
// time axis, drawn without a library.

const NS = 'http://www.w3.org/2000/svg';
const W = 600, H = 170, L = 46, R = 8, T = 10, B = 22;

function el(name, attrs, text) {
  const e = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// fmt shortens a number for an axis or a legend.
export function fmt(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return '–';
  const a = Math.abs(v);
  if (a >= 1e9) return (v / 1e9).toFixed(1) + 'G';
  if (a >= 1e6) return (v / 1e6).toFixed(1) + 'M';
  if (a >= 1e4) return (v / 1e3).toFixed(1) + 'k';
  if (a >= 100 || v === Math.round(v)) return String(Math.round(v));
  if (a >= 1) return v.toFixed(1);
  return v.toFixed(2);
}

function ago(ms) {
  const s = Math.round(ms / 1000);
  if (s < 90) return '-' + s + 's';
  return '-' + Math.round(s / 60) + 'm';
}

// lineChart returns a figure: a title, the chart, and a legend with each
// series' latest value. series: [{name, points: [[Date, number], …]}].
export function lineChart(title, series, unit = '') {
  const fig = document.createElement('figure');
  fig.className = 'card chart-card';
  const cap = document.createElement('div');
  cap.className = 'chart-title';
  cap.textContent = title;
  fig.append(cap);
  const svg = el('svg', { viewBox: `0 0 ${W} ${H}`, class: 'chart', role: 'img', 'aria-label': title });
  const all = series.flatMap((s) => s.points);
  const now = Date.now();
  // The window ends at the last sample and spans at least a minute, so
  // that a server just started draws its few samples at the right.
  const t1 = all.length ? Math.max(...all.map((p) => +p[0])) : now;
  const t0 = Math.min(all.length ? Math.min(...all.map((p) => +p[0])) : t1, t1 - 60000);
  const span = t1 - t0;
  let top = Math.max(0, ...all.map((p) => p[1]));
  top = top > 0 ? top * 1.1 : 1;
  const x = (t) => L + ((+t - t0) / span) * (W - L - R);
  const y = (v) => T + (1 - v / top) * (H - T - B);
  svg.append(el('line', { x1: L, y1: y(0), x2: W - R, y2: y(0), class: 'axis' }));
  svg.append(el('line', { x1: L, y1: T, x2: L, y2: H - B, class: 'axis' }));
  svg.append(el('line', { x1: L, y1: y(top / 2), x2: W - R, y2: y(top / 2), class: 'axis', 'stroke-dasharray': '3 4' }));
  svg.append(el('text', { x: L - 4, y: T + 8, 'text-anchor': 'end' }, fmt(top)));
  svg.append(el('text', { x: L - 4, y: y(top / 2) + 4, 'text-anchor': 'end' }, fmt(top / 2)));
  svg.append(el('text', { x: L - 4, y: y(0), 'text-anchor': 'end' }, '0'));
  svg.append(el('text', { x: L, y: H - 6 }, ago(t1 - t0)));
  svg.append(el('text', { x: W - R, y: H - 6, 'text-anchor': 'end' }, 'now'));
  if (unit) svg.append(el('text', { x: W - R, y: T + 8, 'text-anchor': 'end' }, unit));
  series.forEach((s, i) => {
    if (!s.points.length) return;
    const pts = s.points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(' ');
    svg.append(el('polyline', { points: pts, class: 's' + (i % 6) }));
  });
  if (!all.length) svg.append(el('text', { x: W / 2, y: H / 2, 'text-anchor': 'middle' }, 'no samples yet'));
  fig.append(svg);
  const legend = document.createElement('div');
  legend.className = 'legend';
  series.forEach((s, i) => {
    const span = document.createElement('span');
    span.className = 's' + (i % 6);
    const last = s.points.length ? s.points[s.points.length - 1][1] : null;
    const b = document.createElement('b');
    b.textContent = fmt(last) + (unit ? ' ' + unit : '');
    span.append(s.name + ' ', b);
    span.dataset.series = s.name;
    legend.append(span);
  });
  fig.append(legend);
  return fig;
}
