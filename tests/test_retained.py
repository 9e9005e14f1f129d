"""End to end: retained messages (MQTT 3.1.1 section 3.3.1.3) through the real broker, on raw sockets.

Absences are checked with a SUBSCRIBE barrier, never a sleep: the router answers a SUBSCRIBE after the
retained messages of the filters before it and after every PUBLISH it routed earlier, and the worker
writes what it got first.
"""

from __future__ import annotations

import pytest

from plexmq.mqtt import v4 as p
from tests.conftest import Broker
from tests.mqtt import RawClient
from tests.steps import as_pub, connect, publish, subscribe, sync, uid


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
