"""A tenant's limits as one worker applies them (issue 23): its packet size, QoS, session expiry,
subscription and queue caps, and its share of the tenant's inbound rates.

A connection finds its tenant's `Limits` once, at CONNECT (`Worker.tenant_limits`), and keeps it; a
tenant that sets none gets None, so that its connections (and the default tenant's) pay one `is None`
per read and nothing per packet. The rates are the whole tenant's: each worker of this host holds its
clients to an equal share (rate / workers), in one pair of buckets that all of them draw from here, so
that one noisy client of the tenant slows its own tenant and no other.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from dataclasses import fields
from typing import TYPE_CHECKING

from plexmq.tenants import WORKER_LIMITS, Tenant
from plexmq.workers.settings import Settings

if TYPE_CHECKING:
    from plexmq.workers.connection import Connection

BATCH = 0.05  # seconds' worth of a rate a throttled client waits for (`pause`)
TICK = 0.001  # seconds: what the event loop's clock and timers count in (uvloop: libuv's milliseconds)
# what sets no limit; max_queued_messages caps the router's queues too (ROUTER_LIMITS) and a worker's here
_NONE = {field.name: field.default for field in fields(Tenant) if field.name in (*WORKER_LIMITS, "max_queued_messages")}


class Limits:
    """The effective limits of one tenant on this worker, and what is left of its rate buckets."""
    __slots__ = ("tenant", "max_packet_size", "max_qos", "max_session_expiry", "max_subscriptions", "capped_subscriptions",
                 "max_queued", "message_rate", "byte_rate", "rated", "credit_messages", "credit_bytes", "credit_at",
                 "waiting", "timed")

    def __init__(self, tenant: Tenant, settings: Settings) -> None:
        self.tenant = tenant.name
        self.credit_messages = self.credit_bytes = self.credit_at = 0.0  # the first read finds them full
        # its connections here that wait for the buckets, in turn, and whether the one timer that ends
        # the wait is set: a thousand throttled clients cost one wake-up per refill, not a thousand
        self.waiting: deque[Connection] = deque()
        self.timed = False
        self.apply(tenant, settings)

    def apply(self, tenant: Tenant, settings: Settings) -> None:
        """Take the tenant's (and the broker's) values; a reload calls this for live connections too. The
        buckets keep what they hold (no more than their new size at the next read)."""
        self.max_packet_size = min(tenant.max_packet_size or settings.max_packet_size, settings.max_packet_size)
        self.max_qos = tenant.max_qos
        self.max_session_expiry = tenant.max_session_expiry  # 0: none
        self.capped_subscriptions = bool(tenant.max_subscriptions_per_client)
        self.max_subscriptions = tenant.max_subscriptions_per_client or settings.max_subscriptions
        self.max_queued = tenant.max_queued_messages or settings.max_queued  # a clean session's queue here
        self.message_rate = tenant.message_rate / settings.workers  # 0: none
        self.byte_rate = tenant.byte_rate / settings.workers
        self.rated = bool(self.message_rate or self.byte_rate)

    def allowance(self, now: float, end: int) -> tuple[int, int]:
        """Refill the buckets (each holds one second's worth of the share): how far into a read of `end`
        bytes the tenant's share lets it go, and how many PUBLISH packets it may take."""
        elapsed = now - self.credit_at if self.credit_at else math.inf
        self.credit_at = now
        limit = max_published = end
        rate = self.message_rate
        if rate:
            self.credit_messages = refill(self.credit_messages, elapsed, rate)
            max_published = int(self.credit_messages)
        rate = self.byte_rate
        if rate:
            self.credit_bytes = refill(self.credit_bytes, elapsed, rate)
            limit = min(end, int(self.credit_bytes))  # a packet that starts within it is read whole
        return limit, max_published

    def charge(self, published: int, consumed: int) -> tuple[float, str]:
        """Take what a read used: the seconds to stop reading for (`pause`; 0: none), and the limit that
        makes it wait ("": none)."""
        wait, limit = 0.0, ""
        rate = self.message_rate
        if rate:
            self.credit_messages -= published
            wait = pause(self.credit_messages, rate)
            limit = "message_rate"
        rate = self.byte_rate
        if rate:
            self.credit_bytes -= consumed
            byte_wait = pause(self.credit_bytes, rate)
            if byte_wait > wait:
                wait, limit = byte_wait, "byte_rate"
        return (wait, limit) if wait > 0 else (0.0, "")

    def hold(self, conn: Connection, wait: float, loop: asyncio.AbstractEventLoop) -> None:
        """`conn` (not reading) waits its turn: the buckets can pay for the next packet in `wait` s."""
        self.waiting.append(conn)
        if not self.timed:
            self.timed = True
            loop.call_later(wait, self._release)

    def _release(self) -> None:
        """Read the waiting connections again, first in line first, until one of them empties the buckets
        (it waits again, at the back) or none is left."""
        self.timed = False
        waiting = self.waiting
        while waiting and not self.timed:
            waiting.popleft().refilled()


def limited(tenant: Tenant) -> bool:
    """Whether the tenant sets any limit a worker judges."""
    return any(getattr(tenant, key) != none for key, none in _NONE.items())


def pause(credit: float, rate: float) -> float:
    """Seconds a reader of a bucket of `rate` that holds `credit` stops reading for: 0 while it can pay for
    one more packet, else until it holds a batch (BATCH seconds' worth, one packet at least), so that a
    client held at its rate is read once per batch, not once per packet (issue 34: one wake-up and one
    router batch per packet cost 6-21x the CPU of an unthrottled message). One TICK more: the loop's
    clock and timers count whole milliseconds, and a timer that fired a little early found the bucket
    still short and paused again, thousands of times a second."""
    return 0.0 if credit >= 1.0 else (max(rate * BATCH, 1.0) - credit) / rate + TICK


def refill(credit: float, elapsed: float, rate: float) -> float:
    """A rate bucket `elapsed` seconds on: it holds one second's worth (one packet at least)."""
    return min(credit + elapsed * rate, max(rate, 1.0))
