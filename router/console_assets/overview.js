// The overview: each server-sent event (router/console_events.py) updates the figures, the charts
// (the last 5 minutes) and the workers' and nodes' tables.
"use strict";
const charts = {};
for (const name of ["connections", "received", "sent", "dropped"]) {
  charts[name] = new LineChart(document.getElementById("chart-" + name), 300);
}
function text(id, value) { document.getElementById(id).textContent = value; }
function duration(s) {
  const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
  return (d ? d + "d " : "") + (d || h ? h + "h " : "") + m + "m " + s % 60 + "s";
}
function rows(id, items) {
  const body = document.getElementById(id);
  body.replaceChildren(...items.map(cells => {
    const tr = document.createElement("tr");
    for (const [value, cls] of cells) {
      const td = document.createElement("td");
      td.textContent = value;
      if (cls) td.className = cls;
      tr.append(td);
    }
    return tr;
  }));
}
const stream = new EventSource("/events");
stream.onerror = () => text("live", "reconnecting…");
stream.onmessage = (event) => {
  const f = JSON.parse(event.data);
  text("live", "live");
  text("version", f.version);
  text("uptime", duration(f.uptime));
  text("connections", f.connections);
  charts.connections.add(f.at, f.connections);
  for (const name of ["received", "sent", "dropped"]) {
    const rate = f.rates[name];
    text(name, rate === null ? "…" : rate.toFixed(1));
    if (rate !== null) charts[name].add(f.at, rate);
  }
  rows("workers", Object.entries(f.workers).map(([label, w]) =>
    [[label], [w.node || "(this host)"], [w.clients], [w.state, w.state]]));
  rows("nodes", Object.entries(f.nodes).map(([name, n]) =>
    [[name], [n.address], [n.workers], [n.clients], [n.state, n.state]]));
};
