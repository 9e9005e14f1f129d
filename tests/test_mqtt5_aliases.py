"""End to end: topic aliases from the broker to 5.0 clients (workers/aliases.py) on each write path:
raw 3.1.1 QoS 0 runs rewritten for 5.0, shared QoS 0 deliveries, QoS 1 headers, resends after a
reconnect and the client's Maximum Packet Size; beside a 5.0 client that takes no aliases and a
3.1.1 client. Expected packets are written out byte for byte here, not with the codec under test."""

from __future__ import annotations

import queue

import paho.mqtt.client as paho
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from plexmq.mqtt import properties as P
from plexmq.mqtt import v4, v5
from tests.conftest import Broker
from tests.mqtt import RawClient
from tests.steps import uid


def publish0(topic: str, payload: bytes, alias: int = 0) -> tuple[int, bytes]:
    """(first byte, body) of the QoS 0 PUBLISH a 5.0 subscriber gets: `topic` "" uses `alias`."""
    name = topic.encode()
    props = bytes((3, P.TOPIC_ALIAS)) + alias.to_bytes(2, "big") if alias else b"\x00"
    return 0x30, len(name).to_bytes(2, "big") + name + props + payload


def connect5(port: int, properties: dict | None = None, client_id: str = "") -> RawClient:
    c = RawClient(port)
    assert c.connect5(client_id or f"alias-{uid()}", properties=properties)[:2] == (False, 0)
    return c


def subscribe(c: RawClient, topic_filter: str, qos: int = 0, level: int = 5) -> None:
    if level == 5:
        c.send(v5.encode_subscribe(1, [(topic_filter, qos)]))
    else:
        c.send(v4.encode_subscribe(1, [(topic_filter, qos)]))
    first, body = c.recv()
    assert first == 0x90 and body[-1] == qos


# the steps of one stream to a subscriber allowing 2 aliases: topic, and the alias its packet sets or
# uses (0: none), named (the topic name is in the packet)
STEPS = [
    ("a", 1, True),   # a free alias: name and alias
    ("a", 1, False),  # then the alias alone
    ("b", 2, True),
    ("c", 0, True),   # both taken: c is sent plainly, and remembered as a miss
    ("a", 1, False),  # a is now more recently used than b
    ("c", 2, True),   # c's second miss takes the least recently used alias (b's)
    ("b", 0, True),   # b lost it: a miss
    ("c", 2, False),
    ("a", 1, False),
]


@pytest.mark.parametrize("publisher", [4, 5])
def test_aliases_follow_the_policy_beside_clients_without_them(broker: Broker, publisher: int) -> None:
    """A 3.1.1 publisher's QoS 0 goes as raw runs (rewritten for 5.0), a 5.0 one's as shared QoS 0
    deliveries: either way the aliasing subscriber gets the same packets; a 5.0 subscriber without a
    Topic Alias Maximum and a 3.1.1 one get plain ones."""
    base = f"aliases/{uid()}"
    aliasing = connect5(broker.port, {P.TOPIC_ALIAS_MAXIMUM: 2})
    plain5 = connect5(broker.port)
    plain4 = RawClient(broker.port)
    assert plain4.connect(f"alias4-{uid()}") == (False, 0)
    for c, level in ((aliasing, 5), (plain5, 5), (plain4, 4)):
        subscribe(c, f"{base}/#", 0, level)
    pub = RawClient(broker.port)
    if publisher == 4:
        pub.connect(f"pub-{uid()}")
    else:
        pub.connect5(f"pub-{uid()}")
    for i, (name, alias, named) in enumerate(STEPS):
        topic, payload = f"{base}/{name}", str(i).encode()
        encode = v4.encode_publish if publisher == 4 else v5.encode_publish
        pub.send(encode(topic.encode(), payload))
        assert aliasing.recv() == publish0(topic if named else "", payload, alias), f"step {i}"
        assert plain5.recv() == publish0(topic, payload)
        assert plain4.recv() == (0x30, v4.encode_publish(topic.encode(), payload)[2:])
    for c in (aliasing, plain5, plain4, pub):
        c.close()


def test_qos1_uses_aliases_and_a_reconnect_starts_with_none(broker: Broker) -> None:
    """A QoS 1 delivery gets an alias like QoS 0; a resend after a reconnect (DUP) is the first packet
    of a new connection, so it names its topic again; after it the alias is used again."""
    cid, base = f"alias-q1-{uid()}", f"aliases/q1/{uid()}"
    session = {P.TOPIC_ALIAS_MAXIMUM: 1, P.SESSION_EXPIRY_INTERVAL: 600}
    sub = connect5(broker.port, session, cid)
    subscribe(sub, f"{base}/#", 1)
    pub = RawClient(broker.port)
    pub.connect5(f"pub-{uid()}")
    topic = f"{base}/t"

    def published(pid: int, payload: bytes) -> None:
        pub.send(v5.encode_publish(topic.encode(), payload, 1, packet_id=pid))
        assert pub.recv() == (0x40, pid.to_bytes(2, "big"))

    def received(dup: bool, named: bool, payload: bytes) -> int:
        first, body = sub.recv()
        assert first == (0x3A if dup else 0x32)
        got, pid, data, props = v5.decode_publish(first & 15, body, from_server=True)
        assert (got, props, data) == (topic if named else "", {P.TOPIC_ALIAS: 1}, payload)
        return pid

    published(1, b"one")
    sub.send(v5.encode_ack(v5.PUBACK, received(False, True, b"one")))
    published(2, b"two")
    received(False, False, b"two")  # not acknowledged: sent again after the reconnect
    sub.close()

    sub = RawClient(broker.port)
    assert sub.connect5(cid, False, properties=session)[:2] == (True, 0)
    sub.send(v5.encode_ack(v5.PUBACK, received(True, True, b"two")))
    published(3, b"three")
    received(False, False, b"three")
    sub.close()
    sub = connect5(broker.port, client_id=cid)  # clean start: the session ends
    for c in (sub, pub):
        c.close()


def test_a_message_too_large_for_the_client_sets_no_alias(broker: Broker) -> None:
    """What the client's Maximum Packet Size leaves out changes nothing: the next topic gets the alias
    the dropped one would have had."""
    base = f"aliases/max/{uid()}"
    sub = connect5(broker.port, {P.TOPIC_ALIAS_MAXIMUM: 2, P.MAXIMUM_PACKET_SIZE: 80})
    subscribe(sub, f"{base}/#")
    pub = RawClient(broker.port)
    pub.connect(f"pub-{uid()}")
    a, b = f"{base}/a", f"{base}/b"
    pub.send(v4.encode_publish(a.encode(), b"L" * 100) + v4.encode_publish(b.encode(), b"small"))
    assert sub.recv() == publish0(b, b"small", 1)
    pub.send(v4.encode_publish(a.encode(), b"small"))
    assert sub.recv() == publish0(a, b"small", 2)
    pub.send(v4.encode_publish(b.encode(), b"again"))
    assert sub.recv() == publish0("", b"again", 1)
    for c in (sub, pub):
        c.close()


def test_paho_v5_gets_every_topic_through_the_aliases(broker: Broker) -> None:
    """paho-mqtt decodes the aliased packets; it hands the application the alias rather than resolving
    it (paho 2.2), so the test resolves it as such an application does, and gets every full name."""
    base = f"aliases/paho/{uid()}"
    messages: queue.Queue[paho.MQTTMessage] = queue.Queue()
    subacks: queue.Queue[object] = queue.Queue()
    client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=f"paho-{uid()}", protocol=paho.MQTTv5)
    client.on_message = lambda c, u, msg: messages.put(msg)
    client.on_subscribe = lambda c, u, mid, codes, props: subacks.put(codes)
    properties = Properties(PacketTypes.CONNECT)
    properties.TopicAliasMaximum = 2
    client.connect("127.0.0.1", broker.port, 60, properties=properties)
    client.loop_start()
    try:
        client.subscribe(f"{base}/#", 1)
        subacks.get(timeout=5)
        pub = RawClient(broker.port)
        pub.connect(f"pub-{uid()}")
        sent = [f"{base}/{name}" for name, _alias, _named in STEPS]
        resolved, topics = {}, []
        for i, topic in enumerate(sent):
            pub.send(v4.encode_publish(topic.encode(), str(i).encode()))
            msg = messages.get(timeout=5)
            alias = getattr(msg.properties, "TopicAlias", 0)
            if msg.topic:
                if alias:
                    resolved[alias] = msg.topic
                topics.append(msg.topic)
            else:
                topics.append(resolved[alias])
        assert topics == sent
        assert len(resolved) == 2
        pub.close()
    finally:
        client.disconnect()
        client.loop_stop()


def test_a_run_rewritten_with_an_alias() -> None:
    """The codec side of a raw run: the first packet sets the alias (or uses it), the rest use it, and
    properties already there stay after it."""
    run = v5.publishes_from_v4(v4.encode_publish(b"runs/t", b"1") + v4.encode_publish(b"runs/t", b"22"))
    assert v5.first_topic(run) == b"runs/t"
    assert v5.payloads(run) == [b"1", b"22"]
    assert v5.with_topic_alias(run, 7, True) == bytes.fromhex("300d 0006") + b"runs/t" + bytes.fromhex("03 230007 31") \
        + bytes.fromhex("3008 0000 03 230007 3232")
    assert v5.with_topic_alias(run, 7, False) == bytes.fromhex("3007 0000 03 230007 31 3008 0000 03 230007 3232")
    with_props = v5.encode_publish(b"runs/t", b"x", retain=True, properties={P.CONTENT_TYPE: "a"})
    assert v5.with_topic_alias(with_props, 1, False) == bytes.fromhex("310b 0000 07 230001 030001") + b"ax"
