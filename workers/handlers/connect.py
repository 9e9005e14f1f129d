"""CONNECT: the protocol level, the client id, the login (which may wait for a password check or a
database), the will against the ACL; then the session is claimed from the router, whose answer
(`Connection.session_ready`) sends the CONNACK."""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from typing import TYPE_CHECKING

from workers.auth import BAD_CREDENTIALS, NOT_AUTHORIZED, SERVER_UNAVAILABLE
from workers.mqtt import v4
from workers.states import AUTHENTICATING, CONNECTING

if TYPE_CHECKING:
    from workers.connection import Connection

log = logging.getLogger("plexmq.worker")

MQISDP_MAX_CLIENT_ID = 23  # MQTT 3.1 limits client ids to 23 characters


def handle_connect(conn: Connection, flags: int, body: bytes) -> None:
    """The first packet of a connection."""
    try:
        connect = v4.decode_connect(flags, body)
    except v4.UnsupportedProtocol as exc:
        return _unsupported(conn, exc.level)
    if connect.protocol_level == 5:
        return _unsupported(conn, 5)  # the codec reads 5.0; the broker does not speak it yet
    client_id = connect.client_id
    if not client_id:
        if not connect.clean_session or connect.protocol_level == 3:
            conn.write(v4.encode_connack(False, 0x02))
            return conn.close("empty client id without clean session")
        client_id = f"plexmq-{uuid.uuid4().hex}"
    elif connect.protocol_level == 3 and len(client_id) > MQISDP_MAX_CLIENT_ID:
        conn.write(v4.encode_connack(False, 0x02))
        return conn.close("MQTT 3.1 client id longer than 23 characters")
    conn.client_id = client_id
    conn.level = connect.protocol_level
    conn.username = connect.username
    auth = conn.worker.auth
    if conn.cert_username is not None:  # its certificate is its login (use_identity_as_username)
        conn.username = conn.cert_username
    elif auth.required:
        conn.state = AUTHENTICATING
        conn.transport.pause_reading()  # type: ignore[union-attr]
        host = conn.peer.rsplit(":", 1)[0]
        login = asyncio.ensure_future(auth.login(connect.username, connect.password, host))
        login.add_done_callback(lambda done: _logged_in(conn, done, connect))
        return
    _accept(conn, connect)


def _unsupported(conn: Connection, level: int) -> None:
    conn.write(v4.encode_connack(False, 0x01))  # [MQTT-3.1.2-2]
    conn.close(f"unsupported protocol level {level}")


def handle_second_connect(conn: Connection, flags: int, body: bytes) -> None:
    conn.close("second CONNECT")


def _logged_in(conn: Connection, login: asyncio.Future[tuple[int, str | None, float]], connect: v4.Connect) -> None:
    if conn.state != AUTHENTICATING:
        return  # closed while the password was checked
    if login.cancelled() or login.exception() is not None:
        log.error("client %s: cannot check the password: %s", conn.client_id, login.exception())
        conn.write(v4.encode_connack(False, SERVER_UNAVAILABLE))
        return conn.close("authentication failed")
    code, identity, expires = login.result()
    if code:
        conn.write(v4.encode_connack(False, code))
        return conn.close("bad user name or password" if code == BAD_CREDENTIALS else "not authorized")
    conn.username = identity
    if expires:
        conn.worker.end_at(expires, conn)
    _accept(conn, connect)
    conn.worker.flush_soon()  # the CONNECT record goes out at the end of this turn
    if conn.state == CONNECTING:
        conn.transport.resume_reading()  # type: ignore[union-attr]
        if conn.buf:
            conn.data_received(b"")


def _accept(conn: Connection, connect: v4.Connect) -> None:
    """Credentials accepted: check the will against the ACL, then claim the session."""
    worker = conn.worker
    checker = worker.auth.checker(conn.username, conn.client_id)
    if connect.will is not None and checker is not None and not checker.can_write(connect.will.topic):
        conn.write(v4.encode_connack(False, NOT_AUTHORIZED))
        return conn.close(f"will topic {connect.will.topic!r} not allowed")
    conn.checker = checker
    conn.fast = checker is None
    conn.persistent = not connect.clean_session
    conn.keepalive = connect.keepalive
    conn.deadline = worker.now() + connect.keepalive * 1.5 if connect.keepalive else math.inf
    worker.wheel.add(conn)  # the keepalive deadline may come before the CONNECT timeout
    conn.state = CONNECTING
    conn.will = connect.will
    conn.register(resume=False)
