// The bridges page: each bridge's state and counts (GET /api/bridges), asked again every REFRESH ms.
// Every value goes in as text, never as markup.
"use strict";
const REFRESH = 2000;
const summary = document.getElementById("summary");

async function show() {
  let answer;
  try {
    answer = await fetch("/api/bridges");
  } catch (error) {
    summary.textContent = "The console does not answer: " + error.message;
    return;
  }
  if (!answer.ok) { summary.textContent = (await answer.text()).trim(); return; }
  const found = (await answer.json()).bridges;
  summary.textContent = found.length ? found.length + " bridges" : "No bridges (declare them in [bridges.NAME] tables)";
  document.getElementById("bridges").replaceChildren(...found.map((bridge) => {
    const tr = document.createElement("tr");
    tr.className = bridge.state === "connected" ? "up" : "down";
    tr.append(cell(bridge.name), cell(bridge.state), cell(new Date(bridge.since * 1000).toISOString()),
      cell(bridge.tenant || "(default)"), cell(bridge.queued), cell(bridge.held), cell(bridge.sent),
      cell(bridge.received), cell(bridge.dropped));
    return tr;
  }));
}

show();
setInterval(show, REFRESH);
