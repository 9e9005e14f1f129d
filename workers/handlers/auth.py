"""AUTH: the client's steps of an enhanced authentication exchange (MQTT 5.0 section 4.12), with the
method its CONNECT named (`workers.auth.scram`). At CONNECT the exchange ends in the CONNACK (the
connect handler started it); a connected client may authenticate again (AUTH 0x19), which ends in
AUTH 0x00, or in DISCONNECT 0x87 and the connection closed."""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING

from plexmq.mqtt import properties as props
from plexmq.mqtt import reasons, v5
from plexmq.mqtt.framing import PROTOCOL_ERROR, MalformedPacket
from plexmq.workers.auth import scram
from plexmq.workers.handlers.connect import accept, challenge, client_address, fail_login, proves_its_tenant
from plexmq.workers.states import CHALLENGED, CONNECTED

if TYPE_CHECKING:
    from plexmq.workers.connection import Connection

log = logging.getLogger("plexmq.worker")


def handle_auth(conn: Connection, flags: int, body: bytes) -> None:
    negotiated = conn.v5
    if negotiated is None:
        return conn.close("packet type 15 not allowed from a client")
    code, properties = v5.decode_reason_only(v5.AUTH, flags, body, conn.worker.settings.max_user_properties)
    if not negotiated.auth_method:
        raise MalformedPacket("AUTH without an authentication method at CONNECT", PROTOCOL_ERROR)  # [MQTT-4.12.0-6]
    if properties[props.AUTHENTICATION_METHOD] != negotiated.auth_method:  # [MQTT-4.12.0-5], [MQTT-4.12.1-1]
        raise MalformedPacket("AUTH with another authentication method than CONNECT's", PROTOCOL_ERROR)
    data: bytes = properties.get(props.AUTHENTICATION_DATA, b"")  # type: ignore[assignment]  # binary
    exchange = negotiated.exchange
    if code == reasons.RE_AUTHENTICATE and exchange is None and conn.state == CONNECTED:
        try:
            challenge(conn, data, conn.username)  # as the same user, whose rules are taken anew when it succeeds
        except scram.Failed as failure:
            _reauthentication_failed(conn, failure)
        return
    if code != reasons.CONTINUE_AUTHENTICATION or exchange is None:
        raise MalformedPacket(f"AUTH {reasons.name(code)} out of turn", PROTOCOL_ERROR)
    try:
        server_final = exchange.final(data)
    except scram.Failed as failure:
        return fail_login(conn, failure) if conn.state == CHALLENGED else _reauthentication_failed(conn, failure)
    negotiated.exchange = None
    if conn.state == CHALLENGED:
        connect = negotiated.pending
        negotiated.pending = None
        negotiated.auth_data = server_final  # the CONNACK carries it
        if not proves_its_tenant(conn, exchange.username):
            return
        conn.username = exchange.username  # the name its tenant's logins know (conn.local_name already)
        accept(conn, connect)  # type: ignore[arg-type]  # pending since the CONNECT
    else:
        conn.send5(partial(v5.encode_auth, reasons.SUCCESS), {props.AUTHENTICATION_METHOD: negotiated.auth_method,
                                                               props.AUTHENTICATION_DATA: server_final})
        conn.take_rules(conn.worker.rules(conn))  # rights may have changed since
        log.debug("client %s re-authenticated as %r", conn.client_id, conn.username)


def _reauthentication_failed(conn: Connection, failure: scram.Failed) -> None:
    """DISCONNECT 0x87 (0x86 is not a DISCONNECT reason); the failure counts against the address,
    whose next CONNECT then waits."""
    conn.worker.auth.failed(client_address(conn))
    conn.close(f"re-authentication failed: {failure}", code=reasons.NOT_AUTHORIZED)
