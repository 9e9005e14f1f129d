"""PUBACK, PUBREC, PUBREL and PUBCOMP from a client.

`conn.inflight` holds the stage of each delivery in flight to the client: 1 (QoS 1, awaiting PUBACK),
2 (QoS 2, awaiting PUBREC) or -2 (PUBREL sent, awaiting PUBCOMP); the connection's outbound half
(workers/outbound.py: `received`, `done`) moves it on. An acknowledgement of the wrong kind for an id
in flight is a protocol violation [MQTT-4.8.0-1]; one for an id not in flight is a late duplicate and
harmless (as EMQX treats it).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from plexmq.mqtt import reasons, v4, v5
from plexmq.mqtt.framing import PROTOCOL_ERROR

if TYPE_CHECKING:
    from plexmq.workers.connection import Connection

log = logging.getLogger("plexmq.worker")

_STAGES = {1: "a QoS 1 delivery", 2: "a QoS 2 delivery awaiting PUBREC", -2: "a QoS 2 delivery awaiting PUBCOMP"}


def _decode(conn: Connection, kind: int, flags: int, body: bytes) -> tuple[int, int]:
    """(packet id, reason code); 3.1.1 acks, and 5.0 ones that say success only, have no reason code: 0."""
    if conn.v5 is None or len(body) == 2:
        return v4.decode_packet_id(flags, body, 2 if kind == v4.PUBREL else 0), 0
    packet_id, code, _properties = v5.decode_ack(kind, flags, body, conn.worker.settings.max_user_properties)
    return packet_id, code


def handle_puback(conn: Connection, flags: int, body: bytes) -> None:
    _finished(conn, _decode(conn, v4.PUBACK, flags, body)[0], 1, "PUBACK")


def handle_pubcomp(conn: Connection, flags: int, body: bytes) -> None:
    _finished(conn, _decode(conn, v4.PUBCOMP, flags, body)[0], -2, "PUBCOMP")


def handle_pubrec(conn: Connection, flags: int, body: bytes) -> None:
    packet_id, code = _decode(conn, v4.PUBREC, flags, body)
    stage = conn.inflight.get(packet_id)
    if stage == 1:
        return _wrong(conn, "PUBREC", packet_id, stage)
    if code >= 0x80:  # 5.0: the client refused it; the flow ends without PUBREL [MQTT-4.3.3-4]
        if stage == 2:
            _finished(conn, packet_id, 2, "PUBREC")
        return
    if stage == 2:
        conn.received(packet_id)
    elif stage is None:
        log.debug("client %s: PUBREC for packet id %d, which is not in flight", conn.client_id, packet_id)
        if conn.v5 is not None:  # 5.0 says so in the PUBREL
            return conn.write(v5.encode_ack(v4.PUBREL, packet_id, reasons.PACKET_IDENTIFIER_NOT_FOUND))
    conn.write(v4.encode_pubrel(packet_id))


def handle_pubrel(conn: Connection, flags: int, body: bytes) -> None:
    """The client releases a QoS 2 message it sent: its id is forgotten (received exactly once), by the
    router if it took it (a persistent session's always do), else by the connection (`Worker.publish`)."""
    packet_id = _decode(conn, v4.PUBREL, flags, body)[0]
    if conn.v5 is not None:
        conn.v5.releasing.discard(packet_id)
    if conn.persistent or (conn.incoming is not None and conn.incoming.pop(packet_id, False)):
        conn.worker.link.rel(conn.conn_id, packet_id)
    conn.write(v4.encode_pubcomp(packet_id))


def _finished(conn: Connection, packet_id: int, expected: int, name: str) -> None:
    """PUBACK (expected stage 1) or PUBCOMP (-2): the delivery is done; the window has room again."""
    stage = conn.inflight.get(packet_id)
    if stage != expected:
        if stage is None:
            log.debug("client %s: %s for packet id %d, which is not in flight", conn.client_id, name, packet_id)
            return
        return _wrong(conn, name, packet_id, stage)
    conn.done(packet_id)


def _wrong(conn: Connection, name: str, packet_id: int, stage: int) -> None:
    """Close the client; its session keeps the message, which was never acknowledged."""
    conn.close(f"protocol violation: {name} for packet id {packet_id}, {_STAGES[stage]}", code=PROTOCOL_ERROR)
