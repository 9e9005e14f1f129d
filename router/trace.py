"""Traces (the console's Trace page, router/console/trace.py): the messages of a topic filter watched
live (all publishers', or one client id's, username's or address's: WHO), bounded, never slowing the
broker; the last SAVED its reader took kept for a download.

Why the workers watch: most messages never reach the router (docs/architecture.md §4: a worker
delivers to its own subscribers itself while the route table gives no matching filter another place),
and a trace must not change that: it takes no place in the route table and nothing on the router's
routing path. The router keeps the traces here and tells every worker the whole set at each change
(`TRACES`, and to a worker that joins while any is live); each worker matches its clients' PUBLISHes
against the traces of their tenant and sends the router a copy of those it matches (`TRACED`), at most
workers/trace_watch.py's rate per trace on that worker, counting the rest, which its STATS carries
(`Traces.skipped`). A start is answered once every joined worker has acknowledged the set that holds
the trace (`TRACES_ACK`, `applied`), so that the trace sees every message its clients publish after the
answer. Messages the router originates itself (wills, $SYS) pass no worker's PUBLISH path: no trace sees them.

Bounds. The loop's part per copy is a count, and for at most RATE copies a second per trace (of all the
workers' together) an append to the trace's ring (a deque of RING entries, each payload cut to PAYLOAD
bytes by its worker). The console's threads drain the ring (`Trace.take`) and never wait on the loop for
it; the loop never waits on them. A trace nobody read for IDLE seconds, or older than LIFETIME, ends at
the loop's once-a-second `Traces.sweep`; at most MOST are live at once, and a tenant's admins start
at most TENANT_MOST of them (live in their tenant), so that one tenant cannot take them all from the
others; a broker admin may stop any.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from plexmq import wire
from plexmq.router.asks import Ask

if TYPE_CHECKING:
    from plexmq.router.core import Router
    from plexmq.router.tenants import Tenant

log = logging.getLogger("plexmq.router")

RING = 500  # messages a trace holds for its reader
PAYLOAD = wire.TRACED_PAYLOAD  # bytes of each payload kept (its worker cuts it)
RATE = 100  # messages a second a trace keeps; beyond, only counted (skipped)
IDLE = 30.0  # seconds a trace lives unread
LIFETIME = 600.0  # seconds a trace lives at most
MOST = 4  # live at once, in all
TENANT_MOST = 2  # of those, started by one tenant's admins: no tenant takes every one (the broker's admins: MOST)

SAVED = 5000  # messages a trace keeps for its download, once read (the last ones)
# whose messages a trace may be of besides its filter ("": every publisher's): the publisher whose client
# id or username is the value, or whose address (host:port) is it or is on that host (the workers judge:
# workers/trace_watch.py)
WHO = ("", "client_id", "username", "address")

# seq (1, 2 ... as kept), time.time(), topic, QoS, retain, payload size, payload (at most PAYLOAD bytes), client id
Entry = tuple[int, float, bytes, int, bool, int, bytes, str]


class Trace:
    """One live trace: its filter in its tenant, its ring and counts (written by the loop alone), and
    what its reader has taken (by the console's threads alone, under `reading`)."""

    __slots__ = ("id", "tenant", "filter", "by", "value", "user", "started", "read_at", "ring", "matched", "kept",
                 "skipped", "second", "taken", "reading", "next_seq", "lost", "saved")

    def __init__(self, number: int, tenant: Tenant, topic_filter: str, user: str, by: str = "", value: str = "") -> None:
        self.id = number
        self.tenant = tenant
        self.filter = topic_filter
        self.by = by  # of WHO: its messages are those of the publishers whose `by` is `value`
        self.value = value
        self.user = user  # who started it
        self.started = time.monotonic()
        self.read_at = self.started  # when its reader last took its ring (a console thread writes it)
        self.ring: deque[Entry] = deque(maxlen=RING)
        self.matched = 0  # messages its filter matched: the workers' copies and what they only counted
        self.kept = 0  # of those, put in the ring
        self.skipped = 0  # of those, over a worker's rate or RATE: only counted
        self.second = 0  # the second of time.monotonic() that `taken` counts in
        self.taken = 0
        self.reading = threading.Lock()  # between two reads of one trace; never taken by the loop
        self.next_seq = 1  # the next entry its reader expects
        self.lost = 0  # entries the ring let go before anyone read them
        self.saved: deque[Entry] = deque(maxlen=SAVED)  # what its reader took, for the download (console threads only)

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

    def skip(self, count: int) -> None:
        """`count` messages a worker matched and only counted (over its rate: STATS says so)."""
        self.matched += count
        self.skipped += count

    def keep(self, topic: bytes, payload: bytes, qos: int, retain: bool, size: int, client: str, at: float) -> None:
        """One message into the ring (the loop's thread): a full ring lets its oldest go."""
        self.kept += 1
        self.ring.append((self.kept, at, topic, qos, retain, size, payload[:PAYLOAD], client))

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
                self.saved.extend(taken)
            return taken

    def kept_for_download(self) -> list[Entry]:
        """The last SAVED entries its reader took (a console thread)."""
        with self.reading:
            return list(self.saved)


def see(trace: Trace, copy: wire.Traced, payload: bytes) -> None:
    """A worker's copy of a message into its trace, within RATE."""
    if trace.allow(1):
        trace.keep(copy.topic.encode(), payload, copy.qos, copy.retain, copy.size, copy.client, copy.at)


class TraceStart(Ask):
    """Start a trace of `topic_filter` (a valid, not shared, filter) in tenant `tenant`, of the publishers
    whose `by` (of WHO) is `value`, for `user`, one of that tenant's admins (`tenant_admin`) or the
    broker's; its answer: `trace`, or `refusal` with `status` (429: MOST are live, or a tenant admin's
    tenant has TENANT_MOST; 404: no such tenant)."""

    def __init__(self, topic_filter: str, tenant: str, user: str, tenant_admin: bool = False, by: str = "",
                 value: str = "") -> None:
        super().__init__()
        self.filter = topic_filter
        self.by = by
        self.value = value
        self.tenant = tenant
        self.user = user
        self.tenant_admin = tenant_admin
        self.trace: Trace | None = None
        self.refusal = ""
        self.status = ""
        self.gen = 0  # the generation of the set every joined worker must have acknowledged

    def start(self, router: Router) -> None:
        router.traces.begin(router, self)


class TraceStop(Ask):
    """Stop trace `number` (of tenant `scope` only, where set); its answer: `found`."""

    def __init__(self, number: int, scope: str | None) -> None:
        super().__init__()
        self.number = number
        self.scope = scope
        self.found: Trace | None = None

    def start(self, router: Router) -> None:
        trace = router.traces.find(self.number, self.scope)
        if trace is not None:
            self.found = trace
            router.traces.end(router, trace, "stopped")
        self.done.set()


class Traces:
    """The live traces, changed by the loop only. `live` is replaced whole at each change, so the
    console's threads read it (`find`, `visible`) without a lock and never see it change under them."""

    def __init__(self) -> None:
        self.live: dict[int, Trace] = {}
        self.starting: list[TraceStart] = []  # answered once every joined worker has the trace
        self.gen = 0  # of the set: one more at each change
        self.acked: dict[bytes, int] = {}  # each joined worker -> the generation of the set it applied
        self._numbers = itertools.count(1)

    def find(self, number: int, scope: str | None) -> Trace | None:
        """The live trace `number`, if it is of tenant `scope` (None: any tenant); any thread."""
        trace = self.live.get(number)
        return trace if trace is not None and (scope is None or trace.tenant.name == scope) else None

    def visible(self, scope: str | None) -> list[Trace]:
        """The live traces of tenant `scope` (None: every tenant's); any thread."""
        return [trace for trace in self.live.values() if scope is None or trace.tenant.name == scope]

    def begin(self, router: Router, start: TraceStart) -> None:
        """(the loop) A new trace, told to every worker."""
        if len(self.live) >= MOST:
            start.status, start.refusal = "429 Too Many Requests", f"{MOST} traces are live, the most at once: stop one first"
        elif start.tenant_admin and len(self.visible(start.tenant)) >= TENANT_MOST:
            start.status, start.refusal = ("429 Too Many Requests", f"tenant {start.tenant!r} has {TENANT_MOST} traces "
                                           "live, the most of one tenant's admins: stop one first")
        elif start.tenant not in router.tenants and start.tenant not in router.declared:
            start.status, start.refusal = "404 Not Found", f"no tenant {start.tenant!r}"
        if start.refusal:
            start.done.set()
            return
        trace = start.trace = Trace(next(self._numbers), router.tenant(start.tenant), start.filter, start.user, start.by,
                                    start.value)
        self.live = {**self.live, trace.id: trace}
        self._tell(router)
        start.gen = self.gen
        self.starting.append(start)
        self.applied()

    def end(self, router: Router, trace: Trace, why: str) -> None:
        """(the loop) A trace ends: the workers stop watching it."""
        self.live = {number: t for number, t in self.live.items() if t is not trace}
        self._tell(router)
        log.info("trace %d of %r in tenant %r (started by %r) ended: %s; %d messages matched, %d kept, %d skipped",
                 trace.id, trace.filter, trace.tenant.name, trace.user, why, trace.matched, trace.kept, trace.skipped)

    def _tell(self, router: Router) -> None:
        """The set changed: its next generation to every joined worker."""
        self.gen += 1
        entries = self._entries()
        for worker in self.acked:
            router.out(worker).traces(self.gen, entries)

    def _entries(self) -> list[list]:
        return [[trace.id, trace.tenant.name, trace.filter, trace.by, trace.value] for trace in self.live.values()]

    def hello(self, worker: bytes, out: Callable[[bytes], wire.ToWorker]) -> None:
        """(the loop) A worker joins (new, restarted, or again): it watches nothing until told (its
        `Worker.rejoin` forgot the set); told the set (into its batch, `out`) when any trace is live."""
        if self.live:
            self.acked[worker] = 0
            out(worker).traces(self.gen, self._entries())
        else:
            self.acked[worker] = self.gen

    def forget(self, worker: bytes) -> None:
        """(the loop) A worker whose frames went missing or that is taken for dead: nobody waits for it."""
        self.acked.pop(worker, None)

    def on_ack(self, worker: bytes, header: bytes, payload: bytes) -> None:
        """TRACES_ACK: the worker watches that generation's set."""
        if worker in self.acked:
            self.acked[worker] = wire.TracesAck.decode(header).gen
            if self.starting:
                self.applied()

    def on_traced(self, worker: bytes, header: bytes, payload: bytes) -> None:
        """TRACED: a worker's copy of a message, into its trace if that is still live."""
        copy = wire.Traced.decode(header)
        trace = self.live.get(copy.trace)
        if trace is not None:
            see(trace, copy, payload)

    def skipped(self, counts: list[list]) -> None:
        """(the loop) A worker's STATS: the messages it matched and only counted, per trace."""
        for number, count in counts:
            trace = self.live.get(number)
            if trace is not None:
                trace.skip(count)

    def applied(self) -> None:
        """(the loop) Answer the starts whose generation every joined worker has acknowledged; after each
        TRACES_ACK and each second (a worker taken for dead acknowledges nothing more)."""
        waiting = []
        for start in self.starting:
            if all(gen >= start.gen for gen in self.acked.values()):
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
            self.applied()
