"""The console's Bans page: the bans (router/bans.py), a page at a time, a new one with its reason and
how long it lasts, and lifting one. The same requests as the admin API's (`answer_*`), so both act
through `bans.ban` and `bans.unban`; a tenant admin sees, makes and lifts only the tenant's bans (the
broker-wide ones are the broker's admins'). Each action is logged with who asked."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from plexmq.router import bans
from plexmq.router.console.http import Page, Reply, Routes

if TYPE_CHECKING:
    from plexmq.router.console.app import Console
    from plexmq.router.console.auth import Session

log = logging.getLogger("plexmq.router")


def listing(console: Console, environ: dict, session: Session) -> Reply:
    """GET /api/bans?filter=TEXT&offset=N&limit=N[&tenant=NAME]."""
    status, kind, body, _outcome = bans.answer_bans(console.asks, environ, session.tenant)
    return status, [("Content-Type", kind)], body


def add(console: Console, environ: dict, session: Session) -> Reply:
    """POST /api/bans/add, the body of the admin API's /bans/add; the ban names who made it."""
    by = f"console: {session.user}" + ("" if session.tenant is None else f" (tenant {session.tenant})")
    status, kind, body, outcome = bans.answer_ban(console.asks, environ, by, session.tenant, session.user)
    log.info("console: %r from %s: %s", session.user, environ.get("REMOTE_ADDR"), outcome)
    return status, [("Content-Type", kind)], body


def remove(console: Console, environ: dict, session: Session) -> Reply:
    """POST /api/bans/remove, the body of the admin API's /bans/remove."""
    status, kind, body, outcome = bans.answer_unban(console.asks, environ, session.tenant, session.user)
    log.info("console: %r from %s: %s", session.user, environ.get("REMOTE_ADDR"), outcome)
    return status, [("Content-Type", kind)], body


PAGES: list[Page] = [("/bans", "Bans", "bans.html")]
ROUTES: Routes = {("GET", "/api/bans"): listing, ("POST", "/api/bans/add"): add, ("POST", "/api/bans/remove"): remove}
