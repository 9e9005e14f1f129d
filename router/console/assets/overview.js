// The overview: each server-sent event (router/console/events.py) updates the figures, the charts
// (the last 5 minutes), the alarms and, for a broker admin, the store, the lease and the workers' and
// nodes' tables (a tenant admin's events carry the tenant's own figures and alarms only).
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
  rows("alarms", list.map(a => [[clock(a.raised)], [a.what, "what"], [a.details], [a.cleared === null ? "raised" : clock(a.cleared)]]),
       list.map(a => a.cleared === null ? "raised" : "cleared"));
}
function broker(f) {
  document.getElementById("broker-facts").hidden = false;
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
  for (const name of ["received", "sent", "dropped"]) {
    const rate = f.rates[name];
    text(name, rate === null ? "…" : rate.toFixed(1));
    if (rate !== null) charts[name].add(f.at, rate);
  }
  alarms(f.alarms);
  if (f.tenant === undefined) broker(f);
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
listen();
