// A client's own page (/client?id=ID&tenant=NAME): its connection (GET /api/client, from its worker's
// listing: its figures since it connected, what is in flight and queued) and its session (subscriptions, a persistent session's outbox), and a disconnect button
// (POST /api/clients/disconnect with the session's CSRF token).
"use strict";
const csrf = document.querySelector('meta[name="csrf"]').content;
const asked = new URLSearchParams(location.search);
const clientId = asked.get("id") || "", tenant = asked.get("tenant") || "";

function row(name, value) {
  const tr = document.createElement("tr"), th = document.createElement("th"), td = document.createElement("td");
  th.textContent = name;
  td.textContent = value;
  tr.append(th, td);
  return tr;
}

function when(at) {
  return new Date(at * 1000).toISOString();
}

function options(subscription) {
  const said = [];
  if (subscription.no_local) said.push("no local");
  if (subscription.retain_as_published) said.push("retain as published");
  if (subscription.retain_handling) said.push("retain handling " + subscription.retain_handling);
  if (subscription.identifier) said.push("identifier " + subscription.identifier);
  return said.join(", ");
}

async function load() {
  document.getElementById("client-id").textContent = clientId + (tenant ? " (tenant " + tenant + ")" : "");
  const answer = await fetch("/api/client?id=" + encodeURIComponent(clientId) + "&tenant=" + encodeURIComponent(tenant));
  const state = document.getElementById("state");
  if (answer.status !== 200 && answer.status !== 404) { state.textContent = (await answer.text()).trim(); return; }
  const found = await answer.json(), connection = found.connection, session = found.session, facts = [];
  if (connection) {
    state.textContent = "Connected" + (found.complete ? "" : " (a worker did not answer)");
    facts.push(row("Username", connection.username), row("Address", connection.address),
               row("Connected since", new Date(connection.connected_at * 1000).toLocaleString()),
               row("Worker", connection.worker), row("Protocol", connection.protocol),
               row("Keepalive", connection.keepalive + " s"), row("Session", connection.persistent ? "persistent" : "clean"),
               row("In flight", connection.inflight), row("Queued", connection.queued),
               row("Messages in", connection.messages_in), row("Messages out", connection.messages_out),
               row("Bytes in", connection.bytes_in), row("Bytes out", connection.bytes_out));
  } else if (session && session.persistent) {
    state.textContent = "Not connected: its persistent session is kept offline"
      + (session.offline_since ? " since " + when(session.offline_since) : "")
      + (session.ends_at ? ", until " + when(session.ends_at) : "") + ".";
  } else {
    state.textContent = "Not connected" + (found.complete ? "." : " (a worker did not answer).");
  }
  if (session && session.persistent) {
    facts.push(row("Unacknowledged (kept by the router)", session.unacknowledged), row("Queued (kept by the router)", session.queued));
  }
  document.getElementById("facts").replaceChildren(...facts);
  const subscriptions = session ? session.subscriptions : [];
  document.getElementById("subscription-count").textContent = session && session.subscription_count > subscriptions.length
    ? "the first " + subscriptions.length + " of " + session.subscription_count : "";
  document.getElementById("subscriptions").replaceChildren(...subscriptions.map(subscription => {
    const tr = document.createElement("tr");
    for (const value of [subscription.filter, subscription.qos, options(subscription)]) {
      const td = document.createElement("td");
      td.textContent = value;
      tr.append(td);
    }
    return tr;
  }));
  document.getElementById("disconnect").disabled = !connection;
}

async function disconnect() {
  const answer = await fetch("/api/clients/disconnect", {
    method: "POST", headers: {"Content-Type": "application/json", "X-CSRF-Token": csrf},
    body: JSON.stringify({client_id: clientId, tenant: tenant}),
  });
  document.getElementById("said").textContent = (await answer.text()).trim();
  if (answer.ok) setTimeout(load, 500);
}

document.getElementById("disconnect").onclick = disconnect;
load();
