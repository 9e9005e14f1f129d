"""The console's live traces as a worker watches them (the router holds them: router/trace.py).

Why the worker: most messages never reach the router (docs/architecture.md §4: a worker delivers to its
own subscribers itself), so the worker that reads a PUBLISH is the one place that sees every message,
and watching there leaves each message's own path as it is (local delivery or the router). The router
tells every worker the live traces (`TRACES`, the whole set at each change: `watching` below); the
worker keeps them by tenant in `Worker.watching`, empty while no trace is live, so that a PUBLISH (or a
run of QoS 0 packets) costs one truthiness check then. With traces, `see` / `see_run` match the
PUBLISH's topic against the traces of its tenant (the answer cached per topic, at most CACHE topics per
tenant) and send the router a copy (`TRACED`, in the worker's batch of the turn) for as many as each
trace's token bucket on this worker lets through: RATE a second, BURST at once. Beyond it the worker only
counts; its next STATS carries the counts (`skipped`). A run of raw QoS 0 packets is parsed only as far
as the bucket lets copies out. The router keeps at most its own rate per trace of what all the
workers send (router/trace.py: `see`). A QoS 2 PUBLISH that a client sends again before its PUBREL is
copied again (the router, which keeps the incoming ids, routes it once).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from plexmq.mqtt import framing
from plexmq.mqtt.topics import matches

if TYPE_CHECKING:
    from plexmq.workers.connection import Connection
    from plexmq.workers.worker import Worker

RATE = 100.0  # copies a second per trace from this worker
BURST = 100.0  # copies at once per trace from this worker (the bucket's depth)
CACHE = 10_000  # topics whose matching traces a tenant's watch remembers


class Watched:
    """One trace on this worker: its filter, the publishers it is of (`by` and `value`: router/trace.py
    WHO), its token bucket, what it skipped since the last STATS."""

    __slots__ = ("id", "filter", "by", "value", "tokens", "at", "skipped")

    def __init__(self, number: int, topic_filter: str, by: str, value: str, now: float) -> None:
        self.id = number
        self.filter = topic_filter
        self.by = by  # "": every publisher
        self.value = value
        self.tokens = BURST
        self.at = now  # when `tokens` was last filled
        self.skipped = 0

    def of(self, conn: Connection) -> bool:
        """Whether `conn` is a publisher this trace is of: its client id or username is the value, or its
        address (host:port) is it or is on that host."""
        by = self.by
        if not by:
            return True
        if by == "client_id":
            return conn.client_id == self.value
        if by == "username":  # as the client gave it, or within its tenant (the tenant's part taken off)
            return self.value == conn.username or self.value == conn.local_name
        return conn.peer == self.value or conn.peer.rpartition(":")[0] == self.value

    def allow(self, count: int, now: float) -> int:
        """`count` messages matched at `now` (the loop's time): how many of them get a copy."""
        tokens = self.tokens + (now - self.at) * RATE
        self.tokens = tokens if tokens < BURST else BURST
        self.at = now
        room = int(self.tokens)
        kept = count if count < room else room
        self.tokens -= kept
        self.skipped += count - kept
        return kept


class TenantWatch:
    """The traces of one tenant, and per topic those that match it."""

    __slots__ = ("traces", "cache")

    def __init__(self, traces: list[Watched]) -> None:
        self.traces = traces
        self.cache: dict[bytes, tuple[Watched, ...]] = {}

    def match(self, topic: bytes) -> tuple[Watched, ...]:
        found = self.cache.get(topic)
        if found is None:
            cache = self.cache
            if len(cache) >= CACHE:
                cache.clear()
            name = topic.decode()
            found = cache[topic] = tuple(trace for trace in self.traces if matches(trace.filter, name))
        return found


Watching = dict[str, TenantWatch]  # tenant -> its traces; empty: no trace is live


def watching(entries: list[list], before: Watching, now: float) -> Watching:
    """The traces a TRACES record lists ([id, tenant, filter, by, value]), by tenant; one still live keeps
    its bucket and its count."""
    kept = {trace.id: trace for watch in before.values() for trace in watch.traces}
    by_tenant: dict[str, list[Watched]] = {}
    for number, tenant, topic_filter, by, value in entries:
        by_tenant.setdefault(tenant, []).append(kept.get(number) or Watched(number, topic_filter, by, value, now))
    return {tenant: TenantWatch(traces) for tenant, traces in by_tenant.items()}


def skipped(watch: Watching) -> list[list]:
    """[[trace id, messages skipped]] since the last call, for STATS; the counts start again."""
    counts = []
    for tenant in watch.values():
        for trace in tenant.traces:
            if trace.skipped:
                counts.append([trace.id, trace.skipped])
                trace.skipped = 0
    return counts


def see(worker: Worker, conn: Connection, topic: bytes, payload: bytes, qos: int, retain: bool) -> None:
    """A PUBLISH of `conn` (`Worker.publish`, while a trace is live): a copy for each of its tenant's
    traces that match its topic and have room."""
    watch = worker.watching.get(conn.tenant)
    if watch is None:
        return
    now = worker.loop.time()
    for trace in watch.match(topic):
        if trace.of(conn) and trace.allow(1, now):
            worker.link.traced(trace.id, topic, qos, retain, payload, conn.client_id, time.time())


def see_run(worker: Worker, conn: Connection, topic: bytes, count: int, packets: bytes, as_v5: bool) -> None:
    """A run of `count` raw QoS 0 PUBLISH packets of `conn` to `topic` (`Worker.publish_run`): only as
    many parsed as each trace has room for."""
    watch = worker.watching.get(conn.tenant)
    if watch is None:
        return
    now = worker.loop.time()
    body_at = 2 + len(topic) + as_v5  # the payload, after the topic (5.0: and the empty property block)
    for trace in watch.match(topic):
        if not trace.of(conn):
            continue
        pos = 0
        for _ in range(trace.allow(count, now)):
            _first, start, stop = framing.frame(packets, pos, 1 << 28)  # type: ignore[misc]  # whole packets: never None
            worker.link.traced(trace.id, topic, 0, False, packets[start + body_at:stop], conn.client_id, time.time())
            pos = stop
