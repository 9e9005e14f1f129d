"""PUBLISH from a client (all but the plain 3.1.1 QoS 0 runs, which `Connection.data_received`
forwards as they are): topic alias and flow control (5.0), the ACL and the `$` topics no client may
write (`acl.may_publish`), then routed. A QoS above its tenant's max_qos closes the connection (5.0: DISCONNECT
0x9B)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from plexmq.mqtt import properties as props
from plexmq.mqtt import reasons, v4, v5
from plexmq.mqtt.framing import PROTOCOL_ERROR, MalformedPacket
from plexmq.workers.auth.acl import may_publish
from plexmq.workers.states import CLOSED

if TYPE_CHECKING:
    from plexmq.workers.connection import Connection
    from plexmq.workers.negotiated import Negotiated


def handle_publish(conn: Connection, flags: int, body: bytes) -> None:
    qos = (flags >> 1) & 3
    limits = conn.limits
    if limits is not None and qos > limits.max_qos:  # what the CONNACK told a 5.0 client [MQTT-3.3.4-11]
        conn.worker.counters.limit_hit(conn.tenant, "max_qos")
        return conn.close(f"PUBLISH with QoS {qos} above its tenant's maximum QoS {limits.max_qos}",
                          code=reasons.QOS_NOT_SUPPORTED)
    negotiated = conn.v5
    carried, expiry = b"", 0
    if negotiated is None:
        topic, packet_id, payload = v4.decode_publish(flags, body)
    else:
        topic, packet_id, payload, properties = v5.decode_publish(flags, body, max_user=conn.worker.settings.max_user_properties)
        if properties:
            topic = _resolve_alias(negotiated, topic, properties)
        if qos == 2:
            if packet_id not in negotiated.releasing:  # not a resend before PUBREL
                negotiated.releasing.add(packet_id)
                _count_in(conn, negotiated)
        elif qos:
            negotiated.receiving += 1
            _count_in(conn, negotiated)
        if conn.state == CLOSED:  # over the Receive Maximum
            return
        if properties:
            if properties.get(props.PAYLOAD_FORMAT_INDICATOR) == 1 and not _is_utf8(payload):
                if not qos:
                    return conn.close("payload not UTF-8 as its format indicator says",
                                      code=reasons.PAYLOAD_FORMAT_INVALID)
                return conn.acknowledge(packet_id, qos, reasons.PAYLOAD_FORMAT_INVALID)
            carried, expiry = _carried(properties)
    if not may_publish(conn.checker, topic):
        conn.worker.deny(conn, packet_id, qos)
    else:
        conn.worker.publish(conn, topic, packet_id, qos, bool(flags & 1), payload, carried, expiry)


def _carried(properties: props.Properties) -> tuple[bytes, int]:
    """What of a PUBLISH's properties travels to its subscribers, byte for byte (plexmq/wire.py), and
    the time.time() second its message expiry interval ends (0: none; a second early at most)."""
    interval: int | None = properties.get(props.MESSAGE_EXPIRY_INTERVAL)  # type: ignore[assignment]  # a four-byte integer
    expiry = int(time.time()) + interval if interval is not None else 0
    return props.forwarded(properties), expiry


def _resolve_alias(negotiated: Negotiated, topic: str, properties: props.Properties) -> str:
    """The topic a PUBLISH names, through its topic alias: set by a topic, used by an empty one."""
    alias: int | None = properties.get(props.TOPIC_ALIAS)  # type: ignore[assignment]  # a two-byte integer
    if alias is None:
        return topic
    if alias > negotiated.alias_max:
        raise MalformedPacket(f"topic alias {alias} beyond the maximum {negotiated.alias_max}",
                              reasons.TOPIC_ALIAS_INVALID)
    if topic:
        negotiated.aliases[alias] = topic
        return topic
    known = negotiated.aliases.get(alias)
    if known is None:
        raise MalformedPacket(f"topic alias {alias} used before it was set", PROTOCOL_ERROR)
    return known


def _count_in(conn: Connection, negotiated: Negotiated) -> None:
    """The broker's Receive Maximum: more unacknowledged QoS 1/2 PUBLISHes is 0x93."""
    if negotiated.receiving + len(negotiated.releasing) > conn.worker.settings.receive_maximum:
        conn.close(f"more than {conn.worker.settings.receive_maximum} QoS 1/2 PUBLISHes unacknowledged",
                   code=reasons.RECEIVE_MAXIMUM_EXCEEDED)


def _is_utf8(payload: bytes) -> bool:
    try:
        payload.decode()
    except UnicodeDecodeError:
        return False
    return True
