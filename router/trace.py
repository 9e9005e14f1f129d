"""Traces (the console's Trace page, router/console_trace.py): the messages of a topic filter watched
live, copied by the router as it routes them, bounded, never slowing the broker.

Why a filter with the router's place: most messages never reach the router (docs/architecture.md §4:
a worker delivers to its own subscribers itself while the route table gives no matching filter another
place). A trace is held in its tenant's trie as a key of its own with the router's place (`ROUTER`) in
the route table, as a persistent session's subscription is, so the table's next generation tells every
worker to send what the filter matches to the router. The router routes those messages to their
subscribers as it does any, each exactly once (a message takes one of the two paths), and copies each
into the trace on the way (`see`, `see_run`). The trace is no subscriber: nothing is delivered to it,
and `Targets.matched` leaves it out (a 5.0 publisher that only a trace matched still hears 0x10).
Ending a trace takes the place away again, and the filter's messages go back to local delivery
(`RouteTable` and the workers' `ROUTED` counts keep their order across the change, as for any
subscription that leaves). A start is answered once every worker has applied the generation that
carries the place (`applied`), so that the trace sees every message published after its answer.

Bounds. The loop's part per traced message is a count, and for at most RATE messages a second per
trace an append to the trace's ring (a deque of RING entries, each payload cut to PAYLOAD bytes); a
QoS 0 run is parsed only as far as the rate lets its messages in, the rest is only counted as skipped.
The console's threads drain the ring (`Trace.take`) and never wait on the loop for it; the loop never
waits on them. A trace nobody read for IDLE seconds, or older than LIFETIME, ends at the loop's
once-a-second `Traces.sweep`; at most MOST are live at once.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING

from plexmq.mqtt import framing
from plexmq.router.asks import Ask
from plexmq.router.routes import ROUTER, RouteTable

if TYPE_CHECKING:
    from plexmq.router.core import Router
    from plexmq.router.tenants import Tenant

log = logging.getLogger("plexmq.router")

RING = 500  # messages a trace holds for its reader
PAYLOAD = 1024  # bytes of each payload kept
RATE = 100  # messages a second a trace keeps; beyond, only counted (skipped)
IDLE = 30.0  # seconds a trace lives unread
LIFETIME = 600.0  # seconds a trace lives at most
MOST = 4  # live at once, in all

# seq (1, 2 ... as kept), time.time(), topic, QoS, retain, payload size, payload (at most PAYLOAD bytes), client id
Entry = tuple[int, float, bytes, int, bool, int, bytes, str]


class Trace:
    """One live trace: its filter in its tenant, its ring and counts (written by the loop alone), and
    what its reader has taken (by the console's threads alone, under `reading`)."""

    __slots__ = ("id", "tenant", "filter", "user", "started", "read_at", "ring", "matched", "kept", "skipped",
                 "second", "taken", "reading", "next_seq", "lost")

    def __init__(self, number: int, tenant: Tenant, topic_filter: str, user: str) -> None:
        self.id = number
        self.tenant = tenant
        self.filter = topic_filter
        self.user = user  # who started it
        self.started = time.monotonic()
        self.read_at = self.started  # when its reader last took its ring (a console thread writes it)
        self.ring: deque[Entry] = deque(maxlen=RING)
        self.matched = 0  # messages routed that its filter matched
        self.kept = 0  # of those, put in the ring
        self.skipped = 0  # of those, over RATE: only counted
        self.second = 0  # the second of time.monotonic() that `taken` counts in
        self.taken = 0
        self.reading = threading.Lock()  # between two reads of one trace; never taken by the loop
        self.next_seq = 1  # the next entry its reader expects
        self.lost = 0  # entries the ring let go before anyone read them

    def allow(self, count: int) -> int:
        """`count` messages matched now: how many of them may be kept (the loop's thread)."""
        self.matched += count
        second = int(time.monotonic())
        if second != self.second:
            self.second = second
            self.taken = 0
        room = RATE - self.taken
        kept = count if count < room else room
        self.taken += kept
        self.skipped += count - kept
        return kept

    def keep(self, topic: bytes, payload: bytes, qos: int, retain: bool, client: str) -> None:
        """One message into the ring (the loop's thread): a full ring lets its oldest go."""
        self.kept += 1
        self.ring.append((self.kept, time.time(), topic, qos, retain, len(payload), payload[:PAYLOAD], client))

    def take(self) -> list[Entry]:
        """The entries kept since the last take (a console thread); counts what the ring let go unread,
        and that the trace is being read. Only pops: the loop's appends go on meanwhile."""
        with self.reading:
            self.read_at = time.monotonic()
            ring = self.ring
            taken = [ring.popleft() for _ in range(len(ring))]  # the ring only grows meanwhile
            if taken:
                self.lost += taken[0][0] - self.next_seq
                self.next_seq = taken[-1][0] + 1
            return taken


def see(traces: list[Trace], topic: bytes, payload: bytes, qos: int, retain: bool, client: str) -> None:
    """A message the router routes, into every trace that matched it."""
    for trace in traces:
        if trace.allow(1):
            trace.keep(topic, payload, qos, retain, client)


def see_run(traces: list[Trace], topic: bytes, packets: bytes, count: int, body_at: int, client: str) -> None:
    """A run of `count` raw QoS 0 PUBLISH packets to `topic` (each payload `body_at` bytes into its body):
    only as many parsed as each trace keeps."""
    for trace in traces:
        pos = 0
        for _ in range(trace.allow(count)):
            _first, start, stop = framing.frame(packets, pos, 1 << 28)  # type: ignore[misc]  # whole packets: never None
            trace.keep(topic, packets[start + body_at:stop], 0, False, client)
            pos = stop


class TraceStart(Ask):
    """Start a trace of `topic_filter` (a valid, not shared, filter) in tenant `tenant`; its answer: `trace`,
    or `refusal` with `status` (429: MOST are live; 404: no such tenant)."""

    def __init__(self, topic_filter: str, tenant: str, user: str) -> None:
        super().__init__()
        self.filter = topic_filter
        self.tenant = tenant
        self.user = user
        self.trace: Trace | None = None
        self.refusal = ""
        self.status = ""
        self.gen = 0  # the route table's generation every worker must have applied

    def start(self, router: Router) -> None:
        router.traces.begin(router, self)


class TraceStop(Ask):
    """Stop trace `number` (of tenant `scope` only, where set); its answer: `found`, and `router_place`:
    whether the filter keeps the router's place for another subscription (else its messages go back
    to local delivery)."""

    def __init__(self, number: int, scope: str | None) -> None:
        super().__init__()
        self.number = number
        self.scope = scope
        self.found: Trace | None = None
        self.router_place = False

    def start(self, router: Router) -> None:
        trace = router.traces.find(self.number, self.scope)
        if trace is not None:
            self.found = trace
            router.traces.end(router, trace, "stopped")
            self.router_place = router.routes.serves(trace.tenant.name, trace.filter, ROUTER)
        self.done.set()


class Traces:
    """The live traces, changed by the loop only. `live` is replaced whole at each change, so the
    console's threads read it (`find`, `visible`) without a lock and never see it change under them."""

    def __init__(self) -> None:
        self.live: dict[int, Trace] = {}
        self.starting: list[TraceStart] = []  # answered once every worker has the trace's place
        self._numbers = itertools.count(1)

    def find(self, number: int, scope: str | None) -> Trace | None:
        """The live trace `number`, if it is of tenant `scope` (None: any tenant); any thread."""
        trace = self.live.get(number)
        return trace if trace is not None and (scope is None or trace.tenant.name == scope) else None

    def visible(self, scope: str | None) -> list[Trace]:
        """The live traces of tenant `scope` (None: every tenant's); any thread."""
        return [trace for trace in self.live.values() if scope is None or trace.tenant.name == scope]

    def begin(self, router: Router, start: TraceStart) -> None:
        """(the loop) A new trace: its filter into the tenant's trie with the router's place."""
        if len(self.live) >= MOST:
            start.status, start.refusal = "429 Too Many Requests", f"{MOST} traces are live, the most at once: stop one first"
        elif start.tenant not in router.tenants and start.tenant not in router.declared:
            start.status, start.refusal = "404 Not Found", f"no tenant {start.tenant!r}"
        if start.refusal:
            start.done.set()
            return
        tenant = router.tenant(start.tenant)
        trace = start.trace = Trace(next(self._numbers), tenant, start.filter, start.user)
        tenant.trie.add(trace.filter, trace, 0)
        routes = router.routes
        routes.add(tenant.name, trace.filter, ROUTER)
        tenant.cache.clear()
        self.live = {**self.live, trace.id: trace}
        start.gen = routes.gen + 1 if routes.changed else routes.gen  # this turn's changes go as the next one
        self.starting.append(start)
        self.applied(routes)

    def end(self, router: Router, trace: Trace, why: str) -> None:
        """(the loop) A trace ends: its filter leaves the trie and gives up the router's place."""
        tenant = trace.tenant
        tenant.trie.remove(trace.filter, trace)
        router.routes.remove(tenant.name, trace.filter, ROUTER)
        tenant.cache.clear()
        self.live = {number: t for number, t in self.live.items() if t is not trace}
        log.info("trace %d of %r in tenant %r (started by %r) ended: %s; %d messages matched, %d kept, %d skipped",
                 trace.id, trace.filter, tenant.name, trace.user, why, trace.matched, trace.kept, trace.skipped)

    def applied(self, routes: RouteTable) -> None:
        """(the loop) Answer the starts whose generation every worker has applied; after each
        ROUTES_ACK and each second (a worker taken for dead acknowledges nothing more)."""
        waiting = []
        for start in self.starting:
            if all(gen >= start.gen for gen in routes.acked.values()):
                start.done.set()
            elif not start.done.is_set():  # else its thread stopped waiting (ASK_WAIT)
                waiting.append(start)
        self.starting = waiting

    def sweep(self, router: Router, now: float) -> None:
        """(the loop, once a second) End the traces left unread for IDLE, older than LIFETIME, or whose
        tenant a reload removed."""
        for trace in list(self.live.values()):
            if now - trace.read_at > IDLE:
                self.end(router, trace, f"not read for {IDLE:.0f} s")
            elif now - trace.started > LIFETIME:
                self.end(router, trace, f"{LIFETIME:.0f} s passed")
            elif router.tenants.get(trace.tenant.name) is not trace.tenant:
                self.end(router, trace, "its tenant was removed")
        if self.starting:
            self.applied(router.routes)
