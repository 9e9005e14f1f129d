"""The console's clients page: a search through the connected clients (the admin listing,
router/listing.py) and a disconnect; a tenant admin finds and closes only the tenant's clients."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from plexmq.router import listing
from plexmq.router.console_http import Page, Reply, Routes

if TYPE_CHECKING:
    from plexmq.router.console import Console
    from plexmq.router.console_auth import Session

log = logging.getLogger("plexmq.router")


def clients(console: Console, environ: dict, session: Session) -> Reply:
    status, kind, body, _outcome = listing.answer_listing(console.asks, environ, session.tenant)
    return status, [("Content-Type", kind)], body


def disconnect(console: Console, environ: dict, session: Session) -> Reply:
    status, kind, body, outcome = listing.answer_disconnect(console.asks, environ, session.tenant)
    log.info("console: %r from %s: %s", session.user, environ.get("REMOTE_ADDR"), outcome)
    return status, [("Content-Type", kind)], body


PAGES: list[Page] = [("/clients", "Clients", "clients.html")]
ROUTES: Routes = {("GET", "/api/clients"): clients, ("POST", "/api/clients/disconnect"): disconnect}
