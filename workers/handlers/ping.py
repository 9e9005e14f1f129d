"""PINGREQ and DISCONNECT: the packets without a body."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from workers.mqtt import v4

if TYPE_CHECKING:
    from workers.connection import Connection


def handle_pingreq(conn: Connection, flags: int, body: bytes) -> None:
    v4.decode_empty(flags, body)
    conn.write(v4.PINGRESP_PACKET)


def handle_disconnect(conn: Connection, flags: int, body: bytes) -> None:
    """A clean goodbye: no will."""
    v4.decode_empty(flags, body)
    conn.disconnected = True
    conn.close("client disconnected", level=logging.DEBUG)
