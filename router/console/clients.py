"""The console's clients page: a search through the connected clients (the admin listing,
router/listing.py) and a disconnect; and a client's own page: its connection as its worker lists it
(an exact id match), and its session as the router holds it (subscriptions with their options, and a
persistent session's outbox, offline too). A tenant admin finds, sees and closes only the tenant's
clients."""

from __future__ import annotations

import logging
from itertools import islice
from typing import TYPE_CHECKING

from plexmq import grants
from plexmq.router import listing
from plexmq.router.asks import Ask, ask
from plexmq.router.console.http import Page, Reply, Routes, json, query, scope, text

if TYPE_CHECKING:
    from plexmq.router.console.app import Console
    from plexmq.router.console.auth import Session
    from plexmq.router.core import Router

log = logging.getLogger("plexmq.router")

SUBSCRIPTIONS_MOST = 1000  # of one session's subscriptions, those a client's page shows (copied on the loop)


class ClientSession(Ask):
    """What the router holds of a client id's session in a tenant; `found`: whether there is one."""

    def __init__(self, client_id: str, tenant: str) -> None:
        super().__init__()
        self.client_id = client_id
        self.tenant = tenant
        self.found = False
        self.facts: dict[str, object] = {}
        self.subscriptions: list[tuple[str, int]] = []  # (filter, grant), at most SUBSCRIPTIONS_MOST

    def start(self, router: Router) -> None:
        tenant = router.tenants.get(self.tenant)
        session = tenant.sessions.get(self.client_id) if tenant is not None else None
        if session is not None:
            self.found = True
            online = session.worker is not None
            # the router's outbox: a persistent session's QoS 1/2 messages (a clean one's are its worker's)
            self.facts = {"persistent": session.persistent, "online": online, "offline_since": None if online else session.seen,
                          "ends_at": session.ends_at(), "unacknowledged": len(session.unacked),
                          "queued": len(session.queued), "subscription_count": len(session.subs)}
            self.subscriptions = list(islice(session.subs.items(), SUBSCRIPTIONS_MOST))
        self.done.set()


def clients(console: Console, environ: dict, session: Session) -> Reply:
    status, kind, body, _outcome = listing.answer_listing(console.asks, environ, session.tenant)
    return status, [("Content-Type", kind)], body


def client(console: Console, environ: dict, session: Session) -> Reply:
    """GET /api/client?id=ID[&tenant=NAME]: the client's connection (None when not connected) and its
    session (None when it has none); 404 when it has neither."""
    asked = query(environ)
    client_id, tenant = asked.get("id", ""), scope(session, asked.get("tenant", "")) or ""
    if not client_id:
        return text("400 Bad Request", "which client? (id=ID)")
    connections = listing.ClientListing(client_id, tenant, exact=True, most=1)
    complete = ask(console.asks, connections)
    row = connections.clients[0] if connections.clients else None
    held = ClientSession(client_id, tenant)
    ask(console.asks, held)
    subscriptions = [{"filter": topic_filter, "qos": grant & 3, "no_local": bool(grant & grants.NO_LOCAL),
                      "retain_as_published": bool(grant & grants.RETAIN_AS_PUBLISHED),
                      "retain_handling": (grant & grants.RETAIN_HANDLING) >> 4, "identifier": grant >> grants.ID_SHIFT}
                     for topic_filter, grant in sorted(held.subscriptions)]
    body = {"client_id": client_id, "tenant": tenant, "complete": complete,
            "connection": None if row is None else dict(zip(listing.FIELDS, row, strict=True)),
            "session": {**held.facts, "subscriptions": subscriptions} if held.found else None}
    return json(body, "200 OK" if row is not None or held.found else "404 Not Found")


def disconnect(console: Console, environ: dict, session: Session) -> Reply:
    status, kind, body, outcome = listing.answer_disconnect(console.asks, environ, session.tenant, session.user)
    log.info("console: %r from %s: %s", session.user, environ.get("REMOTE_ADDR"), outcome)
    return status, [("Content-Type", kind)], body


PAGES: list[Page] = [("/clients", "Clients", "clients.html"), ("/client", "", "client.html")]
ROUTES: Routes = {("GET", "/api/clients"): clients, ("GET", "/api/client"): client,
                  ("POST", "/api/clients/disconnect"): disconnect}
