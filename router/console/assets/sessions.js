// The sessions page: offline persistent sessions (GET /api/sessions, paged, each client id a link to
// its own page; removed with POST /api/sessions/remove and the session's CSRF token), the busiest filters (/api/filters) and topics
// (/api/topics, refreshed every few seconds), the shared groups (/api/groups).
"use strict";
const csrf = document.querySelector('meta[name="csrf"]').content;
const summary = document.getElementById("summary");
const PAGE = 100;
let offset = 0;

function row(values) {
  const tr = document.createElement("tr");
  tr.append(...values.map(cell));
  return tr;
}

function tenantName(tenant) {
  return tenant === "" ? "(default)" : tenant;
}

async function listing(path) {
  const answer = await fetch(path);
  if (!answer.ok) throw new Error((await answer.text()).trim());
  return answer.json();
}

let asking = 0;  // the listing last asked for: an answer to an earlier one that comes later is not drawn
async function sessions() {
  const asked = ++asking;
  summary.textContent = "Looking…";
  const prefix = document.getElementById("prefix").value;
  let page;
  try {
    page = await listing(`/api/sessions?limit=${PAGE}&offset=${offset}&prefix=` + encodeURIComponent(prefix));
  } catch (error) { if (asked === asking) summary.textContent = error.message; return; }
  if (asked !== asking) return;
  const last = Math.min(page.offset + page.rows.length, page.total);
  summary.textContent = `${page.total} offline sessions` + (page.total ? ` (${page.offset + 1} to ${last})` : "") +
    (page.complete ? "" : " among the first sessions looked at");
  document.getElementById("sessions").replaceChildren(...page.rows.map(([clientId, tenant, queued, bytes, ends, subs]) => {
    const tr = row([clientId, tenantName(tenant), queued, bytes, ends === null ? "never" : new Date(ends * 1000).toLocaleString(), subs]);
    tr.firstChild.replaceWith(clientCell(clientId, tenant));
    tr.append(actionCell("Remove", "remove", () => remove(clientId, tenant)));
    return tr;
  }));
  document.getElementById("previous").disabled = offset === 0;
  document.getElementById("next").disabled = last >= page.total;
}

async function remove(clientId, tenant) {
  if (!confirm(`Remove the session of ${clientId}, its queued messages and subscriptions?`)) return;
  const answer = await fetch("/api/sessions/remove", {
    method: "POST", headers: {"Content-Type": "application/json", "X-CSRF-Token": csrf},
    body: JSON.stringify({client_id: clientId, tenant: tenant}),
  });
  const said = (await answer.text()).trim();
  await sessions();
  summary.textContent = said;
}

async function busiest() {
  try {
    const filters = await listing("/api/filters"), topics = await listing("/api/topics");
    document.getElementById("filters-note").textContent = filters.complete ? "" : "Among the first filters looked at.";
    document.getElementById("filters").replaceChildren(...filters.rows.map(([tenant, filter, count]) =>
      row([tenantName(tenant), filter, count])));
    document.getElementById("topics").replaceChildren(...topics.rows.map(([tenant, topic, rate]) =>
      row([tenantName(tenant), topic, rate.toFixed(1)])));
  } catch (error) { document.getElementById("filters-note").textContent = error.message; }
}

async function groups() {
  let page;
  try { page = await listing("/api/groups?limit=" + PAGE); } catch (error) {
    document.getElementById("groups-note").textContent = error.message;
    return;
  }
  document.getElementById("groups-note").textContent = `${page.total} groups` + (page.total > page.rows.length ? `, the first ${page.rows.length} shown` : "");
  document.getElementById("groups").replaceChildren(...page.rows.map(group => {
    const members = group.members.map(([clientId, online]) => clientId + (online ? " (online)" : " (offline)")).join(", ");
    return row([tenantName(group.tenant), group.group, group.filter, group.strategy,
      members + (group.count > group.members.length ? ` and ${group.count - group.members.length} more` : "")]);
  }));
}

document.getElementById("search").onsubmit = (event) => { event.preventDefault(); offset = 0; sessions(); };
document.getElementById("previous").onclick = () => { offset = Math.max(0, offset - PAGE); sessions(); };
document.getElementById("next").onclick = () => { offset += PAGE; sessions(); };
sessions();
busiest();
groups();
setInterval(busiest, 5000);
