"""End to end: MQTT 5.0 subscription options (no local, retain as published, retain handling) and
subscription identifiers, with raw v5 sockets for the exact flags and properties, paho-mqtt v5, and
3.1.1 clients beside them. Where a test shows that something was not sent, a marker message that
must come next stands in for a wait."""

from __future__ import annotations

import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from plexmq.mqtt import properties as P
from plexmq.mqtt import v4, v5
from tests.conftest import Broker
from tests.mqtt import Client, RawClient
from tests.steps import raw5, recv_publish, subscribe5, uid

NO_LOCAL, RETAIN_AS_PUBLISHED = 0x04, 0x08
SEND_IF_NEW, NEVER = 0x10, 0x20  # retain handling 1 and 2


def received(c: RawClient) -> tuple[str, bytes, int, bool, list[int]]:
    """(topic, payload, QoS, retain flag, subscription identifiers) of the next PUBLISH, acknowledged."""
    topic, packet_id, payload, props, first = recv_publish(c)
    qos = (first >> 1) & 3
    if qos == 1:
        c.send(v5.encode_ack(v5.PUBACK, packet_id))
    return topic, payload, qos, bool(first & 1), props.get(P.SUBSCRIPTION_IDENTIFIER, [])


def marker(publisher: Client, topic: str) -> None:
    """Publish a marker to `topic` (which the client under test subscribed to plainly) once what
    came before was routed: it is then the next message that client receives."""
    publisher.publish(topic, "marker", 1)


def test_no_local_leaves_out_only_the_publishers_own_messages(broker: Broker) -> None:
    base = f"v5/nl/{uid()}"
    c, _ = raw5(broker.port)
    assert subscribe5(c, 1, [(f"{base}/t", 1 | NO_LOCAL), (f"{base}/m", 1)]) == [1, 1]
    other = Client(broker.port, protocol=paho.MQTTv5)
    assert other.subscribe(f"{base}/t", 1) == [1]
    c.send(v5.encode_publish(f"{base}/t".encode(), b"own", 1, packet_id=1))
    assert c.recv() == (0x40, b"\x00\x01")
    assert other.get().payload == b"own"  # the others get it
    marker(other, f"{base}/m")
    assert received(c)[:2] == (f"{base}/m", b"marker")  # not "own" first
    other.publish(f"{base}/t", "from another", 1)
    assert received(c)[:2] == (f"{base}/t", b"from another")
    # a second, plain subscription that matches makes it deliver the own message once
    assert subscribe5(c, 2, [(f"{base}/#", 1)]) == [1]
    c.send(v5.encode_publish(f"{base}/t".encode(), b"own again", 1, packet_id=2))
    packets = [c.recv(), c.recv()]  # its PUBACK and the delivery to itself, in either order
    assert (0x40, b"\x00\x02") in packets
    first, body = next(packet for packet in packets if packet[0] >> 4 == v5.PUBLISH)
    assert v5.decode_publish(first & 15, body, from_server=True)[2] == b"own again"
    c.send(v5.encode_ack(v5.PUBACK, v5.decode_publish(first & 15, body, from_server=True)[1]))
    marker(other, f"{base}/m")
    assert received(c)[:2] == (f"{base}/m", b"marker")  # once, not twice
    other.disconnect()
    c.close()


def test_retain_as_published_keeps_the_flag_on_live_deliveries(broker: Broker) -> None:
    base = f"v5/rap/{uid()}"
    kept, cleared = raw5(broker.port)[0], raw5(broker.port)[0]
    assert subscribe5(kept, 1, [(f"{base}/#", 1 | RETAIN_AS_PUBLISHED)]) == [1]
    assert subscribe5(cleared, 1, [(f"{base}/#", 1)]) == [1]
    legacy = RawClient(broker.port)
    legacy.connect(f"rap-311-{uid()}")
    legacy.send(v4.encode_subscribe(1, [(f"{base}/#", 1)]))
    assert legacy.recv()[0] == 0x90
    pub = Client(broker.port)
    pub.publish(f"{base}/r", "retained", 1, retain=True)
    assert received(kept)[:4] == (f"{base}/r", b"retained", 1, True)
    assert received(cleared)[:4] == (f"{base}/r", b"retained", 1, False)
    first, _body = legacy.recv()
    assert first & 1 == 0  # 3.1.1: a live delivery never has the retain flag [MQTT-3.3.1-9]
    pub.publish(f"{base}/r", "", 1, retain=True)  # clean up the retained message
    pub.disconnect()
    for c in (kept, cleared, legacy):
        c.close()


def test_retain_handling_sends_retained_always_only_when_new_or_never(broker: Broker) -> None:
    base = f"v5/rh/{uid()}"
    pub = Client(broker.port)
    pub.publish(f"{base}/r", "kept", 1, retain=True)
    c, _ = raw5(broker.port)
    assert subscribe5(c, 1, [(f"{base}/m", 1)]) == [1]

    def after_subscribe(packet_id: int, options: int) -> list[tuple[str, bytes, int, bool, list[int]]]:
        """What arrives after subscribing to the retained topic with `options`, up to the marker."""
        assert subscribe5(c, packet_id, [(f"{base}/r", options)]) == [options & 3]
        marker(pub, f"{base}/m")
        got = []
        while (message := received(c))[1] != b"marker":
            got.append(message)
        return got

    retained: list[tuple] = [(f"{base}/r", b"kept", 1, True, [])]  # retained on subscribe: retain flag set, always
    assert after_subscribe(2, 1) == retained  # 0: on every SUBSCRIBE
    assert after_subscribe(3, 1) == retained
    c.send(v5.encode_unsubscribe(4, [f"{base}/r"]))
    assert c.recv()[0] == 0xB0
    assert after_subscribe(5, 1 | SEND_IF_NEW) == retained  # 1: for a new subscription
    assert after_subscribe(6, 1 | SEND_IF_NEW) == []  # ... and not when it replaces one
    assert after_subscribe(7, 1 | NEVER) == []  # 2: never
    pub.publish(f"{base}/r", "", 1, retain=True)
    pub.disconnect()
    c.close()


def test_one_publish_carries_every_matching_subscription_identifier(broker: Broker) -> None:
    base = f"v5/ids/{uid()}"
    c, _ = raw5(broker.port)
    assert subscribe5(c, 1, [(f"{base}/+", 0)], {P.SUBSCRIPTION_IDENTIFIER: 5}) == [0]
    assert subscribe5(c, 2, [(f"{base}/#", 1)], {P.SUBSCRIPTION_IDENTIFIER: 268435455}) == [1]  # the largest
    assert subscribe5(c, 3, [(f"{base}/plain/#", 1)]) == [1]  # no identifier
    pub = Client(broker.port)  # a 3.1.1 publisher: its QoS 0 messages take the raw path
    pub.publish(f"{base}/a", "at 0", 0)
    topic, payload, qos, _retain, ids = received(c)
    assert (topic, payload, qos, sorted(ids)) == (f"{base}/a", b"at 0", 0, [5, 268435455])
    pub.publish(f"{base}/a", "at 1", 1)
    topic, payload, qos, _retain, ids = received(c)  # QoS: the highest of the matching subscriptions
    assert (topic, payload, qos, sorted(ids)) == (f"{base}/a", b"at 1", 1, [5, 268435455])
    pub.publish(f"{base}/plain/x", "deeper", 1)
    assert received(c) == (f"{base}/plain/x", b"deeper", 1, False, [268435455])
    # a new SUBSCRIBE of a filter replaces its identifier; one without removes it
    assert subscribe5(c, 4, [(f"{base}/+", 0)], {P.SUBSCRIPTION_IDENTIFIER: 6}) == [0]
    assert subscribe5(c, 5, [(f"{base}/#", 1)]) == [1]
    pub.publish(f"{base}/a", "renumbered", 1)
    assert received(c) == (f"{base}/a", b"renumbered", 1, False, [6])
    pub.disconnect()
    c.close()


def test_identifiers_on_retained_and_queued_messages_and_with_paho(broker: Broker) -> None:
    base = f"v5/idq/{uid()}"
    pub = Client(broker.port)
    pub.publish(f"{base}/r", "retained", 1, retain=True)
    cid = f"idq-{uid()}"
    c, _ = raw5(broker.port, cid, properties={P.SESSION_EXPIRY_INTERVAL: 600})
    assert subscribe5(c, 1, [(f"{base}/#", 1)], {P.SUBSCRIPTION_IDENTIFIER: 77}) == [1]
    assert received(c) == (f"{base}/r", b"retained", 1, True, [77])
    c.send(v5.encode_disconnect())
    c.read_until_closed()
    pub.publish(f"{base}/q", "queued", 1)  # for the offline session
    c, (present, _code, _props) = raw5(broker.port, cid, clean_start=False,
                                       properties={P.SESSION_EXPIRY_INTERVAL: 600})
    assert present
    assert received(c) == (f"{base}/q", b"queued", 1, False, [77])
    c.send(v5.encode_disconnect(0, {P.SESSION_EXPIRY_INTERVAL: 0}))
    c.read_until_closed()

    sub = Client(broker.port, protocol=paho.MQTTv5)
    properties = Properties(PacketTypes.SUBSCRIBE)
    properties.SubscriptionIdentifier = 12
    sub.client.subscribe((f"{base}/p", SubscribeOptions(qos=1, noLocal=True, retainAsPublished=True,
                                                         retainHandling=SubscribeOptions.RETAIN_DO_NOT_SEND)),
                         properties=properties)
    assert [code for code in sub.subacks.get(timeout=5)] == [1]
    pub.publish(f"{base}/p", "to paho", 1, retain=True)
    message = sub.get()
    assert (message.payload, message.qos, message.retain) == (b"to paho", 1, True)
    assert message.properties.SubscriptionIdentifier == [12]  # type: ignore[union-attr]  # a 5.0 message has properties
    sub.publish(f"{base}/p", "own", 1)  # no local
    pub.publish(f"{base}/p", "", 1, retain=True)
    assert sub.get().payload == b""  # the next one: "own" never came
    pub.publish(f"{base}/r", "", 1, retain=True)
    sub.disconnect()
    pub.disconnect()


def test_a_v5_raw_run_reaches_subscribers_with_identifiers_and_shared_members_exactly(broker: Broker) -> None:
    """5.0 QoS 0 PUBLISHes without properties travel as a raw run in their own form; subscribers the
    router serves per packet (identifiers, shared groups) get each payload exactly."""
    topic = f"v5/rawids/{uid()}"
    c, _ = raw5(broker.port)
    assert subscribe5(c, 1, [(topic, 0)], {P.SUBSCRIPTION_IDENTIFIER: 9}) == [0]
    members = [Client(broker.port, protocol=paho.MQTTv5), Client(broker.port)]
    for member in members:
        assert member.subscribe(f"$share/raw/{topic}", 0) == [0]
    pub, _ = raw5(broker.port)
    pub.send(b"".join(v5.encode_publish(topic.encode(), b"run %d" % n, 0) for n in range(4)))
    assert [received(c) for _ in range(4)] == [(topic, b"run %d" % n, 0, False, [9]) for n in range(4)]
    assert [members[0].get().payload, members[0].get().payload] == [b"run 0", b"run 2"]
    assert [members[1].get().payload, members[1].get().payload] == [b"run 1", b"run 3"]
    for member in members:
        member.disconnect()
    pub.close()
    c.close()
