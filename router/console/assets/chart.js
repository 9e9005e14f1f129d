// A line chart on a <canvas>: one line per series (the broker's figure, or each worker's), of the last
// `span` seconds (the range shown; points are kept for KEEP seconds, so a wider range has them). The
// console's own, so the page loads nothing from elsewhere.
"use strict";
const KEEP = 86400;
const COLORS = ["#2f6fde", "#d9480f", "#2b8a3e", "#9c36b5", "#e67700", "#0b7285", "#c2255c", "#5c940d"];
function LineChart(canvas, span, scale) {
  this.canvas = canvas;
  this.span = span;
  this.scale = scale || 1;  // values are divided by it when drawn (bytes shown as MB, say)
  this.series = new Map();  // name -> [[seconds, value]], oldest first
  this.now = 0;
}
// Points kept by the router (oldest first, before anything live): [at], [value] (null: unknown)
LineChart.prototype.load = function (name, at, values) {
  const points = this.series.get(name) || [];
  const first = points.length ? points[0][0] : Infinity;
  const older = [];
  at.forEach((t, i) => { if (values[i] !== null && t < first) older.push([t, values[i]]); });
  this.series.set(name, older.concat(points));
  if (older.length) this.now = Math.max(this.now, older[older.length - 1][0]);
};
LineChart.prototype.add = function (at, value, name) {
  const key = name === undefined ? "" : name;
  if (!this.series.has(key)) this.series.set(key, []);
  const points = this.series.get(key);
  points.push([at, value]);
  while (points.length && points[0][0] < at - KEEP) points.shift();
  this.now = Math.max(this.now, at);
};
LineChart.prototype.show = function (span) {
  this.span = span;
  this.draw();
};
LineChart.prototype.draw = function () {
  const c = this.canvas.getContext("2d"), w = this.canvas.width, h = this.canvas.height, pad = 4;
  const since = this.now - this.span;
  const shown = [...this.series].map(([name, points]) => [name, points.filter(p => p[0] >= since)]);
  c.clearRect(0, 0, w, h);
  const top = Math.max(1 / this.scale, ...shown.flatMap(([, points]) => points.map(p => p[1]))) * 1.1;
  c.strokeStyle = "#e3e8ef"; c.fillStyle = "#6b7585"; c.font = "10px sans-serif";
  for (let i = 0; i <= 4; i++) {
    const y = pad + (h - 2 * pad) * i / 4;
    c.beginPath(); c.moveTo(0, y); c.lineTo(w, y); c.stroke();
    c.fillText(String(+(top * (4 - i) / 4 / this.scale).toPrecision(3)), 2, y + 10);
  }
  shown.forEach(([name, points], n) => {
    c.strokeStyle = COLORS[n % COLORS.length]; c.lineWidth = 2; c.beginPath();
    points.forEach((p, i) => {
      const x = w - (this.now - p[0]) / this.span * w, y = h - pad - p[1] / top * (h - 2 * pad);
      if (i) c.lineTo(x, y); else c.moveTo(x, y);
    });
    c.stroke();
    if (name) { c.fillStyle = c.strokeStyle; c.fillText(name, w - 60, 12 + 11 * n); }
  });
};
