"""Sessions the router keeps: who holds a client id, its subscriptions and its unacknowledged messages.

A clean session lives only while its connection does. A persistent one (clean session 0) outlives
it: its subscriptions stay in the trie and its QoS 1/2 messages wait here, numbered with the packet
id they will carry, so that a reconnect resends them with their original ids (MQTT-4.4.0-1).
"""

from __future__ import annotations

from collections import OrderedDict

QUEUED = 0  # never sent to the client
SENT = 1  # sent, neither PUBACK nor PUBREC seen: resend with DUP
RELEASING = 2  # QoS 2, PUBREC seen: resend PUBREL

MAX_PACKET_ID = 65535


class Pending:
    """One outgoing QoS 1/2 message of a persistent session."""

    __slots__ = ("topic", "payload", "qos", "state")

    def __init__(self, topic: bytes, payload: bytes, qos: int, state: int) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.state = state


class Will:
    __slots__ = ("topic", "payload", "qos", "retain")

    def __init__(self, topic: bytes, payload: bytes, qos: int, retain: bool) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain


class Session:
    """A client id's state in the router; `worker` is None while a persistent session is offline."""

    __slots__ = ("client_id", "clean", "worker", "conn", "subs", "unacked", "next_pid", "incoming", "will", "dropped")

    def __init__(self, client_id: str, clean: bool) -> None:
        self.client_id = client_id
        self.clean = clean
        self.worker: bytes | None = None
        self.conn = 0
        self.subs: dict[str, int] = {}
        self.unacked: OrderedDict[int, Pending] = OrderedDict()
        self.next_pid = 1
        self.incoming: set[int] = set()  # QoS 2 packet ids received and not yet released
        self.will: Will | None = None
        self.dropped = 0

    def add_pending(self, topic: bytes, payload: bytes, qos: int, state: int, limit: int) -> int:
        """Keep a QoS 1/2 message for this session; its packet id, or 0 when the session is full."""
        unacked = self.unacked
        if len(unacked) >= limit:
            self.dropped += 1
            return 0
        pid = self.next_pid
        while pid in unacked:
            pid = pid % MAX_PACKET_ID + 1
        self.next_pid = pid % MAX_PACKET_ID + 1
        unacked[pid] = Pending(topic, payload, qos, state)
        return pid
