"""Sessions the router keeps: who holds a client id, its subscriptions and its unacknowledged messages.

A clean session lives only while its connection does. A persistent one (clean session 0) outlives
it: its subscriptions stay in the trie and its QoS 1/2 messages wait in its outbox (its state is
here; router/outbox.py changes it), numbered with the packet id they will carry, so that a reconnect
resends them with their original ids (MQTT-4.4.0-1).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from plexmq.router.outbox import Pending


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

    __slots__ = ("client_id", "persistent", "worker", "conn_id", "subs", "unacked", "queued", "inflight", "window",
                 "next_pid", "incoming", "will", "will_at", "bytes", "seen", "expiry", "dropped", "dropped_logged", "local",
                 "tenant", "claimed")

    def __init__(self, client_id: str, persistent: bool, tenant: str = "") -> None:
        self.client_id = client_id
        self.tenant = tenant  # the name of its tenant (router/tenants.py): a client id is unique only there
        self.persistent = persistent  # it outlives its connection (3.1.1 clean session 0, 5.0 session expiry > 0)
        self.worker: bytes | None = None
        self.conn_id = 0
        self.claimed = 0  # when its connection claimed it, on its host's clock (plexmq/wire.py: Connect.claimed)
        self.subs: dict[str, int] = {}
        self.local: set[str] | tuple[()] = ()  # filters of `subs` its worker serves itself (router/routes.py)
        # its outbox, which router/outbox.py changes: QoS 1/2 messages by packet id, in the order kept
        self.unacked: dict[int, Pending] = {}
        # packet ids of QUEUED messages, oldest first; the empty tuple until one waits (most sessions
        # never queue, and an empty deque costs 760 bytes)
        self.queued: deque[int] | tuple[()] = ()
        self.inflight = 0  # SENT or RELEASING messages: the client's window is full at `window`
        # the most in flight to its connection, as its CONNECT said (plexmq/wire.py: Connect.window):
        # max_inflight, a 5.0 client's Receive Maximum below it, a bridge's own; 0: max_inflight
        self.window = 0
        self.next_pid = 1
        self.incoming: set[int] | tuple[()] = ()  # QoS 2 packet ids received and not yet released
        self.will: Will | None = None
        self.will_at = 0.0  # time.time() a delayed will is due (MQTT 5 will delay; 0: none waits)
        self.bytes = 0  # payload bytes of `unacked`
        self.seen = 0.0  # time.time() the connection ended (persistent sessions: for expiry)
        self.expiry = DEFAULT_EXPIRY  # seconds it outlives its connection (MQTT 5), NEVER, or DEFAULT_EXPIRY
        self.dropped = 0  # messages dropped because the queue was full (by count or by bytes)
        self.dropped_logged = 0.0  # time.monotonic() the drops were last logged

    def receive(self, pid: int) -> bool:
        """QoS 2 from this client: whether `pid` is new (False: a resend before PUBREL)."""
        if pid in self.incoming:
            return False
        if not self.incoming:
            self.incoming = set()
        self.incoming.add(pid)
        return True

    def released(self, pid: int) -> bool:
        """PUBREL from this client: whether `pid` was waiting for it."""
        if pid not in self.incoming:
            return False
        self.incoming.discard(pid)  # type: ignore[union-attr]  # holds pid: a set, not the empty tuple
        return True

    def ends_at(self) -> float:
        """The time.time() an offline session with its own expiry interval ends (0: it has none)."""
        return self.seen + self.expiry if 0 < self.expiry < NEVER else 0.0
