// The Trace page: start a trace (POST /api/trace/start with the session's CSRF token), read what it
// kept once a second (POST /api/trace/read, with the token too: the router ends a trace nobody reads), stop it
// (POST /api/trace/stop). The page keeps the newest messages only, as many as a trace's ring holds; the
// router keeps more of what the page read, for the download link (GET /api/trace/download, a file).
"use strict";
const csrf = document.querySelector('meta[name="csrf"]').content;
const status = document.getElementById("status"), stopButton = document.getElementById("stop");
const messages = document.getElementById("messages"), download = document.getElementById("download");
let watched = null, ring = 500, timer = null;

function cell(tr, value) {
  const td = document.createElement("td");
  td.textContent = value;
  tr.append(td);
  return td;
}
async function post(path, body) {
  return fetch(path, {method: "POST", headers: {"Content-Type": "application/json", "X-CSRF-Token": csrf},
                      body: JSON.stringify(body)});
}
function publishers(trace) {
  return trace.by ? `${trace.by} ${trace.value}` : "every publisher";
}
function counts(trace) {
  return `tracing ${trace.filter} of ${publishers(trace)}` + (trace.tenant ? ` (tenant ${trace.tenant})` : "") +
    `: ${trace.matched} matched, ${trace.kept} kept, ${trace.skipped} skipped over the rate, ${trace.lost} lost unread`;
}
async function list() {
  const answer = await fetch("/api/trace");
  if (!answer.ok) return;
  const listing = await answer.json();
  ring = listing.ring;
  document.getElementById("tenant").hidden = listing.tenant !== null;
  document.getElementById("limits").textContent = `At most ${listing.most} traces at once (a tenant's admins: ` +
    `${listing.tenant_most}); each keeps ` +
    `${listing.rate} messages a second (the rest only counted), payloads cut to ${listing.payload} bytes, and ends ` +
    `when not read for ${listing.idle} s or after ${listing.lifetime} s.`;
  document.getElementById("traces").replaceChildren(...listing.traces.map(trace => {
    const tr = document.createElement("tr");
    for (const value of [trace.id, trace.filter, publishers(trace), trace.tenant || "(default)", trace.user, trace.age,
                         trace.matched]) cell(tr, value);
    const td = cell(tr, "");
    const watch = document.createElement("button"), stop = document.createElement("button");
    watch.textContent = "Watch";
    watch.onclick = () => follow(trace);
    stop.textContent = "Stop";
    stop.className = "stop";
    stop.onclick = () => end(trace.id);
    td.append(watch, " ", stop);
    return tr;
  }));
}
function follow(trace) {
  watched = trace.id;
  messages.replaceChildren();
  status.textContent = counts(trace);
  stopButton.hidden = false;
  download.href = "/api/trace/download?id=" + trace.id;
  download.hidden = false;
  clearTimeout(timer);
  read();
}
async function read() {
  if (watched === null) return;
  const id = watched, answer = await post("/api/trace/read", {id: id});
  if (id !== watched) return;
  if (!answer.ok) {
    status.textContent = `trace ${id}: ` + (await answer.text()).trim();
    watched = null;
    stopButton.hidden = download.hidden = true;
    list();
    return;
  }
  const trace = await answer.json();
  status.textContent = counts(trace);
  for (const message of trace.messages) {
    const tr = document.createElement("tr");
    tr.className = "message";
    const payload = message.payload + (message.cut ? " …" : "");
    for (const value of [message.seq, new Date(message.at * 1000).toLocaleTimeString(), message.topic, message.qos,
                         message.retain ? "yes" : "", message.size, message.client, payload]) cell(tr, value);
    if (message.form === "hex") tr.lastChild.className = "hex";
    messages.prepend(tr);
  }
  while (messages.childElementCount > ring) messages.lastChild.remove();
  timer = setTimeout(read, 1000);
}
async function end(id) {
  if (id === watched) await read();  // what it kept last
  const answer = await post("/api/trace/stop", {id: id});
  if (id === watched) {
    watched = null;
    clearTimeout(timer);
    stopButton.hidden = download.hidden = true;
  }
  status.textContent = answer.ok ? `trace ${id} stopped` : (await answer.text()).trim();
  list();
}
document.getElementById("begin").onsubmit = async (event) => {
  event.preventDefault();
  status.textContent = "starting…";
  const by = document.getElementById("by").value;
  const answer = await post("/api/trace/start", {filter: document.getElementById("filter").value,
                                                 tenant: document.getElementById("tenant").value,
                                                 by: by, value: by ? document.getElementById("value").value : ""});
  if (!answer.ok) { status.textContent = (await answer.text()).trim(); return; }
  const trace = await answer.json();
  follow(trace);
  list();
};
stopButton.onclick = () => { if (watched !== null) end(watched); };
list();
setInterval(list, 5000);
