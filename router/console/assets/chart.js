// A line chart of the last `span` seconds on a <canvas>: the console's own, so the page loads nothing
// from elsewhere.
"use strict";
function LineChart(canvas, span) {
  this.canvas = canvas;
  this.span = span;
  this.points = [];  // [seconds, value]
}
LineChart.prototype.add = function (at, value) {
  this.points.push([at, value]);
  while (this.points.length && this.points[0][0] < at - this.span) this.points.shift();
  this.draw(at);
};
LineChart.prototype.draw = function (now) {
  const c = this.canvas.getContext("2d"), w = this.canvas.width, h = this.canvas.height, pad = 4;
  c.clearRect(0, 0, w, h);
  const top = Math.max(1, ...this.points.map(p => p[1])) * 1.1;
  c.strokeStyle = "#e3e8ef"; c.fillStyle = "#6b7585"; c.font = "10px sans-serif";
  for (let i = 0; i <= 4; i++) {
    const y = pad + (h - 2 * pad) * i / 4;
    c.beginPath(); c.moveTo(0, y); c.lineTo(w, y); c.stroke();
    c.fillText(String(+(top * (4 - i) / 4).toPrecision(3)), 2, y + 10);
  }
  c.strokeStyle = "#2f6fde"; c.lineWidth = 2; c.beginPath();
  this.points.forEach((p, i) => {
    const x = w - (now - p[0]) / this.span * w, y = h - pad - p[1] / top * (h - 2 * pad);
    if (i) c.lineTo(x, y); else c.moveTo(x, y);
  });
  c.stroke();
};
