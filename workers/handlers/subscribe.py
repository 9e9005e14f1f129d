"""SUBSCRIBE and UNSUBSCRIBE: filters checked here (syntax, ACL), answered by the router (SUBACK,
UNSUBACK), which owns the subscriptions."""

from __future__ import annotations

from typing import TYPE_CHECKING

from router import wire
from workers.mqtt import v4
from workers.mqtt.topics import valid_filter

if TYPE_CHECKING:
    from workers.connection import Connection


def handle_subscribe(conn: Connection, flags: int, body: bytes) -> None:
    packet_id, filters = v4.decode_subscribe(flags, body)
    checker = conn.checker
    wanted = [[f, qos if valid_filter(f) and (checker is None or checker.can_read(f)) else None]
              for f, qos in filters]
    if conn.subs is None:
        conn.subs = {}
    conn.subs.update((f, qos) for f, qos in wanted if qos is not None)
    conn.waiting += 1
    conn.worker.link.batch.add_json(wire.SUBSCRIBE, [conn.conn_id, packet_id, wanted])


def handle_unsubscribe(conn: Connection, flags: int, body: bytes) -> None:
    packet_id, filters = v4.decode_unsubscribe(flags, body)
    if conn.subs:
        for f in filters:
            conn.subs.pop(f, None)
    conn.waiting += 1
    conn.worker.link.batch.add_json(wire.UNSUBSCRIBE, [conn.conn_id, packet_id, filters])
