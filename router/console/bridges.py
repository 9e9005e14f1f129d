"""The console's bridges page: each bridge (acceptor/bridges) with its state, since when, and its counts
(queued in the router, held by the bridge, sent, received, dropped), from the router's snapshot, which
`Stats` refreshes once a second, so the page asks nothing of the router's loop. A tenant admin sees the
bridges of the tenant only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plexmq.router.console.http import Page, Reply, Routes, json

if TYPE_CHECKING:
    from plexmq.router.console.app import Console
    from plexmq.router.console.auth import Session

FIELDS = ("state", "since", "tenant", "queued", "held", "sent", "received", "dropped")  # a bridge's, as the page shows them


def bridges(console: Console, environ: dict, session: Session) -> Reply:
    """GET /api/bridges: {"bridges": [{name, FIELDS...}, ...]} by name."""
    found = console.stats.snapshot.get("bridges", {})
    return json({"bridges": [{"name": name, **{key: bridge[key] for key in FIELDS}} for name, bridge in sorted(found.items())
                             if session.tenant is None or bridge["tenant"] == session.tenant]})


PAGES: list[Page] = [("/bridges", "Bridges", "bridges.html")]
ROUTES: Routes = {("GET", "/api/bridges"): bridges}
