"""End to end: retained messages (MQTT 3.1.1 section 3.3.1.3) through the real broker, on raw sockets.

Absences are checked with a SUBSCRIBE barrier, never a sleep: the router answers a SUBSCRIBE after the
retained messages of the filters before it and after every PUBLISH it routed earlier, and the worker
writes what it got first.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import NamedTuple

import pytest

from tests.conftest import Broker, wait_for
from tests.mqtt import RawClient
from workers import packets as p

BARRIER_PID = 0xBEEF


class Pub(NamedTuple):
    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    packet_id: int


def uid() -> str:
    return uuid.uuid4().hex[:10]


def connect(port: int, client_id: str | None = None, clean: bool = True) -> RawClient:
    c = RawClient(port)
    _present, rc = c.connect(client_id or f"c-{uid()}", clean)
    assert rc == 0
    return c


def as_pub(first: int, body: bytes) -> Pub:
    topic, packet_id, payload = p.decode_publish(first & 15, body)
    return Pub(topic, payload, (first >> 1) & 3, bool(first & 1), bool(first & 8), packet_id)


def read_until(c: RawClient, stop: Callable[[int, bytes], bool], ack: bool = True) -> list[Pub]:
    """The PUBLISHes that arrive before the packet `stop` accepts.

    With `ack`, QoS 1 gets PUBACK and QoS 2 gets PUBREC, and the QoS 2 flows are completed (PUBREL
    answered with PUBCOMP) before returning, so that no PUBREL is left for the next read.
    """
    pubs = []
    releasing: set[int] = set()
    stopped = False
    while not stopped or releasing:
        first, body = c.recv()
        if not stopped and stop(first, body):
            stopped = True
        elif first >> 4 == p.PUBLISH:
            pub = as_pub(first, body)
            pubs.append(pub)
            if ack and pub.qos == 1:
                c.send(p.encode_puback(pub.packet_id))
            elif ack and pub.qos == 2:
                c.send(p.encode_pubrec(pub.packet_id))
                releasing.add(pub.packet_id)
        elif first == 0x62 and ack:
            packet_id = p.decode_packet_id(2, body, 2)
            assert packet_id in releasing, f"PUBREL for {packet_id}, not awaited"
            releasing.discard(packet_id)
            c.send(p.encode_pubcomp(packet_id))
        else:
            raise AssertionError(f"unexpected packet {first:#x} {body!r}")
    return pubs


def subscribe(c: RawClient, packet_id: int, filters: list[tuple[str, int]]) -> list[int]:
    """SUBSCRIBE and the SUBACK's return codes (no PUBLISH may come first)."""
    c.send(p.encode_subscribe(packet_id, filters))
    first, body = c.recv()
    assert first == 0x90, f"expected SUBACK, got {first:#x}"
    got_pid, codes = p.decode_suback(0, body)
    assert got_pid == packet_id
    return codes


def sync(c: RawClient, ack: bool = True) -> list[Pub]:
    """Every PUBLISH the broker routed to `c` before now (see the module docstring).

    With `ack`, also what the acknowledgements release from the queue beyond the inflight window:
    PINGREQ rounds until one brings nothing (the worker writes what an ack released before PINGRESP).
    """
    c.send(p.encode_subscribe(BARRIER_PID, [(f"barrier/{uid()}", 0)]))
    got = read_until(c, lambda first, body: first == 0x90 and body[:2] == BARRIER_PID.to_bytes(2, "big"), ack)
    while ack:
        c.send(p.PINGREQ_PACKET)
        more = read_until(c, lambda first, body: first == 0xD0, ack)
        if not more:
            break
        got += more
    return got


def publish(c: RawClient, topic: str, payload: bytes, qos: int = 0, retain: bool = False, packet_id: int = 1) -> None:
    """PUBLISH from a client that subscribes to nothing, and complete its QoS flow."""
    c.send(p.encode_publish(topic.encode(), payload, qos, retain, packet_id=packet_id if qos else 0))
    pid = packet_id.to_bytes(2, "big")
    if qos == 1:
        assert c.recv() == (0x40, pid)
    elif qos == 2:
        assert c.recv() == (0x50, pid)
        c.send(p.encode_pubrel(packet_id))
        assert c.recv() == (0x70, pid)


def worker_of(broker: Broker, c: RawClient) -> int:
    def look() -> tuple[int] | None:
        try:
            return (broker.worker_of(c.local_port),)
        except AssertionError:
            return None
    return wait_for(look, 5, "the socket to reach a worker")[0]  # type: ignore[index]



def retain(pub: RawClient, topic: str, payload: bytes, qos: int) -> None:
    """Set (or with b"" clear) the retained message of `topic`; routed once this returns."""
    publish(pub, topic, payload, qos, retain=True)
    if qos == 0:  # the router has taken a QoS 0 PUBLISH once it has routed a later QoS 1 of the same client
        publish(pub, f"retained-fence/{uid()}", b"", 1)


@pytest.mark.parametrize(("msg_qos", "sub_qos"), [(0, 2), (1, 2), (2, 2), (2, 1), (2, 0), (1, 0)])
def test_retained_is_sent_after_suback_with_retain_1_at_min_qos(broker: Broker, msg_qos: int, sub_qos: int) -> None:
    topic = f"ret/min/{uid()}"
    pub = connect(broker.port)
    retain(pub, topic, b"kept", msg_qos)
    sub = connect(broker.port)
    sub.send(p.encode_subscribe(0x0A0B, [(topic, sub_qos)]))
    assert sub.recv() == (0x90, bytes([0x0A, 0x0B, sub_qos]))  # SUBACK first, then the retained PUBLISH
    first, body = sub.recv()
    qos = min(msg_qos, sub_qos)
    assert first == 0x30 | qos << 1 | 1  # retain=1, DUP=0
    m = as_pub(first, body)
    assert (m.topic, m.payload) == (topic, b"kept")
    if qos == 1:
        sub.send(p.encode_puback(m.packet_id))
    elif qos == 2:
        sub.send(p.encode_pubrec(m.packet_id))
        assert sub.recv() == (0x62, m.packet_id.to_bytes(2, "big"))
        sub.send(p.encode_pubcomp(m.packet_id))
    assert sync(sub) == []
    retain(pub, topic, b"", 0)
    sub.close()
    pub.close()


def test_retained_is_replaced_by_a_newer_one(broker: Broker) -> None:
    topic = f"ret/replace/{uid()}"
    pub = connect(broker.port)
    retain(pub, topic, b"v1", 1)
    retain(pub, topic, b"v2", 0)
    sub = connect(broker.port)
    assert subscribe(sub, 1, [(topic, 1)]) == [1]
    assert [(m.topic, m.payload, m.qos, m.retain) for m in sync(sub)] == [(topic, b"v2", 0, True)]
    retain(pub, topic, b"", 0)
    sub.close()
    pub.close()


def test_empty_retained_payload_clears_it(broker: Broker) -> None:
    topic = f"ret/clear/{uid()}"
    pub = connect(broker.port)
    retain(pub, topic, b"v1", 1)
    first = connect(broker.port)
    assert subscribe(first, 1, [(topic, 1)]) == [1]
    assert [(m.payload, m.retain) for m in sync(first)] == [(b"v1", True)]
    retain(pub, topic, b"", 1)
    # the clearing message itself reaches the live subscriber as an ordinary (retain=0) message
    assert [(m.payload, m.retain) for m in sync(first)] == [(b"", False)]
    sub = connect(broker.port)
    assert subscribe(sub, 1, [(topic, 1), (f"{topic}/#", 1)]) == [1, 1]
    assert sync(sub) == []
    for c in (first, sub, pub):
        c.close()


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_retained_is_forwarded_to_live_subscribers_with_retain_0(broker: Broker, qos: int) -> None:
    topic = f"ret/live/{uid()}"
    live = connect(broker.port)
    assert subscribe(live, 1, [(topic, 2)]) == [2]
    pub = connect(broker.port)
    retain(pub, topic, b"now", qos)
    first, body = live.recv()
    assert first == 0x30 | qos << 1  # retain=0 (MQTT-3.3.1-9)
    m = as_pub(first, body)
    assert (m.topic, m.payload) == (topic, b"now")
    if qos == 1:
        live.send(p.encode_puback(m.packet_id))
    elif qos == 2:
        live.send(p.encode_pubrec(m.packet_id))
        assert live.recv() == (0x62, m.packet_id.to_bytes(2, "big"))
        live.send(p.encode_pubcomp(m.packet_id))
    # and it was kept: a new subscriber gets it with retain=1
    late = connect(broker.port)
    assert subscribe(late, 1, [(topic, 2)]) == [2]
    assert [(m.payload, m.qos, m.retain) for m in sync(late)] == [(b"now", qos, True)]
    assert sync(live) == []
    retain(pub, topic, b"", 0)
    for c in (live, late, pub):
        c.close()


def test_wildcard_subscription_receives_every_matching_retained_message(broker: Broker) -> None:
    pre = f"ret/wild/{uid()}"
    topics = {f"{pre}/a": b"A", f"{pre}/b/c": b"BC", f"{pre}/d": b"D", pre: b"P"}
    other = f"ret/wild/{uid()}/a"  # a sibling prefix: must not match
    pub = connect(broker.port)
    for topic, payload in topics.items():
        retain(pub, topic, payload, 1)
    retain(pub, other, b"other", 1)
    sub = connect(broker.port)
    assert subscribe(sub, 1, [(f"{pre}/#", 1)]) == [1]
    got = sync(sub)
    assert sorted((m.topic, m.payload) for m in got) == sorted(topics.items())
    assert all(m.retain and m.qos == 1 for m in got)
    plus = connect(broker.port)
    assert subscribe(plus, 1, [(f"{pre}/+", 0)]) == [0]
    got = sync(plus)
    assert sorted((m.topic, m.payload) for m in got) == [(f"{pre}/a", b"A"), (f"{pre}/d", b"D")]
    assert all(m.retain and m.qos == 0 for m in got)
    for topic in [*topics, other]:
        retain(pub, topic, b"", 0)
    for c in (sub, plus, pub):
        c.close()


def test_resubscribing_resends_retained_messages(broker: Broker) -> None:
    topic = f"ret/again/{uid()}"
    pub = connect(broker.port)
    retain(pub, topic, b"again", 2)
    sub = connect(broker.port)
    for packet_id, qos in ((1, 2), (2, 2), (3, 1)):
        assert subscribe(sub, packet_id, [(topic, qos)]) == [qos]
        assert [(m.topic, m.payload, m.qos, m.retain) for m in sync(sub)] == [(topic, b"again", qos, True)]
    retain(pub, topic, b"", 0)
    sub.close()
    pub.close()
