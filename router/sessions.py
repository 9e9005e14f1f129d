"""Sessions the router keeps: who holds a client id, its subscriptions and its unacknowledged messages.

A clean session lives only while its connection does. A persistent one (clean session 0) outlives
it: its subscriptions stay in the trie and its QoS 1/2 messages wait here, numbered with the packet
id they will carry, so that a reconnect resends them with their original ids (MQTT-4.4.0-1).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Iterator

from plexmq.wire import ROUTER_PIDS_FROM

if TYPE_CHECKING:
    from plexmq.router.shared import SharedGroup

QUEUED = 0  # never sent to the client
SENT = 1  # sent, neither PUBACK nor PUBREC seen: resend with DUP
RELEASING = 2  # QoS 2, PUBREC seen: resend PUBREL

MAX_PACKET_ID = 65535


# a message a shared subscription gave a session: (the group, how many bytes of `props` are the
# message's own: the rest are this member's subscription identifier)
Share = tuple["SharedGroup", int]


class Pending:
    """One outgoing QoS 1/2 message of a persistent session (or a shared subscription's, of any
    session); `props` are its MQTT 5 properties as they travel (see plexmq/wire.py), `expires_at` the
    time.time() second it expires at (0: never)."""

    __slots__ = ("topic", "payload", "qos", "retain", "state", "props", "expires_at", "share")

    def __init__(self, topic: bytes, payload: bytes, qos: int, retain: bool, state: int, props: bytes = b"",
                 expires_at: int = 0, share: Share | None = None) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.state = state
        self.props = props
        self.expires_at = expires_at
        self.share = share


NEVER = 0xFFFFFFFF  # a session expiry interval that never ends (MQTT 5)
DEFAULT_EXPIRY = -1  # a 3.1/3.1.1 session: kept under persistent_client_expiration


class Will:
    """A connection's will; MQTT 5 adds its properties (as they travel, plexmq/wire.py), its message
    expiry interval (seconds, 0: none) and the delay before it is published (seconds)."""

    __slots__ = ("topic", "payload", "qos", "retain", "props", "expiry", "delay")

    def __init__(self, topic: bytes, payload: bytes, qos: int, retain: bool, props: bytes = b"", expiry: int = 0,
                 delay: int = 0) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.props = props
        self.expiry = expiry
        self.delay = delay


class Session:
    """A client id's state in the router; `worker` is None while a persistent session is offline."""

    __slots__ = ("client_id", "clean", "worker", "conn", "subs", "unacked", "queued", "inflight", "next_pid",
                 "incoming", "will", "will_at", "bytes", "seen", "expiry", "dropped", "dropped_logged", "local")

    def __init__(self, client_id: str, clean: bool) -> None:
        self.client_id = client_id
        self.clean = clean
        self.worker: bytes | None = None
        self.conn = 0
        self.subs: dict[str, int] = {}
        self.local: set[str] | tuple[()] = ()  # filters of `subs` its worker serves itself (router/routes.py)
        self.unacked: dict[int, Pending] = {}  # in the order kept
        # packet ids of QUEUED messages, oldest first; the empty tuple until one waits (most sessions
        # never queue, and an empty deque costs 760 bytes)
        self.queued: deque[int] | tuple[()] = ()
        self.inflight = 0  # SENT or RELEASING messages: the client's window is full at max_inflight
        self.next_pid = 1
        self.incoming: set[int] | tuple[()] = ()  # QoS 2 packet ids received and not yet released
        self.will: Will | None = None
        self.will_at = 0.0  # time.time() a delayed will is due (MQTT 5 will delay; 0: none waits)
        self.bytes = 0  # payload bytes of `unacked`
        self.seen = 0.0  # time.time() the connection ended (persistent sessions: for expiry)
        self.expiry = DEFAULT_EXPIRY  # seconds it outlives its connection (MQTT 5), NEVER, or DEFAULT_EXPIRY
        self.dropped = 0  # messages dropped because the queue was full (by count or by bytes)
        self.dropped_logged = 0.0  # time.monotonic() the drops were last logged

    def keep(self, topic: bytes, payload: bytes, qos: int, retain: bool, limit: int, max_bytes: int,
             window: int, props: bytes = b"", expiry: int = 0, share: Share | None = None) -> int:
        """Keep a QoS 1/2 message: its packet id when it may be sent now, 0 when it waits, -1 when dropped
        (the session holds `limit` messages already, or `max_bytes` of payload when that is not 0)."""
        unacked = self.unacked
        if len(unacked) >= limit or max_bytes and self.bytes + len(payload) > max_bytes:
            self.dropped += 1
            return -1
        self.bytes += len(payload)
        # a clean session's own ids are its worker's (plexmq/wire.py: ROUTER_PIDS_FROM)
        first = ROUTER_PIDS_FROM if self.clean else 1
        pid = max(self.next_pid, first)
        while pid in unacked:
            pid = pid + 1 if pid < MAX_PACKET_ID else first
        self.next_pid = pid + 1 if pid < MAX_PACKET_ID else first
        if self.worker is not None and self.inflight < window:
            unacked[pid] = Pending(topic, payload, qos, retain, SENT, props, expiry, share)
            self.inflight += 1
            return pid
        unacked[pid] = Pending(topic, payload, qos, retain, QUEUED, props, expiry, share)
        self.enqueue(pid)
        return 0

    def enqueue(self, pid: int) -> None:
        """Queue a kept message behind the others that wait for room in the client's window."""
        if not self.queued:
            self.queued = deque()
        self.queued.append(pid)  # type: ignore[union-attr]

    def receive(self, pid: int) -> bool:
        """QoS 2 from this client: whether `pid` is new (False: a resend before PUBREL)."""
        if pid in self.incoming:
            return False
        if not self.incoming:
            self.incoming = set()
        self.incoming.add(pid)  # type: ignore[union-attr]
        return True

    def released(self, pid: int) -> bool:
        """PUBREL from this client: whether `pid` was waiting for it."""
        if pid not in self.incoming:
            return False
        self.incoming.discard(pid)  # type: ignore[union-attr]
        return True

    def ends_at(self) -> float:
        """The time.time() an offline session with its own expiry interval ends (0: it has none)."""
        return self.seen + self.expiry if 0 < self.expiry < NEVER else 0.0

    def release(self, pid: int) -> None:
        """The client finished this message (PUBACK or PUBCOMP)."""
        pending = self.unacked.pop(pid, None)
        if pending is not None:
            self.bytes -= len(pending.payload)
            if pending.state != QUEUED:
                self.inflight -= 1

    def releasing(self, pid: int) -> bool:
        """QoS 2: the client has the message (PUBREC); only PUBREL remains, the payload can go."""
        pending = self.unacked.get(pid)
        if pending is None:
            return False
        pending.state = RELEASING
        self.bytes -= len(pending.payload)
        pending.payload = b""
        return True

    def ready(self, window: int) -> Iterator[tuple[int, Pending]]:
        """Queued messages that now fit in the client's window, marked SENT."""
        queued = self.queued
        while queued and self.inflight < window:
            pid = queued.popleft()  # type: ignore[union-attr]
            pending = self.unacked.get(pid)
            if pending is not None:
                pending.state = SENT
                self.inflight += 1
                yield pid, pending
        if not queued:
            self.queued = ()

    def in_flight(self) -> Iterator[tuple[int, Pending]]:
        """What was sent and not finished, for the resend after a reconnect; recounts the window."""
        self.inflight = 0
        for pid, pending in self.unacked.items():
            if pending.state != QUEUED:
                self.inflight += 1
                yield pid, pending
