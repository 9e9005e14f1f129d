// The clients page: a search through the admin listing (GET /api/clients), each client id a link to
// its own page (/client), and a disconnect button (POST /api/clients/disconnect with the session's
// CSRF token).
"use strict";
const csrf = document.querySelector('meta[name="csrf"]').content;
const summary = document.getElementById("summary"), outcome = document.getElementById("outcome");
let asking = 0;  // the listing last asked for: an answer to an earlier one that comes later is not drawn
async function search() {
  const mine = ++asking;
  summary.textContent = "Looking…";
  const asked = new URLSearchParams({limit: 200, filter: document.getElementById("filter").value,
                                     protocol: document.getElementById("protocol").value});
  const answer = await fetch("/api/clients?" + asked);
  const said = answer.ok ? await answer.json() : await answer.text();
  if (mine !== asking) return;
  if (!answer.ok) { summary.textContent = said; return; }
  const listing = said;
  summary.textContent = listing.total + " clients" + (listing.total > listing.clients.length ?
    ` (the first ${listing.clients.length} shown: narrow the search)` : "") + (listing.complete ? "" : " (a worker did not answer)");
  document.getElementById("clients").replaceChildren(...listing.clients.map(client => {
    const tr = document.createElement("tr");
    for (const value of client) {
      const td = document.createElement("td");
      td.textContent = value;
      tr.append(td);
    }
    const page = document.createElement("a");  // the client's own page
    page.href = "/client?" + new URLSearchParams({id: client[0], tenant: client[8]});
    page.className = "client";
    page.textContent = client[0];
    tr.firstChild.replaceChildren(page);
    const td = document.createElement("td"), button = document.createElement("button");
    button.textContent = "Disconnect";
    button.className = "disconnect";
    button.onclick = () => disconnect(client[0], client[8]);
    td.append(button);
    tr.append(td);
    return tr;
  }));
}
async function disconnect(clientId, tenant) {
  const answer = await fetch("/api/clients/disconnect", {
    method: "POST", headers: {"Content-Type": "application/json", "X-CSRF-Token": csrf},
    body: JSON.stringify({client_id: clientId, tenant: tenant}),
  });
  outcome.textContent = (await answer.text()).trim();  // stays while the listing refreshes
  if (answer.ok) setTimeout(search, 500);
}
document.getElementById("search").onsubmit = (event) => { event.preventDefault(); search(); };
search();
