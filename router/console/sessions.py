"""The console's sessions page: the persistent sessions that are offline (their queues, expiry and
subscriptions; removed by an operator as expiry would remove them, `Lifecycle.remove_session`), the
busiest subscription filters, the busiest topics and the shared subscription groups.

Each read is an ask (router/asks.py: `Paged`) answered at once on the router's loop, and each is
bounded: it scans at most SCAN sessions, filters or groups (`complete` says whether that was all of
them) and sorts only what one page shows. A tenant admin sees and removes only the tenant's (`session.tenant`),
a broker admin every tenant's or one (`tenant=NAME`, "" the default tenant).

The busiest topics are an estimate of messages per second, and why: most messages never reach the
router (a worker delivers them to its own subscribers, docs/architecture.md §4), so only the workers
see them all; counting every topic there would put a dict update on every PUBLISH, so each worker
counts its PUBLISHes down and tallies one in 64 (workers/topic_sample.py: one decrement and compare
per PUBLISH), sends its top few per tenant in its once-a-second STATS, and the router sums the last
seconds of them (router/topic_rates.py) and counts nothing itself, so no message is counted twice.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from typing import TYPE_CHECKING

from plexmq.router.asks import SCAN, Ask, Paged, ask
from plexmq.router.console.http import Page, Reply, Routes, json, json_body, query, text
from plexmq.router.ops import audit

if TYPE_CHECKING:
    from plexmq.router.console.app import Console
    from plexmq.router.console.auth import Session
    from plexmq.router.core import Router
    from plexmq.router.tenants import Tenant

log = logging.getLogger("plexmq.router")

PAGE = 100  # rows of a page unless asked for fewer (at most MAX_PAGE)
MAX_PAGE = 500
MAX_OFFSET = 10_000  # a page starts no further (the ask sorts offset + limit rows)
BUSIEST = 20  # filters and topics shown
MEMBERS = 50  # members shown per shared group


def _tenants(router: Router, tenant: str | None) -> list[Tenant]:
    """The tenants asked about: one (none when it does not exist) or every one."""
    if tenant is None:
        return list(router.tenants.values())
    found = router.tenants.get(tenant)
    return [] if found is None else [found]


class OfflineSessions(Paged):
    """Persistent sessions without a connection whose client id starts with `prefix`, by (tenant, client id):
    [client id, tenant, queued messages, their payload bytes, when it ends (time.time(), None: never),
    subscriptions]."""

    def __init__(self, tenant: str | None, prefix: str, offset: int, limit: int) -> None:
        super().__init__(tenant, offset, limit)
        self.prefix = prefix

    def start(self, router: Router) -> None:
        tenants = _tenants(router, self.tenant)
        sessions = self.scanned((s for t in tenants for s in t.sessions.values()), sum(len(t.sessions) for t in tenants))
        offline = [s for s in sessions if s.worker is None and s.persistent and s.client_id.startswith(self.prefix)]
        self.total = len(offline)
        page = heapq.nsmallest(self.offset + self.limit, offline, key=lambda s: (s.tenant, s.client_id))[self.offset:]
        self.rows = [[s.client_id, s.tenant, len(s.unacked), s.bytes, router.ends_at(s) or None, len(s.subs)]
                     for s in page]
        self.done.set()


class SharedGroups(Paged):
    """Shared subscription groups by (tenant, name, filter): {tenant, group, filter, strategy, members:
    [[client id, online]] (the first MEMBERS), count}."""

    def start(self, router: Router) -> None:
        tenants = _tenants(router, self.tenant)
        groups = list(self.scanned(((t.name, g) for t in tenants for g in t.groups.values()),
                                   sum(len(t.groups) for t in tenants)))
        self.total = len(groups)
        page = heapq.nsmallest(self.offset + self.limit, groups, key=lambda tg: (tg[0], tg[1].name, tg[1].filter))
        self.rows = [{"tenant": name, "group": g.name, "filter": g.filter, "strategy": g.strategy,
                      "members": [[m.client_id, m.worker is not None] for m in g.order[:MEMBERS]],
                      "count": len(g.order)} for name, g in page[self.offset:]]
        self.done.set()


class BusiestFilters(Ask):
    """The BUSIEST filters by subscribers (sessions, and each member of a shared group on the filter):
    [tenant, filter, subscribers]; `complete`: every filter was looked at (at most SCAN are)."""

    def __init__(self, tenant: str | None) -> None:
        super().__init__()
        self.tenant = tenant
        self.complete = True
        self.rows: list[list] = []

    def start(self, router: Router) -> None:
        counts: dict[tuple[str, str], int] = {}
        budget = SCAN
        for tenant in _tenants(router, self.tenant):
            if budget <= 0:
                self.complete = False
                break
            filters = dict(itertools.islice(tenant.trie.filters(), budget))
            groups = list(itertools.islice(tenant.groups.values(), budget))
            budget -= len(filters) + len(groups)
            for group in groups:  # a group is one key of its filter: its members are the subscribers
                if group.filter in filters:
                    filters[group.filter] += len(group.members) - 1
            counts.update(((tenant.name, f), n) for f, n in filters.items())
        self.rows = [[name, f, n] for (name, f), n in heapq.nlargest(BUSIEST, counts.items(), key=lambda item: item[1])]
        self.done.set()


class BusiestTopics(Ask):
    """The BUSIEST topics by estimated messages per second: [tenant, topic, rate] (router/topic_rates.py)."""

    def __init__(self, tenant: str | None) -> None:
        super().__init__()
        self.tenant = tenant
        self.rows: list[tuple[str, str, float]] = []

    def start(self, router: Router) -> None:
        self.rows = router.topic_rates.busiest(self.tenant, BUSIEST, time.monotonic())
        self.done.set()


class SessionRemoval(Ask):
    """Remove the offline persistent session `client_id` of `tenant`; `outcome`: "removed", "connected"
    (left alone) or "missing"."""

    def __init__(self, client_id: str, tenant: str) -> None:
        super().__init__()
        self.client_id = client_id
        self.tenant = tenant
        self.outcome = "missing"

    def start(self, router: Router) -> None:
        router.remove_session(self)


def _scope(environ: dict, session: Session) -> str | None:
    """The tenant a request may see: a tenant admin's own; a broker admin's `tenant=NAME`, else every one (None)."""
    if session.tenant is not None:
        return session.tenant
    return query(environ).get("tenant")


def _page(console: Console, asked: Paged) -> Reply:
    if not ask(console.asks, asked):
        return text("503 Service Unavailable", "the router did not answer in time")
    return json({"total": asked.total, "complete": asked.complete, "offset": asked.offset, "rows": asked.rows})


def _bounds(environ: dict) -> tuple[int, int] | None:
    """The page asked for (offset, limit), bounded; None when they are not numbers."""
    fields = query(environ)
    try:
        offset, limit = int(fields.get("offset") or 0), int(fields.get("limit") or PAGE)
    except ValueError:
        return None
    return min(max(offset, 0), MAX_OFFSET), min(max(limit, 1), MAX_PAGE)


def offline_sessions(console: Console, environ: dict, session: Session) -> Reply:
    """GET /api/sessions?prefix=ID&offset=N&limit=N[&tenant=NAME]"""
    bounds = _bounds(environ)
    if bounds is None:
        return text("400 Bad Request", "offset and limit are numbers")
    return _page(console, OfflineSessions(_scope(environ, session), query(environ).get("prefix", ""), *bounds))


def shared_groups(console: Console, environ: dict, session: Session) -> Reply:
    """GET /api/groups?offset=N&limit=N[&tenant=NAME]"""
    bounds = _bounds(environ)
    if bounds is None:
        return text("400 Bad Request", "offset and limit are numbers")
    return _page(console, SharedGroups(_scope(environ, session), *bounds))


def busiest_filters(console: Console, environ: dict, session: Session) -> Reply:
    """GET /api/filters[?tenant=NAME]"""
    asked = BusiestFilters(_scope(environ, session))
    if not ask(console.asks, asked):
        return text("503 Service Unavailable", "the router did not answer in time")
    return json({"complete": asked.complete, "rows": asked.rows})


def busiest_topics(console: Console, environ: dict, session: Session) -> Reply:
    """GET /api/topics[?tenant=NAME]: estimated messages per second."""
    asked = BusiestTopics(_scope(environ, session))
    if not ask(console.asks, asked):
        return text("503 Service Unavailable", "the router did not answer in time")
    return json({"rows": asked.rows})


def remove(console: Console, environ: dict, session: Session) -> Reply:
    """POST /api/sessions/remove, body {"client_id": ID, "tenant": NAME} (a tenant admin's own tenant
    whatever it names): 200 removed, 409 connected, 404 no such offline session."""
    body = json_body(environ)
    client_id = body.get("client_id") if isinstance(body, dict) else None
    tenant = body.get("tenant", "") if isinstance(body, dict) else None
    if not isinstance(client_id, str) or not isinstance(tenant, str):
        return text("400 Bad Request", 'the body is {"client_id": "ID", "tenant": "NAME"}')
    request = SessionRemoval(client_id, tenant if session.tenant is None else session.tenant)
    if not ask(console.asks, request):
        return text("503 Service Unavailable", "the router did not answer in time")
    who = f"{client_id} of tenant {request.tenant}" if request.tenant else client_id
    log.info("console: %r from %s: session %r: %s", session.user, environ.get("REMOTE_ADDR"), who, request.outcome)
    audit.record(console.asks, session.user, environ.get("REMOTE_ADDR", ""), audit.SESSION_REMOVE, request.tenant,
                 client_id, request.outcome)
    if request.outcome == "removed":
        return text("200 OK", f"removed the session of {who}")
    if request.outcome == "connected":
        return text("409 Conflict", f"{who} is connected: disconnect it first (Clients), then remove its session")
    return text("404 Not Found", f"{who} has no persistent session")


PAGES: list[Page] = [("/sessions", "Sessions", "sessions.html")]
ROUTES: Routes = {("GET", "/api/sessions"): offline_sessions, ("POST", "/api/sessions/remove"): remove,
                  ("GET", "/api/filters"): busiest_filters, ("GET", "/api/topics"): busiest_topics,
                  ("GET", "/api/groups"): shared_groups}
