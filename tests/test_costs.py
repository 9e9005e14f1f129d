"""Bounded cost per byte and per client: what one client can make the broker spend, against dedicated
brokers. A packet read in pieces costs its size (the partial packet is appended to, not joined
again on every read); a client holds at most max_subscriptions subscriptions."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

from plexmq.mqtt import v4 as p
from plexmq.mqtt import v5
from tests.conftest import Broker
from tests.mqtt import RawClient
from tests.steps import publish, subscribe, uid


def cpu_seconds(b: Broker, worker: int) -> float:
    times = b.workers()[worker].cpu_times()
    return times.user + times.system


def test_a_packet_read_in_pieces_costs_its_size(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    """16 MB in 4,000-byte pieces, each read by the worker on its own (a PINGREQ round trip on a
    second connection of the same worker follows each piece): ~4,200 reads, which cost ~0.1 s of the
    worker's CPU with their round trips. Joined again on every read, the partial packet was copied
    4,200 times, 35 GB in all: seconds."""
    size, piece = 16 << 20, 4000
    config = tmp_path / "plexmq.toml"
    config.write_text(f"max_packet_size = {size + 16}\n")
    b = start_broker("--workers", "1", "--config", str(config))
    barrier = RawClient(b.port)
    barrier.connect("pieces-barrier")
    c = RawClient(b.port)
    c.connect("pieces")
    c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # each piece its own segment
    packet = p.encode_publish(b"pieces", bytes(size), 1, packet_id=1)
    before = cpu_seconds(b, 0)
    for at in range(0, len(packet), piece):
        c.send(packet[at:at + piece])
        barrier.send(p.PINGREQ_PACKET)
        assert barrier.recv() == (0xD0, b"")
    assert c.recv(60) == (0x40, b"\x00\x01")
    spent = cpu_seconds(b, 0) - before
    assert spent < 1.0, f"the worker spent {spent:.2f} s of CPU reading one packet of {size} bytes"


def test_subscriptions_beyond_max_subscriptions_are_refused(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    """max_subscriptions = 3: a new filter beyond three is refused in the SUBACK (3.1.1: 0x80, 5.0:
    0x97) and delivers nothing; subscribing again to a filter held counts once; an UNSUBSCRIBE makes
    room."""
    config = tmp_path / "plexmq.toml"
    config.write_text("max_subscriptions = 3\n")
    b = start_broker("--workers", "1", "--config", str(config))
    c = RawClient(b.port)
    c.connect(f"subs-{uid()}")
    assert subscribe(c, 1, [("cap/a", 1), ("cap/b", 1)]) == [1, 1]
    assert subscribe(c, 2, [("cap/a", 0), ("cap/c", 1), ("cap/d", 1), ("cap/d", 1)]) == [0, 1, 0x80, 0x80]
    pub = RawClient(b.port)
    pub.connect(f"subs-pub-{uid()}")
    publish(pub, "cap/d", b"refused", 1)
    publish(pub, "cap/c", b"held", 1)
    first, body = c.recv()
    assert first >> 4 == p.PUBLISH and p.decode_publish(first & 15, body)[0] == "cap/c"
    c.send(p.encode_puback(p.decode_publish(first & 15, body)[1]))
    c.send(p.encode_unsubscribe(3, ["cap/c"]))
    assert c.recv() == (0xB0, b"\x00\x03")
    assert subscribe(c, 4, [("cap/d", 1)]) == [1]

    c5 = RawClient(b.port)
    c5.connect5(f"subs5-{uid()}")
    c5.send(v5.encode_subscribe(1, [("cap/a", 1), ("cap/b", 1), ("cap/c", 1), ("cap/d", 1)]))
    first, body = c5.recv()
    assert first == 0x90 and v5.decode_suback(v5.SUBACK, 0, body)[1] == [1, 1, 1, 0x97]
