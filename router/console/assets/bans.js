// The Bans page: the bans a page at a time (GET /api/bans), a new one (POST /api/bans/add) and lifting
// one (POST /api/bans/remove), both with the session's CSRF token. Everything shown is text (textContent).
"use strict";
const csrf = document.querySelector('meta[name="csrf"]').content;
const PAGE = 100;
const summary = document.getElementById("summary"), outcome = document.getElementById("outcome");
let offset = 0;

function when(at) {
  return new Date(at * 1000).toISOString().replace("T", " ").slice(0, 19);
}

let asking = 0;  // the listing last asked for: an answer to an earlier one that comes later is not drawn
async function list() {
  const mine = ++asking;
  summary.textContent = "Looking…";
  const asked = new URLSearchParams({limit: PAGE, offset: offset, filter: document.getElementById("filter").value});
  const answer = await fetch("/api/bans?" + asked);
  const said = answer.ok ? await answer.json() : (await answer.text()).trim();
  if (mine !== asking) return;
  if (!answer.ok) { summary.textContent = said; return; }
  const page = said;
  const shown = page.bans.length ? (page.offset + 1) + "–" + (page.offset + page.bans.length) + " of " : "";
  summary.textContent = shown + page.total + " bans";
  document.getElementById("bans").replaceChildren(...page.bans.map(([tenant, kind, value, reason, expires, by, created]) => {
    const tr = document.createElement("tr");
    tr.append(cell(tenant === "*" ? "every tenant" : tenant || "(default)"), cell(kind), cell(value), cell(reason),
              cell(expires ? when(expires) : "never"), cell(by), cell(when(created)),
              actionCell("Lift", "lift act", () => lift(tenant, kind, value)));
    return tr;
  }));
  document.getElementById("previous").disabled = offset === 0;
  document.getElementById("next").disabled = offset + page.bans.length >= page.total;
}

async function post(path, body) {
  const answer = await fetch(path, {method: "POST", headers: {"Content-Type": "application/json", "X-CSRF-Token": csrf},
                                    body: JSON.stringify(body)});
  outcome.textContent = (await answer.text()).trim();
  if (answer.ok) list();
  return answer.ok;
}

async function add(event) {
  event.preventDefault();
  const field = name => document.getElementById(name).value;
  if (await post("/api/bans/add", {kind: field("kind"), value: field("value"), tenant: field("tenant"),
                                   reason: field("reason"), duration: field("duration").trim()})) {
    document.getElementById("value").value = "";
  }
}

async function lift(tenant, kind, value) {
  if (confirm("Lift the ban of " + kind + " " + value + "?")) await post("/api/bans/remove", {tenant, kind, value});
}

document.getElementById("ban").onsubmit = add;
document.getElementById("previous").onclick = () => { offset = Math.max(offset - PAGE, 0); list(); };
document.getElementById("next").onclick = () => { offset += PAGE; list(); };
document.getElementById("search").onsubmit = (event) => { event.preventDefault(); offset = 0; list(); };
list();
