"""The console's Audit page: who did what, newest first (router/ops/audit.py keeps the log). A tenant
admin sees the entries of its tenant only, a broker admin every one (or one tenant's: `tenant=NAME`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plexmq.router.asks import ask
from plexmq.router.console.http import Page, Reply, Routes, json, query, text
from plexmq.router.ops.audit import KEEP, AuditPage

if TYPE_CHECKING:
    from plexmq.router.console.app import Console
    from plexmq.router.console.auth import Session

PAGE = 100  # entries a page shows unless asked for fewer (at most MAX_PAGE)
MAX_PAGE = 500


def entries(console: Console, environ: dict, session: Session) -> Reply:
    """GET /api/audit?offset=N&limit=N[&tenant=NAME]: {"total", "offset", "rows": [entry, ...]}."""
    asked = query(environ)
    try:
        offset, limit = int(asked.get("offset") or 0), int(asked.get("limit") or PAGE)
    except ValueError:
        return text("400 Bad Request", "offset and limit are numbers")
    tenant = session.tenant if session.tenant is not None else asked.get("tenant")
    page = AuditPage(tenant, min(max(offset, 0), KEEP), min(max(limit, 1), MAX_PAGE))
    if not ask(console.asks, page):
        return text("503 Service Unavailable", "the router did not answer in time")
    return json({"total": page.total, "offset": page.offset, "rows": page.rows})


PAGES: list[Page] = [("/audit", "Audit", "audit.html")]
ROUTES: Routes = {("GET", "/api/audit"): entries}
