// The overview: at load the history the router keeps (GET /api/history: the last hour at 1 s, the last
// day at 1 min; a broker admin's only) is drawn, then each server-sent event (router/console/events.py)
// updates the figures, the charts, the totals, the alarms and, for a broker admin, the store, the lease
// and the workers' and nodes' tables (a tenant admin's events carry the tenant's own figures and alarms only).
"use strict";
const csrf = document.querySelector('meta[name="csrf"]').content;
const COUNTED = ["received", "sent", "dropped", "bytes_in", "bytes_out"];
const charts = {};
let span = 300;
for (const name of ["connections", ...COUNTED, "cpu", "rss"]) {
  charts[name] = new LineChart(document.getElementById("chart-" + name), span, name === "rss" ? 1 << 20 : 1);
}
function text(id, value) { document.getElementById(id).textContent = value; }
function duration(s) {
  const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
  return (d ? d + "d " : "") + (d || h ? h + "h " : "") + m + "m " + s % 60 + "s";
}
function clock(at) { return at === null ? "" : new Date(at * 1000).toLocaleString(); }
function rows(id, items, classes) {
  const body = document.getElementById(id);
  body.replaceChildren(...items.map((cells, i) => {
    const tr = document.createElement("tr");
    if (classes) tr.className = classes[i];
    for (const [value, cls] of cells) {
      const td = document.createElement("td");
      td.textContent = value;
      if (cls) td.className = cls;
      tr.append(td);
    }
    return tr;
  }));
}
function alarms(list) {
  const raised = list.filter(a => a.cleared === null).length;
  text("alarm-count", raised ? raised + " raised" : "");
  document.getElementById("no-alarms").hidden = list.length > 0;
  rows("alarms", list.map(a => [[clock(a.raised)], [a.what, "what"], [a.details], [a.cleared === null ? "raised" : clock(a.cleared)],
                                [a.acknowledged === null ? "" : `by ${a.acknowledged_by}, ${clock(a.acknowledged)}`, "acknowledged"]]),
       list.map(a => a.cleared === null ? "raised" : "cleared"));
  // a raised alarm nobody has acknowledged gets the button (a read-only admin's page hides it: .act)
  document.querySelectorAll("#alarms tr").forEach((tr, i) => {
    const a = list[i];
    if (a.cleared !== null || a.acknowledged !== null) return;
    const button = document.createElement("button");
    button.textContent = "Acknowledge";
    button.className = "act acknowledge";
    button.onclick = () => acknowledge(a);
    tr.lastChild.append(button);
  });
}
async function acknowledge(a) {
  const answer = await fetch("/api/alarms/acknowledge", {
    method: "POST", headers: {"Content-Type": "application/json", "X-CSRF-Token": csrf},
    body: JSON.stringify({name: a.name, subject: a.subject, raised: a.raised})});
  text("acknowledge-said", (await answer.text()).trim());
}
function broker(f) {
  document.getElementById("broker-facts").hidden = false;
  for (const figure of document.querySelectorAll(".broker-only")) figure.hidden = false;
  for (const [label, w] of Object.entries(f.workers)) {
    charts.cpu.add(f.at, w.cpu, label);
    charts.rss.add(f.at, w.rss, label);
  }
  document.getElementById("broker-tables").hidden = false;
  text("store-kind", f.store.kind);
  text("store-where", f.store.where);
  text("router", f.router.name ? `· router ${f.router.name} active, epoch ${f.router.epoch} (${f.router.failovers} failovers); ` +
    Object.entries(f.router.members).map(([name, m]) => `${name} ${m.up ? m.state : "gone"}`).join(", ") : "");
  rows("workers", Object.entries(f.workers).map(([label, w]) =>
    [[label], [w.node || "(this host)"], [w.clients], [w.state, w.state]]));
  rows("nodes", Object.entries(f.nodes).map(([name, n]) =>
    [[name], [n.address], [n.workers], [n.clients], [n.state, n.state]]));
}
function show(event) {
  const f = JSON.parse(event.data);
  text("live", "live");
  text("version", f.version);
  text("uptime", duration(f.uptime));
  text("scope", f.tenant === undefined ? "" : "· tenant " + (f.tenant || "(default)") +
       (f.connections === null ? " (this broker keeps no figures per tenant: metrics_tenants = false)" : ""));
  text("connections", f.connections === null ? "—" : f.connections);
  if (f.connections !== null) charts.connections.add(f.at, f.connections);
  for (const name of COUNTED) {
    const rate = f.rates[name];
    text(name, rate === null ? "…" : rate.toFixed(1));
    if (rate !== null) charts[name].add(f.at, rate);
  }
  for (const [name, count] of Object.entries(f.held)) text(name, count === null ? "—" : count);
  alarms(f.alarms);
  if (f.tenant === undefined) broker(f);
  redraw();
}
function redraw() { for (const chart of Object.values(charts)) chart.show(span); }
// The router's series: each chart's minutes before its seconds (the older part of the day), then live.
function drawHistory(kept) {
  const load = (chart, name, series, column) => {
    chart.load(name, series.seconds.at, series.seconds[column]);
    chart.load(name, series.minutes.at, series.minutes[column]);
  };
  if (kept.broker) {
    for (const name of ["connections", ...COUNTED]) load(charts[name], "", kept.broker, name);
    text("history", `(${kept.broker.seconds.at.length} s and ${kept.broker.minutes.at.length} min kept by the router)`);
  }
  for (const [label, series] of Object.entries(kept.workers || {})) {
    load(charts.cpu, label, series, "cpu");
    load(charts.rss, label, series, "rss");
  }
  redraw();
}
for (const button of document.querySelectorAll("#range button")) {
  button.onclick = () => {
    span = +button.dataset.span;
    for (const other of document.querySelectorAll("#range button")) other.classList.toggle("here", other === button);
    redraw();
  };
}
// The browser reconnects a stream that broke by itself; one the console refused (too many overviews
// open: 429 or 503) is closed for good, so it is opened again here, a few seconds later.
function listen() {
  const stream = new EventSource("/events");
  stream.onmessage = show;
  stream.onerror = () => {
    text("live", "reconnecting…");
    if (stream.readyState === EventSource.CLOSED) setTimeout(listen, 3000);
  };
}
fetch("/api/history").then(answer => answer.ok ? answer.json() : {}).then(drawHistory, () => {}).finally(listen);
