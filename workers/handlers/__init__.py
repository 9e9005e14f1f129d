"""What a worker does with each packet a client sends, one module per packet (as mosquitto's
handle_*.c): `HANDLERS[kind](conn, flags, body)`. The plain QoS 0 PUBLISH runs never get here:
`Connection.data_received` forwards them to the router as they are."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from plexmq.mqtt import kinds
from plexmq.workers.handlers import acks, auth, connect, ping, publish, subscribe

if TYPE_CHECKING:
    from plexmq.workers.connection import Connection

Handler = Callable[["Connection", int, bytes], None]

HANDLERS: dict[int, Handler] = {
    kinds.CONNECT: connect.handle_second_connect,  # the first one goes to connect.handle_connect
    kinds.PUBLISH: publish.handle_publish,
    kinds.PUBACK: acks.handle_puback,
    kinds.PUBREC: acks.handle_pubrec,
    kinds.PUBREL: acks.handle_pubrel,
    kinds.PUBCOMP: acks.handle_pubcomp,
    kinds.SUBSCRIBE: subscribe.handle_subscribe,
    kinds.UNSUBSCRIBE: subscribe.handle_unsubscribe,
    kinds.PINGREQ: ping.handle_pingreq,
    kinds.DISCONNECT: ping.handle_disconnect,
    kinds.AUTH: auth.handle_auth,
}
