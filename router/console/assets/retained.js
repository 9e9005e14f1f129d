// The retained messages page: browse by topic filter (GET /api/retained, a page at a time), view one
// (GET /api/retained/message: its payload as text, JSON or hex, and its properties) and delete it
// (POST /api/retained/delete with the session's CSRF token).
"use strict";
const csrf = document.querySelector('meta[name="csrf"]').content;
const PAGE = 100;
const summary = document.getElementById("summary");
let offset = 0, viewed = null;

function expiry(at) {
  return at ? new Date(at * 1000).toISOString() : "never";
}

let asking = 0;  // the listing last asked for: an answer to an earlier one that comes later is not drawn
async function browse() {
  const asked = ++asking;
  summary.textContent = "Looking…";
  const filter = document.getElementById("filter").value || "#";
  const answer = await fetch("/api/retained?limit=" + PAGE + "&offset=" + offset + "&filter=" + encodeURIComponent(filter));
  const said = answer.ok ? await answer.json() : (await answer.text()).trim();
  if (asked !== asking) return;
  if (!answer.ok) { summary.textContent = said; return; }
  const page = said;
  const shown = page.messages.length ? (page.offset + 1) + "–" + (page.offset + page.messages.length) + " of " : "";
  summary.textContent = shown + (page.whole ? "" : "at least ") + page.total + " retained messages";
  document.getElementById("messages").replaceChildren(...page.messages.map(([topic, qos, size, expires, tenant]) => {
    const tr = document.createElement("tr");
    tr.append(cell(topic), cell(qos), cell(size), cell(expiry(expires)), cell(tenant),
              actionCell("View", "view", () => view(topic, tenant)));
    return tr;
  }));
  document.getElementById("previous").disabled = offset === 0;
  document.getElementById("next").disabled = offset + page.messages.length >= page.total;
}

async function view(topic, tenant) {
  const answer = await fetch("/api/retained/message?topic=" + encodeURIComponent(topic) + "&tenant=" + encodeURIComponent(tenant));
  document.getElementById("view").hidden = false;
  document.getElementById("said").textContent = "";
  if (!answer.ok) {
    viewed = null;
    document.getElementById("view-topic").textContent = topic;
    document.getElementById("view-facts").textContent = (await answer.text()).trim();
    document.getElementById("payload").textContent = "";
    return;
  }
  viewed = await answer.json();
  document.getElementById("view-topic").textContent = viewed.topic;
  document.getElementById("view-facts").textContent = "QoS " + viewed.qos + " · " + viewed.size + " payload bytes · expires "
    + expiry(viewed.expires_at) + (viewed.tenant ? " · tenant " + viewed.tenant : "");
  const props = viewed.properties, rows = [];
  for (const [name, value] of [["Content type", props.content_type], ["Payload format indicator", props.payload_format_indicator],
                               ["Response topic", props.response_topic], ["Correlation data (hex)", props.correlation_data]]) {
    if (value !== null) rows.push([name, value]);
  }
  for (const [name, value] of props.user_properties) rows.push(["User property " + name, value]);
  document.getElementById("view-properties").replaceChildren(...rows.map(([name, value]) => {
    const tr = document.createElement("tr");
    tr.append(cell(name), cell(value));
    return tr;
  }));
  document.getElementById("view-cut").textContent = viewed.cut ? "(the first " + viewed.hex.length / 2 + " bytes of " + viewed.size + ")" : "";
  document.getElementById("show-text").disabled = viewed.text === null;
  document.getElementById("show-json").disabled = viewed.json === null;
  show(viewed.json !== null ? "json" : viewed.text !== null ? "text" : "hex");
}

function show(form) {
  let shown = viewed[form];
  if (form === "hex") {
    const lines = [];
    for (let at = 0; at < shown.length; at += 32) {
      lines.push((at / 2).toString(16).padStart(8, "0") + "  " + shown.slice(at, at + 32).replace(/(..)(?!$)/g, "$1 "));
    }
    shown = lines.join("\n");
  }
  document.getElementById("payload").textContent = shown;
  for (const name of ["text", "json", "hex"]) document.getElementById("show-" + name).classList.toggle("here", name === form);
}

async function remove() {
  if (viewed === null || !confirm("Delete the retained message on " + viewed.topic + "?")) return;
  const answer = await fetch("/api/retained/delete", {
    method: "POST", headers: {"Content-Type": "application/json", "X-CSRF-Token": csrf},
    body: JSON.stringify({topic: viewed.topic, tenant: viewed.tenant}),
  });
  document.getElementById("said").textContent = (await answer.text()).trim();
  if (answer.ok) browse();
}

for (const name of ["text", "json", "hex"]) document.getElementById("show-" + name).onclick = () => show(name);
document.getElementById("delete").onclick = remove;
document.getElementById("previous").onclick = () => { offset = Math.max(offset - PAGE, 0); browse(); };
document.getElementById("next").onclick = () => { offset += PAGE; browse(); };
document.getElementById("search").onsubmit = (event) => { event.preventDefault(); offset = 0; browse(); };
browse();
