"""One tenant's part of the router (docs/architecture.md, issue 23): its sessions, subscription trie,
retained messages, shared groups and match cache. Each tenant is a partition of its own, so a topic,
a client id or a `#` subscription never reaches across tenants, and nothing is prefixed with the
tenant's name. The default tenant ("") always exists; the router makes the others when a CONNECT or
the store names them.

Each tenant also holds its limits (plexmq/tenants.py, `apply`) and what they are judged against:
its live connections, a token bucket of CONNECTs, its subscriptions; a hit is counted in
`limit_hits` and logged at most once per `LOG_INTERVAL` per limit.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import TYPE_CHECKING

from plexmq import tenants
from plexmq.router.retain import RetainedStore, retained_size
from plexmq.trie import SubscriptionTrie

if TYPE_CHECKING:
    from plexmq.router.core import Targets
    from plexmq.router.sessions import Session
    from plexmq.router.shared import SharedGroup

log = logging.getLogger("plexmq.router")

LOG_INTERVAL = 10.0  # seconds between two log lines of one tenant's hits of one limit
UNLIMITED = tenants.Tenant(tenants.DEFAULT)  # the limits of a tenant that declares none


class Tenant:
    __slots__ = ("name", "sessions", "trie", "retained", "groups", "cache", "limit_hits", "limits", "limits_connects",
                 "limits_retained", "connections", "subscriptions", "tokens", "filled_at", "logged_at",
                 "received", "delivered")

    def __init__(self, name: str) -> None:
        self.name = name
        self.sessions: dict[str, Session] = {}  # client id -> its session
        self.trie = SubscriptionTrie()  # keys: Sessions and SharedGroups
        self.retained = RetainedStore()
        self.groups: dict[str, SharedGroup] = {}  # "$share/{name}/{filter}" -> its group
        self.cache: dict[bytes, Targets] = {}  # topic -> its cached match (Router._match)
        self.limit_hits: Counter[str] = Counter()  # limit name -> times the router refused or dropped for it
        self.limits = UNLIMITED
        self.limits_connects = False  # whether CONNECTs are judged (`limits.limits_connects`)
        self.limits_retained = False  # whether new retained messages are judged
        self.connections = 0  # live connections (Router.conn_tenants)
        self.subscriptions = 0  # of all its sessions
        self.tokens = 0.0  # CONNECTs the bucket allows now (max_connection_rate)
        self.filled_at = 0.0  # time.monotonic() the bucket was last filled
        self.logged_at: dict[str, float] = {}  # limit name -> time.monotonic() of its last log line
        # as the router's `received` and `delivered`, of this tenant's messages (metrics)
        self.received = 0
        self.delivered = 0

    def apply(self, limits: tenants.Tenant) -> None:
        """Take the tenant's declared limits (at start, and at a reload: a rate that did not change
        keeps its bucket as it is)."""
        if limits.max_connection_rate != self.limits.max_connection_rate:
            self.tokens = max(limits.max_connection_rate, 1.0)
            self.filled_at = time.monotonic()
        self.limits = limits
        self.limits_connects = limits.limits_connects
        self.limits_retained = bool(limits.max_retained_messages or limits.max_retained_bytes)

    def retained_limit(self, topic: bytes, payload: bytes, props: bytes) -> str | None:
        """The limit a new retained message on `topic` would pass (not kept), or None."""
        limits = self.limits
        return self.retained.refuses(topic.decode(), retained_size(topic, payload, props), limits.max_retained_messages,
                                     limits.max_retained_bytes)

    def take_token(self) -> bool:
        """A CONNECT may be accepted under max_connection_rate (a bucket of one second's worth, at
        least one): take its token; False when none is left."""
        rate = self.limits.max_connection_rate
        if not rate:
            return True
        now = time.monotonic()
        self.tokens = min(max(rate, 1.0), self.tokens + (now - self.filled_at) * rate)
        self.filled_at = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True

    def hit(self, limit: str) -> None:
        """The router refused or dropped something for one of this tenant's limits: counted, and said
        in the log at most once per LOG_INTERVAL."""
        self.limit_hits[limit] += 1
        now = time.monotonic()
        if now - self.logged_at.get(limit, -LOG_INTERVAL) >= LOG_INTERVAL:
            self.logged_at[limit] = now
            log.warning("tenant %s: %s %s reached (%d hits so far)", self.name, limit, getattr(self.limits, limit),
                        self.limit_hits[limit])
