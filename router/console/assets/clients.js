// The clients page: every connected client, a page at a time, in the order of the column clicked
// (the router sorts: GET /api/clients with sort= and order=, so the pages follow each other), each
// client id a link to its own page (/client), and a disconnect button (POST /api/clients/disconnect
// with the session's CSRF token).
"use strict";
const csrf = document.querySelector('meta[name="csrf"]').content;
const summary = document.getElementById("summary"), outcome = document.getElementById("outcome");
const PAGE = 100;
const SHOWN = ["client_id", "username", "address", "connected_at", "messages_in", "messages_out", "bytes_in", "bytes_out",
               "inflight", "queued", "keepalive", "protocol", "persistent", "worker", "tenant"];  // the columns' order
let offset = 0, sort = "client_id", order = "asc";
let asking = 0;  // the listing last asked for: an answer to an earlier one that comes later is not drawn

function shown(field, value) {
  if (field === "connected_at") return new Date(value * 1000).toLocaleString();
  if (field === "persistent") return value ? "yes" : "no";
  return value;
}

async function search() {
  const mine = ++asking;
  summary.textContent = "Looking…";
  const asked = new URLSearchParams({limit: PAGE, offset: offset, sort: sort, order: order,
                                     filter: document.getElementById("filter").value,
                                     protocol: document.getElementById("protocol").value});
  const answer = await fetch("/api/clients?" + asked);
  const said = answer.ok ? await answer.json() : await answer.text();
  if (mine !== asking) return;
  if (!answer.ok) { summary.textContent = said; return; }
  const listing = said, at = Object.fromEntries(listing.fields.map((field, i) => [field, i]));
  const last = listing.offset + listing.clients.length;
  summary.textContent = listing.total + " clients" + (listing.total > PAGE ? ` (${listing.offset + 1} to ${last})` : "") +
    (listing.complete ? "" : " (a worker did not answer)");
  document.getElementById("clients").replaceChildren(...listing.clients.map(client => {
    const tr = document.createElement("tr"), clientId = client[at.client_id], tenant = client[at.tenant];
    tr.append(...SHOWN.map(field => cell(shown(field, client[at[field]]))),
              actionCell("Disconnect", "disconnect", () => disconnect(clientId, tenant)));
    tr.firstChild.replaceWith(clientCell(clientId, tenant));
    return tr;
  }));
  for (const th of document.querySelectorAll("#columns th[data-sort]")) {
    th.className = th.dataset.sort === sort ? order : "";
  }
  document.getElementById("previous").disabled = offset === 0;
  document.getElementById("next").disabled = last >= listing.total;
}

async function disconnect(clientId, tenant) {
  const answer = await fetch("/api/clients/disconnect", {
    method: "POST", headers: {"Content-Type": "application/json", "X-CSRF-Token": csrf},
    body: JSON.stringify({client_id: clientId, tenant: tenant}),
  });
  outcome.textContent = (await answer.text()).trim();  // stays while the listing refreshes
  if (answer.ok) setTimeout(search, 500);
}

for (const th of document.querySelectorAll("#columns th[data-sort]")) {
  th.onclick = () => {  // the same column again turns the order round
    order = th.dataset.sort === sort && order === "asc" ? "desc" : "asc";
    sort = th.dataset.sort;
    offset = 0;
    search();
  };
}
document.getElementById("previous").onclick = () => { offset = Math.max(0, offset - PAGE); search(); };
document.getElementById("next").onclick = () => { offset += PAGE; search(); };
document.getElementById("search").onsubmit = (event) => { event.preventDefault(); offset = 0; search(); };
search();
