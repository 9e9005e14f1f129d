// The subscriptions page: every session's subscriptions (GET /api/subscriptions, paged), found by a
// part of the filter and of the client id, by filter or by client; each client id a link to its page.
"use strict";
const summary = document.getElementById("summary");
const PAGE = 100;
let offset = 0;
let asking = 0;  // the listing last asked for: an answer to an earlier one that comes later is not drawn

async function search() {
  const mine = ++asking;
  summary.textContent = "Looking…";
  const asked = new URLSearchParams({limit: PAGE, offset: offset, filter: document.getElementById("filter").value,
                                     client: document.getElementById("client").value,
                                     order: document.getElementById("order").value});
  const answer = await fetch("/api/subscriptions?" + asked);
  const said = answer.ok ? await answer.json() : (await answer.text()).trim();
  if (mine !== asking) return;
  if (!answer.ok) { summary.textContent = said; return; }
  const last = said.offset + said.rows.length;
  summary.textContent = `${said.total} subscriptions` + (said.total > PAGE ? ` (${said.offset + 1} to ${last})` : "") +
    (said.complete ? "" : " among the first sessions looked at");
  document.getElementById("subscriptions").replaceChildren(...said.rows.map(([tenant, clientId, filter, qos, online, persistent]) => {
    const tr = document.createElement("tr");
    tr.append(cell(tenant === "" ? "(default)" : tenant), cell(filter), clientCell(clientId, tenant), cell(qos),
              cell((online ? "online" : "offline") + (persistent ? ", persistent" : "")));
    return tr;
  }));
  document.getElementById("previous").disabled = offset === 0;
  document.getElementById("next").disabled = last >= said.total;
}

document.getElementById("previous").onclick = () => { offset = Math.max(0, offset - PAGE); search(); };
document.getElementById("next").onclick = () => { offset += PAGE; search(); };
document.getElementById("search").onsubmit = (event) => { event.preventDefault(); offset = 0; search(); };
search();
