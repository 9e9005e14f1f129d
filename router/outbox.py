"""A session's outbox: its outgoing QoS 1/2 messages, kept and numbered by the router, sent as the
client's window allows, sent again after a reconnect, finished by the client's acknowledgements.

A persistent session (and any session, for what a shared subscription gave it: that can go to another
member) keeps each QoS 1/2 message here under the packet id it will carry, so that a reconnect sends
it again with its original id (MQTT-4.4.0-1). The state is the session's (`Session.unacked`, `queued`,
`inflight`, `next_pid`, `bytes`); the router's one `Outbox` holds the limits and makes every change to
it, each journaled (router/store/journal.py) where it happens. The worker's half of the same window is
`workers/outbound.py` (and `workers/handlers/acks.py`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from plexmq import wire
from plexmq.router.message import Message

if TYPE_CHECKING:
    from plexmq.router.sessions import Session
    from plexmq.router.shared import SharedGroup
    from plexmq.router.store.journal import Journal
    from plexmq.router.tenants import Tenant

log = logging.getLogger("plexmq.router")

QUEUED = 0  # never sent to the client
SENT = 1  # sent, neither PUBACK nor PUBREC seen: resend with DUP
RELEASING = 2  # QoS 2, PUBREC seen: resend PUBREL

MAX_PACKET_ID = 65535

_pack_sub = wire.SUBSCRIBER.pack

# a message a shared subscription gave a session: (the group, how many bytes of `props` are the
# message's own: the rest are this member's subscription identifier)
Share = tuple["SharedGroup", int]


class Pending(Message):
    """A message in a session's outbox: its state, and the shared subscription that gave it."""

    __slots__ = ("state", "share")

    def __init__(self, topic: bytes, payload: bytes, qos: int, retain: bool, props: bytes = b"",
                 expires_at: int = 0, share: Share | None = None) -> None:
        Message.__init__(self, topic, payload, qos, retain, props, expires_at)
        self.state = QUEUED
        self.share = share


class Outbox:
    """Every session's outbox, under the broker's limits: `window` messages in flight to a client
    (max_inflight; a session whose CONNECT said a window of its own, `Session.window`, has that one),
    `max_queued` kept beyond its window (max_queued_messages), `max_bytes` of payload (max_queued_bytes,
    0: no limit); `dropped` counts what a full outbox refused. A tenant with a max_queued_messages of
    its own is in `capped`: its sessions keep that many beyond their window."""

    __slots__ = ("journal", "window", "max_queued", "max_bytes", "dropped", "capped")

    def __init__(self, journal: Journal, window: int, max_queued: int, max_bytes: int) -> None:
        self.journal = journal
        self.window = window
        self.max_queued = max_queued
        self.max_bytes = max_bytes
        self.dropped = 0
        self.capped: dict[str, Tenant] = {}  # tenant name -> the tenant, where it sets max_queued_messages

    def keep(self, session: Session, message: Pending) -> int:
        """Keep a QoS 1/2 message: its packet id when it may be sent now, 0 when it waits for room in
        the client's window (or for the client), -1 when dropped (the outbox is full)."""
        unacked = session.unacked
        window = session.window or self.window
        capped = self.capped
        tenant = capped.get(session.tenant) if capped else None
        limit = window + (self.max_queued if tenant is None else tenant.limits.max_queued_messages)
        if len(unacked) >= limit or self.max_bytes and session.bytes + len(message.payload) > self.max_bytes:
            if tenant is not None and len(unacked) >= limit:
                tenant.hit("max_queued_messages")
            session.dropped += 1
            self.dropped += 1
            _log_drops(session)
            return -1
        session.bytes += len(message.payload)
        # a clean session's own ids are its worker's (plexmq/wire.py: ROUTER_PIDS_FROM)
        first = 1 if session.persistent else wire.ROUTER_PIDS_FROM
        pid = max(session.next_pid, first)
        while pid in unacked:
            pid = pid + 1 if pid < MAX_PACKET_ID else first
        session.next_pid = pid + 1 if pid < MAX_PACKET_ID else first
        unacked[pid] = message
        if session.worker is not None and session.inflight < window:
            message.state = SENT
            session.inflight += 1
            self.journal.message_kept(session, pid, message)
            return pid
        _enqueue(session, pid)
        self.journal.message_kept(session, pid, message)
        return 0

    def resend(self, session: Session, out: wire.ToWorker) -> None:
        """A present session's new connection: what was sent and not finished goes again, in order,
        with its original id (the window recounted), then what waited, as far as the window allows."""
        session.inflight = 0
        for pid, message in session.unacked.items():
            if message.state == QUEUED:
                continue
            session.inflight += 1
            if message.state == RELEASING:
                out.resend_rel(session.conn_id, pid)
            else:
                _send(session, out, pid, message, dup=True)
        self.send_ready(session, out)

    def send_ready(self, session: Session, out: wire.ToWorker) -> None:
        """Send what waited for room in the session's window; what expired while it waited goes
        (a message whose onward delivery has not started is deleted at its expiry, MQTT 5)."""
        journal = self.journal
        window = session.window or self.window
        unacked = session.unacked
        now = time.time()
        while True:
            expired = []
            queued = session.queued
            while queued and session.inflight < window:
                pid = queued.popleft()
                message = unacked.get(pid)
                if message is None:
                    continue
                message.state = SENT
                session.inflight += 1
                if message.expires_at and message.expires_at <= now:
                    expired.append(pid)
                    continue
                journal.message_sent(session, pid)
                _send(session, out, pid, message, dup=False)
            if not queued:
                session.queued = ()
            if not expired:
                return
            for pid in expired:  # each took a place in the window: give it back, then look again
                self.done(session, pid)

    def done(self, session: Session, pid: int) -> None:
        """The message leaves the outbox: the client finished it (PUBACK or PUBCOMP), it expired
        while queued, or another member of its shared subscription took it."""
        message = session.unacked.pop(pid, None)
        if message is not None:
            session.bytes -= len(message.payload)
            if message.state != QUEUED:
                session.inflight -= 1
        self.journal.message_done(session, pid)

    def received(self, session: Session, pid: int) -> None:
        """QoS 2: the client has the message (PUBREC); only PUBREL remains, the payload can go."""
        message = session.unacked.get(pid)
        if message is None:
            return
        message.state = RELEASING
        session.bytes -= len(message.payload)
        message.payload = b""
        self.journal.message_received(session, pid)

    def reshare(self, session: Session, share: Callable[..., bool]) -> None:
        """The session's connection ended: what shared subscriptions gave it and it has not yet
        acknowledged (PUBREC counts: the client has it) goes to another member, an online one unless
        the session is clean (its copy would be lost), through `share` (`Router._share`: false when
        no member takes it); what no member takes stays."""
        moving = [(pid, message) for pid, message in session.unacked.items()
                  if message.share is not None and message.state != RELEASING]
        for pid, message in moving:
            group, own = message.share  # type: ignore[misc]  # `moving` holds shared ones only
            if share(group, message.topic, message.payload, message.qos, message.retain, message.props[:own],
                     message.expires_at, exclude=session, online_only=session.persistent):
                self.done(session, pid)


def _send(session: Session, out: wire.ToWorker, pid: int, message: Message, dup: bool) -> None:
    """A kept message to its session's connection, under its packet id."""
    out.deliver(wire.deliver_head(message.topic, message.qos, message.retain, dup, message.props, message.expires_at),
                _pack_sub(session.conn_id, message.qos, pid), message.payload)


def restore(session: Session, pid: int, message: Pending, state: int) -> None:
    """A stored message back in its session's order, in its state (a restarted router,
    router/store/__init__.py); the next new packet id follows the newest."""
    message.state = state
    session.unacked[pid] = message
    session.bytes += len(message.payload)
    if message.state == QUEUED:
        _enqueue(session, pid)
    session.next_pid = pid % MAX_PACKET_ID + 1


def _enqueue(session: Session, pid: int) -> None:
    """Queue a kept message behind the others that wait for room in the client's window."""
    if not session.queued:
        session.queued = deque()
    session.queued.append(pid)


def _log_drops(session: Session) -> None:
    now = time.monotonic()
    if now - session.dropped_logged >= 60.0:
        session.dropped_logged = now
        log.warning("client %s: queue full, dropping messages (%d so far)", session.client_id, session.dropped)
