"""End to end: MQTT 5.0 clients (paho-mqtt's v5 API and raw sockets for byte-exact checks) beside
3.1.1 ones on one broker: CONNACK properties, reason codes on every acknowledgement, server-initiated
DISCONNECT with its reason, session expiry, topic aliases, flow control and packet size limits."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as paho

from plexmq.mqtt import properties as P
from plexmq.mqtt import v4, v5
from tests.cli import passwd
from tests.conftest import Broker
from tests.mqtt import Client, RawClient
from tests.steps import disconnect_of, raw5, recv_publish, subscribe5, uid

V5 = paho.MQTTv5


# -- CONNECT and CONNACK ---------------------------------------------------------------------------


def test_connack_tells_the_limits_byte_exact(broker: Broker) -> None:
    c = RawClient(broker.port)
    c.send(v5.encode_connect("v5-exact", True, 60, protocol_level=5))
    # session present 0, success, properties: receive maximum 1024, maximum packet size 1 MiB, retain,
    # wildcard subscriptions, subscription identifiers and shared subscriptions available, topic alias
    # maximum 10
    assert c.recv() == (0x20, bytes.fromhex("0000 13 21 0400 27 00100000 25 01 28 01 29 01 2a 01 22 000a"))
    c.send(v4.PINGREQ_PACKET)
    assert c.recv() == (0xD0, b"")
    c.send(v5.encode_disconnect())
    assert c.read_until_closed() == b""


def test_a_connect_that_breaks_a_rule_is_told_why_in_a_connack(broker: Broker) -> None:
    """Section 4.13.1: a 5.0 CONNECT the broker refuses gets a CONNACK with the reason code before the
    close; with its reason string only where the client's Maximum Packet Size is known."""
    def refused(connect: bytes) -> tuple[bool, int, dict]:
        c = RawClient(broker.port)
        c.send(connect)
        first, body = c.recv()
        assert first == 0x20 and c.read_until_closed() == b""
        return v5.decode_connack(0, body)

    assert refused(v5.encode_connect("v5-rm0", protocol_level=5, properties={P.RECEIVE_MAXIMUM: 0})) == (False, 0x82, {})
    twice = bytes.fromhex("1018 0004 4d515454 05 02 003c 0a 11 00000001 11 00000001 0001 61")
    assert refused(twice) == (False, 0x82, {})
    wildcard = v5.Will("will/+", b"gone", 0, False)
    _present, code, props = refused(v5.encode_connect("v5-will", will=wildcard, protocol_level=5))
    assert code == 0x90 and props[P.REASON_STRING].startswith("topic name invalid: will topic")
    small = v5.encode_connect("v5-will", will=wildcard, protocol_level=5, properties={P.MAXIMUM_PACKET_SIZE: 8})
    assert refused(small) == (False, 0x90, {})
    c = RawClient(broker.port)  # 3.1.1 has no CONNACK code for it: closed
    c.send(v4.encode_connect("v4-will", will=wildcard))
    assert c.read_until_closed() == b""


def test_empty_client_id_is_assigned_and_told(broker: Broker) -> None:
    c = RawClient(broker.port)
    present, code, props = c.connect5("", clean_start=False)  # 5.0 allows this without clean start
    assert (present, code) == (False, 0)
    assigned = props[P.ASSIGNED_CLIENT_IDENTIFIER]
    assert assigned.startswith("plexmq-")
    c.send(v5.encode_disconnect())
    c.read_until_closed()


def test_paho_v5_round_trip_at_each_qos_beside_a_311_client(broker: Broker) -> None:
    """Mixed traffic: 5.0 and 3.1.1 publishers and subscribers on one topic, QoS 0 (the 3.1.1 raw
    path's packets rewritten for 5.0 subscribers), 1 and 2."""
    topic = f"v5/mixed/{uid()}"
    sub5 = Client(broker.port, f"sub5-{uid()}", protocol=V5)
    sub4 = Client(broker.port, f"sub4-{uid()}")
    assert sub5.subscribe(topic, 2) == [2]
    assert sub4.subscribe(topic, 2) == [2]
    assert sub5.connack_properties.ReceiveMaximum == 1024  # type: ignore[union-attr]  # a 5.0 CONNACK has properties
    pub5 = Client(broker.port, f"pub5-{uid()}", protocol=V5)
    pub4 = Client(broker.port, f"pub4-{uid()}")
    for qos in (0, 1, 2):
        for name, pub in (("v5", pub5), ("v4", pub4)):
            pub.publish(topic, f"{name}-{qos}", qos)
            for sub in (sub5, sub4):
                msg = sub.get()
                assert (msg.topic, msg.payload, msg.qos) == (topic, f"{name}-{qos}".encode(), qos)
    for c in (sub5, sub4, pub5, pub4):
        c.disconnect()


def test_bad_password_gets_0x86_and_an_authentication_method_0x8c(start_broker: Callable[..., Broker],
                                                                     tmp_path: Path) -> None:
    passwords = tmp_path / "passwd"
    assert passwd(str(passwords), "alice", "--password-stdin", stdin="secret\n").returncode == 0
    config = tmp_path / "plexmq.toml"
    config.write_text(f'password_file = "{passwords}"\n')
    b = start_broker("--workers", "1", "--config", str(config))
    c = RawClient(b.port)
    present, code, props = c.connect5("v5-bad", username="alice", password=b"wrong")
    assert (present, code, props[P.REASON_STRING]) == (False, 0x86, "bad user name or password")
    assert c.read_until_closed() == b""
    c = RawClient(b.port)
    assert c.connect5("v5-good", username="alice", password=b"secret")[:2] == (False, 0)
    c.close()
    c = RawClient(b.port)
    present, code, props = c.connect5("v5-scram", properties={P.AUTHENTICATION_METHOD: "SCRAM-SHA-1"},
                                      username="alice", password=b"secret")
    assert (present, code) == (False, 0x8C)
    assert c.read_until_closed() == b""


# -- sessions ----------------------------------------------------------------------------------------


def test_session_expiry_keeps_a_session_and_clean_start_discards_it(broker: Broker) -> None:
    cid, topic = f"v5-sess-{uid()}", f"v5/sess/{uid()}"
    c, (present, code, _) = raw5(broker.port, cid, clean_start=True, properties={P.SESSION_EXPIRY_INTERVAL: 3600})
    assert (present, code) == (False, 0)
    assert subscribe5(c, 1, [(topic, 1)]) == [1]
    c.send(v5.encode_disconnect())
    c.read_until_closed()
    pub = Client(broker.port, f"pub-{uid()}", protocol=V5)
    pub.publish(topic, b"while away", 1)

    c, (present, code, _) = raw5(broker.port, cid, clean_start=False, properties={P.SESSION_EXPIRY_INTERVAL: 3600})
    assert (present, code) == (True, 0)
    topic_got, pid, payload, _props, first = recv_publish(c)
    assert (topic_got, payload, first & 6) == (topic, b"while away", 2)
    c.send(v5.encode_ack(v5.PUBACK, pid))
    c.send(v5.encode_disconnect(0, {P.SESSION_EXPIRY_INTERVAL: 0}))  # ends the session now
    c.read_until_closed()

    c, (present, code, _) = raw5(broker.port, cid, clean_start=False)
    assert (present, code) == (False, 0)
    c.send(v5.encode_disconnect())
    c.read_until_closed()
    pub.disconnect()


def test_session_expiry_0_ends_the_session_with_the_connection(broker: Broker) -> None:
    cid = f"v5-zero-{uid()}"
    c, _ = raw5(broker.port, cid, clean_start=False)
    assert subscribe5(c, 1, [(f"v5/zero/{uid()}", 1)]) == [1]
    c.send(v5.encode_disconnect())
    c.read_until_closed()
    c, (present, _code, _) = raw5(broker.port, cid, clean_start=False)
    assert present is False
    c.close()


def test_session_expiry_set_at_disconnect_after_0_is_a_protocol_error(broker: Broker) -> None:
    c, _ = raw5(broker.port)
    c.send(v5.encode_disconnect(0, {P.SESSION_EXPIRY_INTERVAL: 60}))
    code, props = disconnect_of(c)
    assert code == 0x82 and "session expiry" in props[P.REASON_STRING]


def test_takeover_tells_the_old_connection_0x8e(broker: Broker) -> None:
    cid = f"v5-take-{uid()}"
    old, _ = raw5(broker.port, cid)
    assert subscribe5(old, 1, [(f"v5/take/{uid()}", 0)]) == [0]  # the router has it (a clean session's CONNACK comes first)
    new, (_present, code, _) = raw5(broker.port, cid)
    assert code == 0
    assert disconnect_of(old)[0] == 0x8E
    new.close()


def test_disconnect_with_will_publishes_it_and_a_normal_one_does_not(broker: Broker) -> None:
    topic = f"v5/will/{uid()}"
    watcher = Client(broker.port, f"watch-{uid()}", protocol=V5)
    watcher.subscribe(topic, 1)
    for code, expected in ((0x00, None), (0x04, b"gone")):
        c = RawClient(broker.port)
        c.connect5(f"v5-will-{uid()}", will=v5.Will(topic, b"gone", 1, False))
        c.send(v5.encode_disconnect(code))
        assert c.read_until_closed() == b""
        if expected is None:
            assert watcher.nothing()
        else:
            assert watcher.get().payload == expected
    watcher.disconnect()


# -- acknowledgements with reason codes --------------------------------------------------------------


def test_suback_and_unsuback_reason_codes(broker: Broker) -> None:
    c, _ = raw5(broker.port)
    topic = f"v5/codes/{uid()}"
    assert subscribe5(c, 1, [(topic, 1), ("bad/#/filter", 0), ("$share/group/t", 1), ("$share/+/t", 1),
                             ("$share/group", 1)]) == [1, 0x8F, 1, 0x8F, 0x8F]
    c.send(v5.encode_unsubscribe(3, [topic, "never/subscribed", "bad/#/filter"]))
    first, body = c.recv()
    assert first == 0xB0 and v5.decode_suback(v5.UNSUBACK, 0, body)[:2] == (3, [0x00, 0x11, 0x8F])
    c.close()


def test_acl_refusals_carry_0x87(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite open/#\n")
    config = tmp_path / "plexmq.toml"
    config.write_text(f'acl_file = "{acl}"\nallow_anonymous = true\n')
    b = start_broker("--workers", "1", "--config", str(config))
    c, _ = raw5(b.port, properties={P.REQUEST_PROBLEM_INFORMATION: 1})
    assert subscribe5(c, 1, [("open/x", 1), ("closed/x", 1)]) == [1, 0x87]
    c.send(v5.encode_publish(b"closed/x", b"no", 1, packet_id=5))
    first, body = c.recv()
    assert (first, body) == (0x40, b"\x00\x05\x87")  # bare, as mosquitto sends it
    c.send(v5.encode_publish(b"closed/x", b"no", 2, packet_id=6))
    first, body = c.recv()
    assert first == 0x50 and v5.decode_ack(v5.PUBREC, 0, body)[:2] == (6, 0x87)
    c.send(v5.encode_publish(b"open/x", b"yes", 1, packet_id=7))
    delivery, puback = sorted((c.recv(), c.recv()))  # either may come first
    assert puback == (0x40, b"\x00\x07")  # success: the short form
    assert delivery[0] == 0x32 and v5.decode_publish(2, delivery[1], from_server=True)[2] == b"yes"
    c.close()


def test_dollar_and_share_topics_are_refused_with_0x87_without_an_acl(broker: Broker) -> None:
    """No client writes the broker's `$` topics without an ACL rule naming them, nor a `$share/` name
    (which reaches nobody): PUBACK/PUBREC 0x87, QoS 0 dropped (also on the raw path), a will there 0x87."""
    u = uid()
    spoof, plain = f"$SYS/broker/spoof{u}", f"v5/plain{u}"
    watcher, _ = raw5(broker.port)
    assert subscribe5(watcher, 1, [(spoof, 1), (plain, 1)]) == [1, 1]
    c, _ = raw5(broker.port)
    c.send(v5.encode_publish(spoof.encode(), b"q0", 0))
    for pid, (topic, qos, retain) in enumerate([(spoof, 1, False), (spoof, 2, True), (f"$share/g/{plain}", 1, False)], 1):
        c.send(v5.encode_publish(topic.encode(), b"no", qos, retain, packet_id=pid))
        first, body = c.recv()
        assert first == (0x40 if qos == 1 else 0x50) and v5.decode_ack(first >> 4, 0, body)[:2] == (pid, 0x87), topic
    c.send(v5.encode_publish(plain.encode(), b"yes", 1, packet_id=9))
    assert c.recv() == (0x40, b"\x00\x09")
    topic, _pid, payload, _props, _first = recv_publish(watcher)  # the first it gets
    assert (topic, payload) == (plain, b"yes")
    willing = RawClient(broker.port)
    assert willing.connect5(f"r5-{u}", will=v4.Will(spoof, b"gone", 0, False))[1] == 0x87
    for client in (watcher, c):
        client.close()


def test_a_message_that_matches_no_subscription_is_acknowledged_0x10(broker: Broker) -> None:
    """A 5.0 publisher hears 0x10 when nobody listens, on the local path (QoS 1) and through the router
    (QoS 2, retained); an online subscriber, an offline persistent session and a shared group each
    count as listening. A 3.1.1 publisher's PUBACK stays as it was."""
    base = f"v5/nobody/{uid()}"
    c, _ = raw5(broker.port)

    def acked(topic: str, qos: int, pid: int, retain: bool = False) -> tuple[int, int]:
        c.send(v5.encode_publish(topic.encode(), b"x", qos, retain, packet_id=pid))
        first, body = c.recv()
        assert first == (0x40 if qos == 1 else 0x50), f"expected PUBACK or PUBREC, got {first:#x}"
        return v5.decode_ack(first >> 4, 0, body)[:2]

    assert acked(f"{base}/none", 1, 1) == (1, 0x10)
    assert acked(f"{base}/none", 2, 2) == (2, 0x10)
    c.send(v5.encode_ack(v5.PUBREL, 2))
    assert c.recv() == (0x70, b"\x00\x02")  # 0x10 is no refusal: the QoS 2 flow goes on
    assert acked(f"{base}/retained", 1, 3, retain=True) == (3, 0x10)
    online, _ = raw5(broker.port)
    assert subscribe5(online, 1, [(f"{base}/online", 1)]) == [1]
    offline, _ = raw5(broker.port, f"v5-nobody-{uid()}", properties={P.SESSION_EXPIRY_INTERVAL: 60})
    assert subscribe5(offline, 1, [(f"{base}/offline", 1)]) == [1]
    offline.send(v5.encode_disconnect())
    assert offline.read_until_closed() == b""
    shared, _ = raw5(broker.port)
    assert subscribe5(shared, 1, [(f"$share/g/{base}/shared", 1)]) == [1]
    for pid, (topic, qos) in enumerate([("online", 1), ("online", 2), ("offline", 1), ("shared", 2)], 4):
        assert acked(f"{base}/{topic}", qos, pid) == (pid, 0)
    old = RawClient(broker.port)
    old.connect(f"v4-nobody-{uid()}")
    old.send(v4.encode_publish(f"{base}/none".encode(), b"x", 1, packet_id=9))
    assert old.recv() == (0x40, b"\x00\x09")
    for client in (c, online, shared, old):
        client.close()


def test_acknowledgements_go_bare_as_mosquitto_sends_them(broker: Broker) -> None:
    """The bytes mosquitto and EMQX send: a PUBACK or PUBREC of 0x10 is 4 bytes, and so is a refusal
    (0x99), with no reason string to restate the code (Paho's 5.0 client refuses a longer one)."""
    topic = f"v5/bare/{uid()}".encode()
    c, _ = raw5(broker.port, properties={P.REQUEST_PROBLEM_INFORMATION: 1})
    c.send(v5.encode_publish(topic, b"x", 1, packet_id=7))
    assert c.recv() == (0x40, b"\x00\x07\x10")
    c.send(v5.encode_publish(topic, b"x", 2, packet_id=8))
    assert c.recv() == (0x50, b"\x00\x08\x10")
    c.send(v5.encode_publish(topic, b"\xff", 1, packet_id=9, properties={P.PAYLOAD_FORMAT_INDICATOR: 1}))
    assert c.recv() == (0x40, b"\x00\x09\x99")
    c.close()


def test_payload_format_indicator_checks_utf8(broker: Broker) -> None:
    c, _ = raw5(broker.port)
    c.send(v5.encode_publish(b"v5/pfi", b"\xff\xfe", 1, packet_id=9, properties={P.PAYLOAD_FORMAT_INDICATOR: 1}))
    first, body = c.recv()
    assert first == 0x40 and v5.decode_ack(v5.PUBACK, 0, body)[:2] == (9, 0x99)
    c.send(v5.encode_publish(b"v5/pfi", b"\xff\xfe", 0, properties={P.PAYLOAD_FORMAT_INDICATOR: 1}))
    assert disconnect_of(c)[0] == 0x99


# -- server-initiated DISCONNECT ---------------------------------------------------------------------


def test_malformed_and_protocol_errors_are_told_with_their_reason(broker: Broker) -> None:
    c, _ = raw5(broker.port)
    c.send(bytes.fromhex("3006 0001 61 05 0200"))  # property length beyond the packet
    code, props = disconnect_of(c)
    assert code == 0x81 and "property length" in props[P.REASON_STRING]
    c, _ = raw5(broker.port)
    c.send(v5.encode_connect("again", protocol_level=5))
    code, props = disconnect_of(c)
    assert (code, props[P.REASON_STRING]) == (0x82, "second CONNECT")


def test_a_response_topic_with_a_wildcard_is_a_protocol_error_and_not_forwarded(broker: Broker) -> None:
    """[MQTT-3.3.2-14]: DISCONNECT 0x82, and the message reaches nobody."""
    topic = f"v5/request/{uid()}"
    watcher, _ = raw5(broker.port)
    assert subscribe5(watcher, 1, [(topic, 1)]) == [1]
    for response in ("replies/+", "replies/#"):
        c, _ = raw5(broker.port)
        c.send(v5.encode_publish(topic.encode(), b"request", 1, packet_id=1, properties={P.RESPONSE_TOPIC: response}))
        assert disconnect_of(c)[0] == 0x82, response
    pub, _ = raw5(broker.port)
    pub.send(v5.encode_publish(topic.encode(), b"fine", 1, packet_id=2, properties={P.RESPONSE_TOPIC: "replies/x"}))
    assert pub.recv() == (0x40, b"\x00\x02")
    got, _pid, payload, props, _first = recv_publish(watcher)  # the first it gets
    assert (got, payload, props[P.RESPONSE_TOPIC]) == (topic, b"fine", "replies/x")
    watcher.close()
    pub.close()


def test_reason_strings_name_the_reason_code(broker: Broker) -> None:
    """A refusal's reason string starts with its code's name: "malformed packet" only for 0x81; an
    UNSUBSCRIBE without filters is the same protocol error as such a SUBSCRIBE."""
    for packet, code, reason in [
            (bytes.fromhex("3006 0001 61 05 0200"), 0x81, "malformed packet: property length beyond the packet"),
            (bytes.fromhex("8203 0001 00"), 0x82, "protocol error: SUBSCRIBE without topic filters"),
            (bytes.fromhex("a203 0001 00"), 0x82, "protocol error: UNSUBSCRIBE without topic filters"),
            (v5.encode_publish(b"t", b"x", properties={P.TOPIC_ALIAS: 0}), 0x94, "topic alias invalid: topic alias 0")]:
        c, _ = raw5(broker.port)
        c.send(packet)
        assert disconnect_of(c) == (code, {P.REASON_STRING: reason})


def test_a_disconnect_is_not_lost_to_a_reset(broker: Broker) -> None:
    """Input the broker did not read when it closed (here behind a malformed packet) is drained: the
    client reads the DISCONNECT, then the end of the stream, not a reset."""
    c, _ = raw5(broker.port)
    c.send(bytes.fromhex("3006 0001 61 05 0200") + bytes(100_000))
    c.sock.settimeout(5)
    data = b""
    while chunk := c.sock.recv(65536):  # ConnectionResetError fails the test
        data += chunk
    assert v5.decode_reason_only(v5.DISCONNECT, 0, data[2:])[0] == 0x81
    c.close()


def test_wrong_ack_is_a_protocol_error(broker: Broker) -> None:
    topic = f"v5/wrongack/{uid()}"
    c, _ = raw5(broker.port)
    assert subscribe5(c, 1, [(topic, 1)]) == [1]
    pub = Client(broker.port, f"pub-{uid()}")
    pub.publish(topic, b"x", 1)
    _t, pid, _p, _props, _f = recv_publish(c)
    c.send(v5.encode_ack(v5.PUBREC, pid))
    assert disconnect_of(c)[0] == 0x82
    pub.disconnect()


def test_a_v5_burst_of_qos0_with_and_without_properties_reaches_both_versions_in_order(broker: Broker) -> None:
    """QoS 0 PUBLISHes without properties take the raw path (as 3.1.1 ones do), those with
    properties the decoded one; one read holding both keeps their order for every subscriber."""
    topic = f"v5/burst/{uid()}"
    old = RawClient(broker.port)
    old.connect(f"burst-311-{uid()}")
    old.send(v4.encode_subscribe(1, [(topic, 0)]))
    assert old.recv()[0] == 0x90
    new, _ = raw5(broker.port)
    assert subscribe5(new, 1, [(topic, 0)]) == [0]
    pub, _ = raw5(broker.port)
    carried = {P.USER_PROPERTY: [("n", "3")]}
    pub.send(b"".join(v5.encode_publish(topic.encode(), b"m%d" % n, 0, properties=carried if n == 3 else None)
                      for n in range(6)))
    for n in range(6):
        assert old.recv() == (0x30, v4.encode_publish(topic.encode(), b"m%d" % n, 0)[2:])
        got_topic, _pid, payload, props, first = recv_publish(new)
        assert (got_topic, payload, first, props) == (topic, b"m%d" % n, 0x30, carried if n == 3 else {})
    for c in (old, new, pub):
        c.close()


def test_a_pubrec_for_an_id_not_in_flight_gets_pubrel_0x92(broker: Broker) -> None:
    c, _ = raw5(broker.port)
    c.send(v5.encode_ack(v5.PUBREC, 4242))
    assert c.recv() == (0x62, bytes.fromhex("1092 92"))  # PUBREL, packet identifier not found
    c.send(v4.PINGREQ_PACKET)  # harmless: the connection stays
    assert c.recv() == (0xD0, b"")
    c.close()


def test_topic_aliases_from_the_client(broker: Broker) -> None:
    topic = f"v5/alias/{uid()}"
    sub = Client(broker.port, f"sub-{uid()}")
    sub.subscribe(topic, 0)
    c, _ = raw5(broker.port)
    c.send(v5.encode_publish(topic.encode(), b"first", 1, packet_id=1, properties={P.TOPIC_ALIAS: 3}))
    assert c.recv() == (0x40, b"\x00\x01")
    c.send(v5.encode_publish(b"", b"second", 1, packet_id=2, properties={P.TOPIC_ALIAS: 3}))
    assert c.recv() == (0x40, b"\x00\x02")
    assert [sub.get().payload, sub.get().payload] == [b"first", b"second"]
    c.send(v5.encode_publish(b"", b"unknown", 0, properties={P.TOPIC_ALIAS: 4}))
    assert disconnect_of(c)[0] == 0x82
    c, _ = raw5(broker.port)
    c.send(v5.encode_publish(topic.encode(), b"beyond", 0, properties={P.TOPIC_ALIAS: 11}))
    assert disconnect_of(c)[0] == 0x94
    sub.disconnect()


def test_receive_maximum_is_enforced_with_0x93(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    config = tmp_path / "plexmq.toml"
    config.write_text("receive_maximum = 2\n")
    b = start_broker("--workers", "1", "--config", str(config))
    c, (_present, _code, props) = raw5(b.port, properties={P.REQUEST_PROBLEM_INFORMATION: 0})
    assert props[P.RECEIVE_MAXIMUM] == 2
    for pid in (1, 2):  # QoS 2 without PUBREL: each stays unacknowledged (0x10: nobody subscribes)
        c.send(v5.encode_publish(b"v5/flow", b"x", 2, packet_id=pid))
        assert c.recv() == (0x50, pid.to_bytes(2, "big") + b"\x10")
    c.send(v5.encode_publish(b"v5/flow", b"x", 2, packet_id=2))  # a resend counts once
    assert c.recv() == (0x50, b"\x00\x02")
    c.send(v5.encode_publish(b"v5/flow", b"x", 2, packet_id=3))
    assert disconnect_of(c)[0] == 0x93


def test_packet_too_large_for_the_broker_is_0x95(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    config = tmp_path / "plexmq.toml"
    config.write_text("max_packet_size = 100\n")
    b = start_broker("--workers", "1", "--config", str(config))
    c, (_present, _code, props) = raw5(b.port)
    assert props[P.MAXIMUM_PACKET_SIZE] == 100
    c.send(v5.encode_publish(b"v5/big", b"x" * 200))
    assert disconnect_of(c)[0] == 0x95


def test_user_properties_beyond_max_user_properties_are_0x97(broker: Broker) -> None:
    """Each user property costs a decoded pair: 200,000 empty ones fit a 1 MB PUBLISH and held the
    worker ~0.4 s. The default bound, 100 per property block, passes; one more is refused unread."""
    topic = f"v5/props/{uid()}"
    sub, _ = raw5(broker.port)
    assert subscribe5(sub, 1, [(topic, 0)]) == [0]
    c, _ = raw5(broker.port)
    hundred = {P.USER_PROPERTY: [("k", str(i)) for i in range(100)]}
    c.send(v5.encode_publish(topic.encode(), b"ok", 1, packet_id=1, properties=hundred))
    assert c.recv() == (0x40, b"\x00\x01")
    assert recv_publish(sub)[3][P.USER_PROPERTY] == hundred[P.USER_PROPERTY]
    flood = {P.USER_PROPERTY: [("", "")] * 200_000}
    c.send(v5.encode_publish(topic.encode(), b"no", 1, packet_id=2, properties=flood))
    code, props = disconnect_of(c)
    assert code == 0x97
    assert "more than 100 user properties" in props[P.REASON_STRING]
    sub.send(v4.PINGREQ_PACKET)
    assert sub.recv() == (0xD0, b"")  # nothing of the refused PUBLISH reached its subscriber
    sub.close()


def test_a_message_larger_than_the_clients_maximum_is_not_sent(broker: Broker) -> None:
    topic = f"v5/max/{uid()}"
    c, _ = raw5(broker.port, properties={P.MAXIMUM_PACKET_SIZE: 64})
    assert subscribe5(c, 1, [(topic, 1)]) == [1]
    pub = Client(broker.port, f"pub-{uid()}")
    pub.publish(topic, b"L" * 100, 0)
    pub.publish(topic, b"L" * 100, 1)
    pub.publish(topic, b"small", 1)
    got = recv_publish(c)
    assert got[2] == b"small"
    c.close()
    pub.disconnect()


def test_a_connack_too_large_for_the_client_leaves_out_what_it_can_do_without(broker: Broker) -> None:
    """[MQTT-3.1.2-24], [MQTT-3.2.2-19]: optional properties are left out of a CONNACK larger than the
    client's Maximum Packet Size; a client that cannot take even the broker's limits gets none."""
    c = RawClient(broker.port)
    c.send(v5.encode_connect(f"v5-fit-{uid()}", True, 60, protocol_level=5, properties={P.MAXIMUM_PACKET_SIZE: 13}))
    assert c.recv() == (0x20, bytes.fromhex("0000 08 21 0400 27 00100000"))  # 13 bytes, the limits only
    c.close()
    c = RawClient(broker.port)
    c.send(v5.encode_connect(f"v5-fit-{uid()}", True, 60, protocol_level=5, properties={P.MAXIMUM_PACKET_SIZE: 12}))
    assert c.read_until_closed() == b""


def test_acks_and_disconnects_leave_out_their_reason_string_where_it_would_not_fit(broker: Broker) -> None:
    """[MQTT-3.1.2-24]: each ack and DISCONNECT leaves out its reason string rather than exceed the
    client's Maximum Packet Size (a 0x99 PUBACK with it is 31 bytes, a 0x8E DISCONNECT 61)."""
    c, _ = raw5(broker.port, properties={P.MAXIMUM_PACKET_SIZE: 16})
    c.send(v5.encode_publish(b"v5/fit", b"\xff", 1, packet_id=9, properties={P.PAYLOAD_FORMAT_INDICATOR: 1}))
    assert c.recv() == (0x40, bytes.fromhex("0009 99"))
    c.send(bytes.fromhex("3006 0001 61 05 0200"))  # property length beyond the packet
    assert c.read_until_closed() == bytes.fromhex("e001 81")
    cid = f"v5-fit-{uid()}"
    old, _ = raw5(broker.port, cid, properties={P.MAXIMUM_PACKET_SIZE: 20})
    # a clean session has its CONNACK before the router has it: a SUBACK says the router has it, else
    # the new connection's CONNECT, from another worker, could reach the router first
    assert subscribe5(old, 1, [(f"v5/fit/{uid()}", 0)]) == [0]
    new, _ = raw5(broker.port, cid)
    assert old.read_until_closed() == bytes.fromhex("e001 8e")
    new.close()


def test_a_suback_larger_than_the_clients_maximum_is_not_sent(broker: Broker) -> None:
    c, _ = raw5(broker.port, properties={P.MAXIMUM_PACKET_SIZE: 16})
    c.send(v5.encode_subscribe(1, [(f"v5/fit/{i}", 0) for i in range(12)]))  # its SUBACK: 17 bytes
    assert subscribe5(c, 2, [("v5/fit/x", 1)]) == [1]  # the next packet is the second SUBACK
    c.close()


def test_keepalive_timeout_is_0x8d(broker: Broker) -> None:
    c, _ = raw5(broker.port, keepalive=1)
    assert disconnect_of(c)[0] == 0x8D


def test_graceful_stop_tells_clients_0x8b(start_broker: Callable[..., Broker]) -> None:
    b = start_broker("--workers", "1")
    c, _ = raw5(b.port)
    b.proc.send_signal(signal.SIGTERM)
    assert disconnect_of(c)[0] == 0x8B


# -- what a message carries: properties byte for byte, message expiry --------------------------------

CARRIED: P.Properties = {P.PAYLOAD_FORMAT_INDICATOR: 1, P.CONTENT_TYPE: "application/json", P.RESPONSE_TOPIC: "replies/7",
           P.CORRELATION_DATA: b"\x00\x01req-7", P.USER_PROPERTY: [("k", "1"), ("k", "2"), ("zone", "été")]}


def test_properties_pass_through_byte_for_byte(broker: Broker) -> None:
    """User properties (order and repeats kept), content type, payload format, response topic and
    correlation data reach a 5.0 subscriber unchanged, live, retained and queued; the message expiry
    interval arrives as what is left of it; a 3.1.1 subscriber gets the message without them."""
    topic = f"v5/props/{uid()}"
    sub5, _ = raw5(broker.port)
    assert subscribe5(sub5, 1, [(topic, 1)]) == [1]
    sub4 = Client(broker.port, f"sub4-{uid()}")
    sub4.subscribe(topic, 1)
    paho5 = Client(broker.port, f"paho5-{uid()}", protocol=V5)
    paho5.subscribe(topic, 1)
    pub, _ = raw5(broker.port)
    sent = v5.encode_publish(topic.encode(), b'{"t": 21}', 1, True, packet_id=3,
                             properties={**CARRIED, P.MESSAGE_EXPIRY_INTERVAL: 600, P.TOPIC_ALIAS: 1})
    pub.send(sent)
    assert pub.recv() == (0x40, b"\x00\x03")

    got_topic, _pid, payload, props, _first = recv_publish(sub5)
    assert (got_topic, payload) == (topic, b'{"t": 21}')
    assert 598 <= props.pop(P.MESSAGE_EXPIRY_INTERVAL) <= 600
    assert props == CARRIED  # the topic alias was the publisher's, not carried
    assert P.encode_entries(CARRIED) in sent  # and the bytes are the publisher's own
    msg = sub4.get()
    assert (msg.payload, msg.properties) == (b'{"t": 21}', None)
    msg = paho5.get()
    assert msg.properties.UserProperty == [("k", "1"), ("k", "2"), ("zone", "été")]  # type: ignore[union-attr]  # a 5.0 message has properties
    assert msg.properties.CorrelationData == b"\x00\x01req-7"  # type: ignore[union-attr]  # as above

    late, _ = raw5(broker.port)  # the retained copy keeps them too
    assert subscribe5(late, 1, [(topic, 1)]) == [1]
    _t, _pid, _payload, props, first = recv_publish(late)
    assert first & 1 and props.pop(P.MESSAGE_EXPIRY_INTERVAL) <= 600 and props == CARRIED
    for c in (sub5, pub, late):
        c.close()
    sub4.disconnect()
    paho5.disconnect()


def test_expired_messages_are_never_delivered(broker: Broker) -> None:
    """Queued for an offline session, and retained: what expires is not sent; what has time left is
    sent with what is left."""
    cid, topic = f"v5-exp-{uid()}", f"v5/exp/{uid()}"
    c, _ = raw5(broker.port, cid, properties={P.SESSION_EXPIRY_INTERVAL: 600})
    assert subscribe5(c, 1, [(topic, 1)]) == [1]
    c.send(v5.encode_disconnect())
    c.read_until_closed()
    pub, _ = raw5(broker.port, properties={P.REQUEST_PROBLEM_INFORMATION: 0})
    for pid, (payload, expiry) in enumerate([(b"short", 1), (b"long", 600), (b"forever", 0)], 1):
        properties = {P.MESSAGE_EXPIRY_INTERVAL: expiry} if expiry else None
        pub.send(v5.encode_publish(topic.encode(), payload, 1, packet_id=pid, properties=properties))
        assert pub.recv() == (0x40, pid.to_bytes(2, "big"))
    pub.send(v5.encode_publish(f"{topic}/kept".encode(), b"retained briefly", 1, True, packet_id=9,
                               properties={P.MESSAGE_EXPIRY_INTERVAL: 1}))
    assert pub.recv() == (0x40, b"\x00\x09\x10")  # no subscriber: 0x10
    time.sleep(2.1)  # the 1 s intervals end (no event to await: expiry is time)

    c, (present, _code, _props) = raw5(broker.port, cid, clean_start=False, properties={P.SESSION_EXPIRY_INTERVAL: 600})
    assert present
    got = []
    for _ in range(2):
        _t, pid, payload, props, _first = recv_publish(c)
        c.send(v5.encode_ack(v5.PUBACK, pid))
        got.append((payload, props.get(P.MESSAGE_EXPIRY_INTERVAL)))
    assert got[0][0] == b"long" and 590 <= got[0][1] < 600  # type: ignore[operator]  # an expiry interval: an int
    assert got[1] == (b"forever", None)
    assert subscribe5(c, 2, [(f"{topic}/kept", 1)]) == [1]
    assert subscribe5(c, 3, [(f"{topic}/barrier", 0)]) == [0]  # no retained PUBLISH came between: it expired
    c.send(v5.encode_disconnect(0, {P.SESSION_EXPIRY_INTERVAL: 0}))
    c.read_until_closed()
    pub.close()
