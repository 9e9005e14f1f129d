"""A fake worker on a running broker's router endpoint: a ZeroMQ DEALER that speaks the link
(plexmq/wire.py) as a worker would, for the tests of the router's side of it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import zmq

from plexmq import wire
from tests.conftest import Broker, wait_for


def router_endpoint(b: Broker) -> str:
    """The endpoint the broker's router says it listens on."""
    found = wait_for(lambda: re.search(r"router listening on (\S+)", b.output()), 10, "the router's endpoint in its log")
    return found.group(1)


def hello(worker_id: int, node: str = "", protocol: int = wire.PROTOCOL) -> tuple[int, bytes]:
    """The HELLO record of a worker with no live connections."""
    return wire.HELLO, wire.Hello(protocol, worker_id, node, "", 1, []).encode()


class LinkPeer:
    def __init__(self, sock: zmq.Socket) -> None:
        self.sock = sock

    def send(self, seq: int, *records: tuple[int, bytes]) -> None:
        """One frame of (kind, header) records, as frame `seq` of join 1."""
        batch = wire.Batch()
        for kind, header in records:
            batch.add(kind, header)
        self.sock.send_multipart((wire.LINK.pack(1, seq), batch.take()))

    def frame(self, wait: float) -> bytes | None:
        """The router's next frame of records, or None after `wait` seconds."""
        return self.sock.recv_multipart()[1] if self.sock.poll(int(wait * 1000)) else None

    def kinds(self, wait: float) -> list[int]:
        """The kinds of the records of the router's next frame; the test fails after `wait` seconds."""
        frame = self.frame(wait)
        assert frame is not None, f"the router sent nothing in {wait} s"
        return [kind for kind, _header, _payload in wire.records(frame)]


@contextmanager
def link_peer(endpoint: str, identity: bytes, curve: tuple[bytes, bytes, bytes] | None = None) -> Iterator[LinkPeer]:
    """A DEALER with this identity connected to `endpoint` (curve: server public, client public,
    client secret; None: plain), closed at the end."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IPV6, 1)
        sock.setsockopt(zmq.IDENTITY, identity)
        if curve is not None:
            sock.setsockopt(zmq.CURVE_SERVERKEY, curve[0])
            sock.setsockopt(zmq.CURVE_PUBLICKEY, curve[1])
            sock.setsockopt(zmq.CURVE_SECRETKEY, curve[2])
        sock.connect(endpoint)
        yield LinkPeer(sock)
    finally:
        sock.close()
        ctx.term()
