"""End to end: the CONNECT rules of MQTT 3.1.1 (and 3.1), checked byte for byte on raw sockets."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as paho
import pytest

from plexmq.mqtt import v4 as p
from tests.cli import cli, metrics_url
from tests.conftest import Broker, wait_for
from tests.mqtt import Client, RawClient
from tests.steps import uid

CONNACK_ACCEPTED = b"\x20\x02\x00\x00"


def connect_body(name: bytes = b"MQTT", level: int = 4, flags: int = 0x02, keepalive: int = 60,
                 payload: bytes = b"") -> bytes:
    """A CONNECT written out field by field, so that any field can be wrong."""
    body = len(name).to_bytes(2, "big") + name + bytes((level, flags)) + keepalive.to_bytes(2, "big") + payload
    return bytes((0x10,)) + p.encode_remaining_length(len(body)) + body


def string(text: str) -> bytes:
    data = text.encode()
    return len(data).to_bytes(2, "big") + data


def read_exact(raw: RawClient, n: int, timeout: float = 5.0) -> bytes:
    """Exactly n bytes from the socket (AssertionError when it closes first or they do not come in time)."""
    raw.sock.settimeout(timeout)
    data = raw.buf
    while len(data) < n:
        chunk = raw.sock.recv(n - len(data))
        if not chunk:
            raise AssertionError(f"connection closed after {data!r}, expected {n} bytes")
        data += chunk
    raw.buf = data[n:]
    return data[:n]



def assert_served(raw: RawClient) -> None:
    """The connection is alive and answered: PINGREQ gets PINGRESP."""
    raw.send(p.PINGREQ_PACKET)
    assert raw.recv() == (0xD0, b"")


# -- accepted connections ------------------------------------------------------------------------


def test_connack_accepted_is_byte_exact(broker: Broker) -> None:
    raw = RawClient(broker.port)
    raw.send(p.encode_connect("connect-exact", clean_session=True, keepalive=60))
    assert read_exact(raw, 4) == CONNACK_ACCEPTED
    assert_served(raw)
    raw.close()


def test_hand_written_connect_is_accepted(broker: Broker) -> None:
    raw = RawClient(broker.port)
    # CONNECT, remaining length 23, "MQTT", level 4, clean session, keepalive 60, client id "connect-hand"
    raw.send(b"\x10\x18\x00\x04MQTT\x04\x02\x00\x3c\x00\x0cconnect-hand")
    assert read_exact(raw, 4) == CONNACK_ACCEPTED
    assert_served(raw)
    raw.close()


def test_mqtt31_mqisdp_level3_is_accepted_raw(broker: Broker) -> None:
    raw = RawClient(broker.port)
    raw.send(b"\x10\x16\x00\x06MQIsdp\x03\x02\x00\x3c\x00\x08conn-v31")
    assert read_exact(raw, 4) == CONNACK_ACCEPTED
    raw.send(p.encode_subscribe(1, [("connect/v31/raw", 1)]))
    assert raw.recv() == (0x90, b"\x00\x01\x01")
    raw.send(p.encode_publish(b"connect/v31/raw", b"hello", 1, packet_id=5))
    got = {raw.recv(), raw.recv()}  # PUBACK and the delivery, in either order
    assert (0x40, b"\x00\x05") in got
    delivery = next(item for item in got if item[0] >> 4 == p.PUBLISH)
    topic, _pid, payload = p.decode_publish(delivery[0] & 15, delivery[1])
    assert (topic, payload) == ("connect/v31/raw", b"hello")
    raw.close()


def test_mqtt31_allows_dup_on_pubrel_subscribe_and_unsubscribe(broker: Broker) -> None:
    """MQTT 3.1 sets DUP on a PUBREL, SUBSCRIBE or UNSUBSCRIBE it sends again (6a, 8a, aa); 3.1.1
    fixed their flags, and closes a client that sets it."""
    topic = f"connect/v31/dup/{uid()}"
    raw = RawClient(broker.port)
    raw.send(p.encode_connect(f"v31-dup-{uid()}", protocol_level=3))
    assert read_exact(raw, 4) == CONNACK_ACCEPTED
    raw.send(b"\x8a" + p.encode_subscribe(1, [(topic, 0)])[1:])
    assert raw.recv() == (0x90, b"\x00\x01\x00")
    raw.send(p.encode_publish(f"{topic}/nobody".encode(), b"x", 2, packet_id=2))
    assert raw.recv() == (0x50, b"\x00\x02")
    raw.send(b"\x6a" + p.encode_pubrel(2)[1:])
    assert raw.recv() == (0x70, b"\x00\x02")
    raw.send(b"\xaa" + p.encode_unsubscribe(3, [topic])[1:])
    assert raw.recv() == (0xB0, b"\x00\x03")
    raw.close()
    raw = RawClient(broker.port)
    raw.connect(f"v311-dup-{uid()}")
    raw.send(b"\x8a" + p.encode_subscribe(1, [(topic, 0)])[1:])
    assert raw.read_until_closed() == b""


def test_mqtt31_with_paho(broker: Broker) -> None:
    client = Client(broker.port, "connect-paho-v31", protocol=paho.MQTTv31)
    assert client.subscribe("connect/v31/paho", 2) == [2]
    client.publish("connect/v31/paho", b"v31", qos=2)
    msg = client.get()
    assert (msg.topic, msg.payload, msg.qos) == ("connect/v31/paho", b"v31", 2)
    client.disconnect()


# -- refused with a CONNACK return code, then closed ---------------------------------------------


@pytest.mark.parametrize("name,level", [(b"MQTT", 6), (b"MQTT", 3), (b"MQTT", 0), (b"MQIsdp", 5)],
                         ids=["MQTT-6", "MQTT-3", "MQTT-0", "MQIsdp-5"])
def test_unsupported_protocol_level_gets_connack_1_then_close(broker: Broker, name: bytes, level: int) -> None:
    raw = RawClient(broker.port)
    raw.send(connect_body(name, level, payload=string(f"connect-level-{name.decode()}-{level}")))
    assert raw.read_until_closed() == b"\x20\x02\x00\x01"
    raw.close()


def test_connect_of_an_unknown_level_gets_connack_1_and_a_log_line_that_names_the_level(broker: Broker) -> None:
    """A CONNECT of a level after 5 (5.0-shaped: properties after the keepalive) is refused with
    0x01 [MQTT-3.1.2-2], not dropped as a malformed one."""
    raw = RawClient(broker.port)
    properties = b"\x05\x11\x00\x00\x0e\x10"  # 5 bytes: session expiry interval 3600
    raw.send(connect_body(b"MQTT", 6, payload=properties + string("connect-v6")))
    assert raw.read_until_closed() == b"\x20\x02\x00\x01"
    line = f"(127.0.0.1:{raw.local_port}) closed: unsupported protocol level 6"
    wait_for(lambda: line in broker.output(), 5, "the log line")
    raw.close()


def test_mqtt31_resumed_session_gets_no_session_present_flag(broker: Broker) -> None:
    """MQTT 3.1 has no session-present flag: the CONNACK's first byte stays 0 when a session resumes."""
    for level, resumed in ((3, 0), (4, 1)):
        cid = f"present-{level}"
        # clean first (clears what an earlier run left), then a new session, then one that resumes
        for clean, present in ((True, 0), (False, 0), (False, resumed), (True, 0)):
            raw = RawClient(broker.port)
            raw.send(p.encode_connect(cid, clean_session=clean, protocol_level=level))
            assert read_exact(raw, 4) == bytes((0x20, 0x02, present, 0x00))
            raw.send(p.DISCONNECT_PACKET)
            raw.read_until_closed()


def test_empty_client_id_with_clean_session_is_assigned_one(broker: Broker) -> None:
    first = RawClient(broker.port)
    first.send(connect_body(flags=0x02, payload=string("")))
    assert read_exact(first, 4) == CONNACK_ACCEPTED
    second = RawClient(broker.port)
    second.send(connect_body(flags=0x02, payload=string("")))
    assert read_exact(second, 4) == CONNACK_ACCEPTED
    # each got an id of its own: the second did not take the first over
    assert_served(first)
    assert_served(second)
    first.send(p.encode_subscribe(3, [("connect/empty-id", 0)]))
    assert first.recv() == (0x90, b"\x00\x03\x00")
    second.send(p.encode_publish(b"connect/empty-id", b"x"))
    first_byte, body = first.recv()
    assert first_byte == 0x30 and p.decode_publish(0, body) == ("connect/empty-id", 0, b"x")
    first.close()
    second.close()


def test_empty_client_id_without_clean_session_gets_connack_2_then_close(broker: Broker) -> None:
    raw = RawClient(broker.port)
    raw.send(connect_body(flags=0x00, payload=string("")))
    assert raw.read_until_closed() == b"\x20\x02\x00\x02"
    raw.close()


# -- session present -------------------------------------------------------------------------------


def test_session_present_flag(broker: Broker) -> None:
    cid = "connect-session-present"
    raw = RawClient(broker.port)
    assert raw.connect(cid, clean=False) == (False, 0)  # new persistent session
    raw.send(p.DISCONNECT_PACKET)
    raw.read_until_closed()
    raw.close()

    raw = RawClient(broker.port)
    raw.send(p.encode_connect(cid, clean_session=False))
    assert read_exact(raw, 4) == b"\x20\x02\x01\x00"  # the session exists: session present 1
    raw.send(p.DISCONNECT_PACKET)
    raw.read_until_closed()
    raw.close()

    raw = RawClient(broker.port)
    assert raw.connect(cid, clean=True) == (False, 0)  # clean session: always 0, and the old one is gone
    raw.send(p.DISCONNECT_PACKET)
    raw.read_until_closed()
    raw.close()

    raw = RawClient(broker.port)
    assert raw.connect(cid, clean=False) == (False, 0)  # discarded by the clean session above
    raw.send(p.DISCONNECT_PACKET)
    raw.read_until_closed()
    raw.close()

    raw = RawClient(broker.port)  # leave no persistent session behind on the shared broker
    assert raw.connect(cid, clean=True) == (False, 0)
    raw.close()


def test_session_present_while_the_old_connection_is_still_open(broker: Broker) -> None:
    """Takeover of a live persistent session: the new connection sees session present 1."""
    cid = "connect-session-live"
    old = RawClient(broker.port)
    assert old.connect(cid, clean=False) == (False, 0)
    new = RawClient(broker.port)
    new.send(p.encode_connect(cid, clean_session=False))
    assert read_exact(new, 4) == b"\x20\x02\x01\x00"
    old.read_until_closed()
    new.close()
    cleanup = RawClient(broker.port)
    cleanup.connect(cid, clean=True)
    cleanup.close()


# -- closed without CONNACK --------------------------------------------------------------------------


@pytest.mark.parametrize("flags", [0x03, 0x01], ids=["clean+reserved", "reserved"])
def test_reserved_connect_flag_closes_without_connack(broker: Broker, flags: int) -> None:
    raw = RawClient(broker.port)
    raw.send(connect_body(flags=flags, payload=string(f"connect-reserved-{flags}")))
    assert raw.read_until_closed() == b""
    raw.close()


@pytest.mark.parametrize("flags", [0x0A, 0x12, 0x22, 0x3A, 0x1E],
                         ids=["willqos1-no-will", "willqos2-no-will", "willretain-no-will",
                              "willqos1-retain-no-will", "will-qos3"])
def test_inconsistent_will_flags_close_without_connack(broker: Broker, flags: int) -> None:
    raw = RawClient(broker.port)
    payload = string(f"connect-will-{flags:x}")
    if flags & 0x04:
        payload += string("connect/will") + string("bye")
    raw.send(connect_body(flags=flags, payload=payload))
    assert raw.read_until_closed() == b""
    raw.close()


def test_second_connect_closes_the_connection(broker: Broker) -> None:
    raw = RawClient(broker.port)
    assert raw.connect("connect-twice") == (False, 0)
    raw.send(p.encode_connect("connect-twice"))
    assert raw.read_until_closed() == b""
    raw.close()
    # and the client id is free again: a fresh connection with it is not refused
    again = RawClient(broker.port)
    assert again.connect("connect-twice") == (False, 0)
    again.close()


@pytest.mark.parametrize("packet", [
    p.PINGREQ_PACKET,
    p.encode_publish(b"connect/early", b"x"),
    p.encode_publish(b"connect/early", b"x", 1, packet_id=1),
    p.encode_subscribe(1, [("connect/early", 0)]),
    p.DISCONNECT_PACKET,
], ids=["PINGREQ", "PUBLISH-qos0", "PUBLISH-qos1", "SUBSCRIBE", "DISCONNECT"])
def test_first_packet_other_than_connect_closes(broker: Broker, packet: bytes) -> None:
    watcher = Client(broker.port, f"connect-early-watch-{packet[0]:x}-{len(packet)}")
    watcher.subscribe("connect/early", 0)
    raw = RawClient(broker.port)
    raw.send(packet)
    assert raw.read_until_closed() == b""  # no PINGRESP, no PUBACK, no SUBACK
    raw.close()
    # nothing published before CONNECT reached anybody: the next message is the marker
    marker = Client(broker.port, f"connect-early-marker-{packet[0]:x}-{len(packet)}")
    marker.publish("connect/early", b"marker", qos=1)
    assert watcher.get().payload == b"marker"
    marker.disconnect()
    watcher.disconnect()


def test_no_connect_within_the_timeout_closes(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    config = tmp_path / "plexmq.toml"
    config.write_text("connect_timeout = 1\n")
    b = start_broker("--workers", "2", "--config", str(config))
    started = time.monotonic()
    silent = RawClient(b.port)
    partial = RawClient(b.port)
    partial.send(p.encode_connect("connect-partial")[:5])  # a CONNECT that never completes
    connected = RawClient(b.port)
    assert connected.connect("connect-timely", keepalive=0) == (False, 0)

    assert silent.read_until_closed(timeout=6) == b""
    silent_after = time.monotonic() - started
    assert partial.read_until_closed(timeout=6) == b""
    partial_after = time.monotonic() - started
    assert 0.9 <= silent_after <= 4.0, f"closed after {silent_after:.2f} s"
    assert 0.9 <= partial_after <= 4.0, f"closed after {partial_after:.2f} s"
    # a client that did connect in time is not touched by the CONNECT timeout
    assert_served(connected)
    for raw in (silent, partial, connected):
        raw.close()


def test_an_ipv6_listener_serves_ipv6_and_mapped_ipv4_clients_with_their_addresses(
        start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    """A listener on "::" hands the workers IPv6 sockets (handoff.py says their family): a client over
    ::1 and one over 127.0.0.1 (a v4-mapped address) both connect, one hears what the other publishes,
    and each is listed with its own address."""
    conf = tmp_path / "plexmq.toml"
    conf.write_text('host = "::"\nallow_anonymous = true\n')  # every address of the host: anonymous only here
    b = start_broker("--workers", "1", "--config", str(conf))
    over_v6, over_v4 = RawClient(b.port, host="::1"), RawClient(b.port, host="127.0.0.1")
    assert over_v6.connect("six", True) == (False, 0) and over_v4.connect("four", True) == (False, 0)
    over_v6.send(p.encode_subscribe(1, [("t/ipv6", 0)]))
    assert over_v6.recv()[0] >> 4 == p.SUBACK
    over_v4.send(p.encode_publish(b"t/ipv6", b"hello", 0))
    first, body = over_v6.recv()
    assert p.decode_publish(first & 15, body)[::2] == ("t/ipv6", b"hello")
    rows = {row.split()[0]: row for row in cli("clients", metrics_url(b)).splitlines()[1:-1]}
    assert "::1:" in rows["six"] and "::ffff:127.0.0.1:" in rows["four"], rows
