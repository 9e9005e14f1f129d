"""PINGREQ and DISCONNECT: the packets that keep or end a connection."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from plexmq.mqtt import properties as props
from plexmq.mqtt import reasons, v4, v5
from plexmq.mqtt.framing import PROTOCOL_ERROR, MalformedPacket

if TYPE_CHECKING:
    from plexmq.workers.connection import Connection


def handle_pingreq(conn: Connection, flags: int, body: bytes) -> None:
    v4.decode_empty(flags, body)
    conn.write(v4.PINGRESP_PACKET)


def handle_disconnect(conn: Connection, flags: int, body: bytes) -> None:
    """A goodbye: no will, unless a 5.0 client asks for it (0x04). A 5.0 client may also end its
    session here (session expiry 0), but not start one it did not ask for at CONNECT [MQTT-3.14.2-2]."""
    negotiated = conn.v5
    if negotiated is None:
        v4.decode_empty(flags, body)
        conn.disconnected = True
        return conn.close("client disconnected")
    code, properties = v5.decode_reason_only(v5.DISCONNECT, flags, body, conn.worker.settings.max_user_properties)
    expiry = cast(int | None, properties.get(props.SESSION_EXPIRY_INTERVAL))  # a Four Byte Integer property
    if expiry is not None:
        if expiry and not negotiated.session_expiry:
            raise MalformedPacket("session expiry set at DISCONNECT after 0 at CONNECT", PROTOCOL_ERROR)
        limits = conn.limits
        if limits is not None and limits.max_session_expiry and expiry > limits.max_session_expiry:
            expiry = limits.max_session_expiry  # its tenant's cap
            conn.worker.counters.limit_hit(conn.tenant, "max_session_expiry")
        if negotiated.session_expiry:  # 0 ends the session with the connection, else how long it outlives it
            conn.worker.link.session_expiry(conn.conn_id, expiry)
    conn.disconnected = code != reasons.DISCONNECT_WITH_WILL
    conn.close(f"client disconnected ({reasons.name(code)})")
