"""End to end: PUBLISH at every QoS through the real broker, across workers."""

from __future__ import annotations

import pytest

from plexmq.mqtt import v4 as p
from tests.conftest import Broker
from tests.mqtt import Client, RawClient


@pytest.mark.parametrize("pub_qos", [0, 1, 2])
@pytest.mark.parametrize("sub_qos", [0, 1, 2])
def test_delivered_qos_is_min_of_published_and_granted(broker: Broker, pub_qos: int, sub_qos: int) -> None:
    topic = f"pubsub/min/{pub_qos}/{sub_qos}"
    sub = Client(broker.port)
    assert sub.subscribe(topic, sub_qos) == [sub_qos]
    pub = Client(broker.port)
    pub.publish(topic, b"payload", pub_qos)
    msg = sub.get()
    assert (msg.topic, msg.payload, msg.qos, msg.retain) == (topic, b"payload", min(pub_qos, sub_qos), False)
    pub.disconnect()
    sub.disconnect()


def test_message_crosses_workers(broker: Broker) -> None:
    """Publisher and subscriber held by different worker processes (checked in /proc)."""
    pub = RawClient(broker.port)
    pub.connect("cross-pub")
    pub_worker = broker.worker_of(pub.local_port)
    subs: list[RawClient] = []
    while not subs or broker.worker_of(subs[-1].local_port) == pub_worker:
        assert len(subs) < 16, "the acceptor put 16 connections in a row on one of two workers"
        subs.append(RawClient(broker.port))
        subs[-1].connect(f"cross-sub-{len(subs)}")
    sub = subs[-1]
    sub.send(p.encode_subscribe(1, [("cross/t", 1)]))
    assert sub.recv() == (0x90, b"\x00\x01\x01")
    pub.send(p.encode_publish(b"cross/t", b"hi", 1, packet_id=7))
    assert pub.recv() == (0x40, b"\x00\x07")  # PUBACK once routed
    first, body = sub.recv()
    assert first == 0x32
    topic, packet_id, payload = p.decode_publish(first & 15, body)
    assert (topic, payload) == ("cross/t", b"hi")
    sub.send(p.encode_puback(packet_id))
    for c in [pub, *subs]:
        c.close()
