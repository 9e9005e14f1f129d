"""PUBLISH from a client (all but the plain QoS 0 runs): checked against the ACL, then routed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers.mqtt import v4

if TYPE_CHECKING:
    from workers.connection import Connection


def handle_publish(conn: Connection, flags: int, body: bytes) -> None:
    topic, packet_id, payload = v4.decode_publish(flags, body)
    qos = (flags >> 1) & 3
    if conn.checker is not None and not conn.checker.can_write(topic):
        conn.worker.deny(conn, packet_id, qos)
    else:
        conn.worker.publish(conn, topic, packet_id, qos, bool(flags & 1), payload)
