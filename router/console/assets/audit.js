// The Audit page: the admins' actions, newest first (GET /api/audit, paged; a tenant admin's own
// tenant's only, whatever it names). Every value is shown as text.
"use strict";
const PAGE = 100;
let offset = 0;

async function show() {
  const tenant = document.getElementById("tenant").value;
  const answer = await fetch(`/api/audit?offset=${offset}&limit=${PAGE}` +
                             (tenant ? "&tenant=" + encodeURIComponent(tenant) : ""));
  const summary = document.getElementById("summary");
  if (!answer.ok) { summary.textContent = (await answer.text()).trim(); return; }
  const page = await answer.json();
  summary.textContent = page.total ? `${page.offset + 1}–${page.offset + page.rows.length} of ${page.total}` : "Nothing audited yet.";
  document.getElementById("entries").replaceChildren(...page.rows.map(entry => {
    const tr = document.createElement("tr");
    for (const value of [new Date(entry.at * 1000).toLocaleString(), entry.admin, entry.address,
                         entry.tenant || "(default)", entry.action, entry.target, entry.outcome]) {
      const td = document.createElement("td");
      td.textContent = value;
      tr.append(td);
    }
    return tr;
  }));
  document.getElementById("previous").disabled = offset === 0;
  document.getElementById("next").disabled = offset + page.rows.length >= page.total;
}
document.getElementById("search").onsubmit = event => { event.preventDefault(); offset = 0; show(); };
document.getElementById("previous").onclick = () => { offset = Math.max(0, offset - PAGE); show(); };
document.getElementById("next").onclick = () => { offset += PAGE; show(); };
show();
