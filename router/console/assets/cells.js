// The table cells the listing pages build their rows from (loaded before each page's own script):
// every value set as text, never as HTML, so a client id, topic or reason with markup shows as it is.

function cell(value) {
  const td = document.createElement("td");
  td.textContent = value;
  return td;
}

function actionCell(label, className, act) {
  const td = document.createElement("td"), button = document.createElement("button");
  button.textContent = label;
  button.className = className;
  button.onclick = act;
  td.append(button);
  return td;
}

function clientCell(clientId, tenant) {  // a link to the client's own page: its session, subscriptions, outbox
  const td = document.createElement("td"), page = document.createElement("a");
  page.href = "/client?" + new URLSearchParams({id: clientId, tenant: tenant});
  page.className = "client";
  page.textContent = clientId;
  td.append(page);
  return td;
}
