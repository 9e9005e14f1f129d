"""The console's subscriptions page: every session's subscriptions (the router's sessions hold them,
shared ones as `$share/GROUP/FILTER`), found by a part of the filter and of the client id, a page at a
time, by filter or by client. A tenant admin sees the tenant's only; a broker admin every tenant's or
one (`tenant=NAME`). Bounded as the sessions page is (router/console/sessions.py): one ask scans at most
SCAN sessions and sorts only what the page needs."""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from plexmq.router.asks import Paged
from plexmq.router.console.http import Page, Reply, Routes, query, text
from plexmq.router.console.sessions import _bounds, _page, _scope, _tenants

if TYPE_CHECKING:
    from plexmq.router.console.app import Console
    from plexmq.router.console.auth import Session
    from plexmq.router.core import Router

ORDERS = ("filter", "client")  # a page's order: (tenant, filter, client id) or (tenant, client id, filter)


class Subscriptions(Paged):
    """The subscriptions whose filter contains `part` and whose client id contains `client`:
    [tenant, client id, filter, QoS, online, persistent]."""

    def __init__(self, tenant: str | None, part: str, client: str, by_client: bool, offset: int, limit: int) -> None:
        super().__init__(tenant, offset, limit)
        self.part = part
        self.client = client
        self.by_client = by_client

    def start(self, router: Router) -> None:
        tenants = _tenants(router, self.tenant)
        sessions = self.scanned((s for t in tenants for s in t.sessions.values()), sum(len(t.sessions) for t in tenants))
        part, client = self.part, self.client
        found = [(s.tenant, s.client_id, f, grant, s) for s in sessions if client in s.client_id
                 for f, grant in s.subs.items() if part in f]
        self.total = len(found)
        key = (lambda row: (row[0], row[1], row[2])) if self.by_client else (lambda row: (row[0], row[2], row[1]))
        page = heapq.nsmallest(self.offset + self.limit, found, key=key)[self.offset:]
        self.rows = [[tenant, client_id, f, grant & 3, s.worker is not None, s.persistent]
                     for tenant, client_id, f, grant, s in page]
        self.done.set()


def subscriptions(console: Console, environ: dict, session: Session) -> Reply:
    """GET /api/subscriptions?filter=PART&client=PART&order=filter|client&offset=N&limit=N[&tenant=NAME]"""
    bounds, asked = _bounds(environ), query(environ)
    order = asked.get("order", "filter")
    if bounds is None or order not in ORDERS:
        return text("400 Bad Request", "offset and limit are numbers; order is filter or client")
    return _page(console, Subscriptions(_scope(environ, session), asked.get("filter", ""), asked.get("client", ""),
                                        order == "client", *bounds))


PAGES: list[Page] = [("/subscriptions", "Subscriptions", "subscriptions.html")]
ROUTES: Routes = {("GET", "/api/subscriptions"): subscriptions}
