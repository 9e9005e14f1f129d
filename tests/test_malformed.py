"""End to end: malformed input closes that client only, is logged once with the client id and the reason,
and every other client (on the same worker too) goes on being served."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from plexmq.mqtt import v4 as p
from tests.conftest import Broker, wait_for
from tests.mqtt import RawClient


def string(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return len(data).to_bytes(2, "big") + data


def packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + p.encode_remaining_length(len(body)) + body




def watcher_on(b: Broker, worker: int, name: str, topic: str) -> RawClient:
    """A connected client held by `worker`, subscribed to `topic` (the acceptor balances, so try a few)."""
    spare = []
    try:
        for i in range(8):
            raw = RawClient(b.port)
            raw.connect(f"{name}-watch-{i}")
            if b.worker_of(raw.local_port) == worker:
                raw.send(p.encode_subscribe(1, [(topic, 1)]))
                assert raw.recv() == (0x90, b"\x00\x01\x01")
                return raw
            spare.append(raw)
        raise AssertionError(f"no connection landed on worker {worker}")
    finally:
        for raw in spare:
            raw.close()


def assert_still_served(b: Broker, watcher: RawClient, name: str, topic: str) -> None:
    """A new publisher's message reaches the watcher, which was connected before the bad client."""
    pub = RawClient(b.port)
    pub.connect(f"{name}-pub")
    pub.send(p.encode_publish(topic.encode(), b"still here", 1, packet_id=9))
    assert pub.recv() == (0x40, b"\x00\x09")
    first, body = watcher.recv()
    assert first >> 4 == p.PUBLISH, f"expected PUBLISH, got {first:#x}"
    got_topic, packet_id, payload = p.decode_publish(first & 15, body)
    assert (got_topic, payload) == (topic, b"still here")
    watcher.send(p.encode_puback(packet_id))
    # and the watcher itself can still talk to the broker
    watcher.send(p.PINGREQ_PACKET)
    assert watcher.recv() == (0xD0, b"")
    pub.close()


def assert_logged_once(b: Broker, who: str, reason: str, since: int = 0) -> None:
    """One log line (from offset `since` of the log on) names `who` (client id or peer port) and
    matches the `reason` pattern, besides the line of its connect. A peer's port may have served an
    earlier client of the shared broker."""
    pattern = re.compile(rf"(?<![\w-]){re.escape(who)}(?![\w-]).*(?:{reason})", re.IGNORECASE)
    wait_for(lambda: pattern.search(b.output()[since:]), 5, f"a log line naming {who} and /{reason}/")
    lines = [line for line in b.output()[since:].splitlines()
             if re.search(rf"(?<![\w-]){re.escape(who)}(?![\w-])", line) and " connected from " not in line]
    assert len(lines) == 1, f"expected one line about {who}, got:\n" + "\n".join(lines)


# -- malformed packets after a good CONNECT -------------------------------------------------------------

CASES = {
    # bad remaining length: a continuation bit on the 4th length byte (5 length bytes)
    "remaining-length-5-bytes": (b"\x30\xff\xff\xff\xff\x01", r"remaining length"),
    "remaining-length-5-bytes-pingreq": (b"\xc0\x80\x80\x80\x80\x00", r"remaining length"),
    # truncated fields
    "publish-topic-truncated": (b"\x30\x03\x00\x10a", r"truncated"),
    "publish-topic-length-missing": (b"\x30\x01\x00", r"truncated"),
    "publish-qos1-no-packet-id": (b"\x32\x03\x00\x01a", r"packet identifier"),
    "publish-qos1-packet-id-0": (b"\x32\x05\x00\x01a\x00\x00", r"packet identifier"),
    "subscribe-filter-truncated": (b"\x82\x05\x00\x01\x00\x09a", r"truncated"),
    "subscribe-qos-missing": (b"\x82\x05\x00\x01\x00\x01a", r"QoS"),
    "subscribe-no-filters": (b"\x82\x02\x00\x01", r"filter"),
    "subscribe-qos-3": (b"\x82\x06\x00\x01\x00\x01a\x03", r"QoS"),
    "unsubscribe-filter-truncated": (b"\xa2\x05\x00\x01\x00\x09a", r"truncated"),
    "puback-short": (b"\x40\x01\x00", r"packet identifier|body"),
    # bad fixed-header flags
    "subscribe-flags-0": (packet(0x80, b"\x00\x01" + string("a") + b"\x00"), r"flags"),
    "subscribe-flags-3": (packet(0x83, b"\x00\x01" + string("a") + b"\x00"), r"flags"),
    "unsubscribe-flags-0": (packet(0xA0, b"\x00\x01" + string("a")), r"flags"),
    "pubrel-flags-0": (b"\x60\x02\x00\x01", r"flags"),
    "pingreq-flags-1": (b"\xc1\x00", r"flags"),
    "disconnect-flags-2": (b"\xe2\x00", r"flags"),
    "pingreq-with-body": (b"\xc0\x01\x00", r"body"),
    # PUBLISH rules
    "publish-qos-3": (packet(0x36, string("malformed/q3") + b"\x00\x01x"), r"QoS"),
    "publish-dup-qos0": (packet(0x38, string("malformed/dup") + b"x"), r"DUP"),
    "publish-wildcard-plus": (packet(0x30, string("malformed/+/x") + b"x"), r"wildcard"),
    "publish-wildcard-hash": (packet(0x30, string("malformed/#") + b"x"), r"wildcard"),
    "publish-empty-topic": (packet(0x30, string("") + b"x"), r"empty|topic"),
    "publish-invalid-utf8": (packet(0x30, string(b"malformed/\xff") + b"x"), r"UTF-8"),
    "publish-utf16-surrogate": (packet(0x30, string(b"malformed/\xed\xa0\x80") + b"x"), r"UTF-8"),
    "publish-overlong-utf8": (packet(0x30, string(b"malformed/\xc0\xaf") + b"x"), r"UTF-8"),
    "publish-u0000": (packet(0x30, string(b"malformed/\x00") + b"x"), r"U\+0000"),
    "subscribe-filter-invalid-utf8": (packet(0x82, b"\x00\x01" + string(b"a\xff") + b"\x00"), r"UTF-8"),
    # packet types a client never sends
    "reserved-type-0": (b"\x00\x00", r"packet type|type"),
    "reserved-type-15": (b"\xf0\x00", r"packet type|type"),
    "connack-from-client": (b"\x20\x02\x00\x00", r"packet type|type"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_packet_closes_that_client_only(broker: Broker, case: str) -> None:
    data, reason = CASES[case]
    name = f"malformed-{case}"
    topic = f"malformed/{case}/ok"
    bad = RawClient(broker.port)
    assert bad.connect(f"{name}-bad") == (False, 0)
    watcher = watcher_on(broker, broker.worker_of(bad.local_port), name, topic)

    bad.send(data)
    assert bad.read_until_closed() == b""
    bad.close()

    assert_logged_once(broker, f"{name}-bad", reason)
    assert_still_served(broker, watcher, name, topic)
    watcher.close()


# -- malformed CONNECT: no client id yet, so the log names the peer ------------------------------------

CONNECT_CASES = {
    "protocol-name-truncated": (b"\x10\x03\x00\x04M", r"truncated"),
    "variable-header-truncated": (b"\x10\x08\x00\x04MQTT\x04\x02", r"truncated"),
    "client-id-truncated": (packet(0x10, string("MQTT") + b"\x04\x02\x00\x3c\x00\x10abc"), r"truncated"),
    "client-id-missing": (packet(0x10, string("MQTT") + b"\x04\x02\x00\x3c"), r"truncated"),
    "will-topic-missing": (packet(0x10, string("MQTT") + b"\x04\x06\x00\x3c" + string("malformed-w")), r"truncated"),
    "will-message-truncated": (packet(0x10, string("MQTT") + b"\x04\x06\x00\x3c" + string("malformed-w")
                                      + string("malformed/will") + b"\x00\x09ab"), r"truncated"),
    "username-missing": (packet(0x10, string("MQTT") + b"\x04\x82\x00\x3c" + string("malformed-u")), r"truncated"),
    "password-without-username": (packet(0x10, string("MQTT") + b"\x04\x42\x00\x3c" + string("malformed-p")
                                         + string("secret")), r"password"),
    "bytes-after-payload": (packet(0x10, string("MQTT") + b"\x04\x02\x00\x3c" + string("malformed-x") + b"\x00"),
                            r"after"),
    "client-id-invalid-utf8": (packet(0x10, string("MQTT") + b"\x04\x02\x00\x3c" + string(b"bad\xff")), r"UTF-8"),
    "will-topic-wildcard": (packet(0x10, string("MQTT") + b"\x04\x06\x00\x3c" + string("malformed-ww")
                                   + string("malformed/#") + string("x")), r"wildcard"),
    "connect-flags-1": (b"\x11" + p.encode_connect("malformed-cf")[1:], r"flags"),
    "remaining-length-5-bytes": (b"\x10\xff\xff\xff\xff\x01", r"remaining length"),
}


@pytest.mark.parametrize("case", list(CONNECT_CASES))
def test_malformed_connect_closes_that_client_only(broker: Broker, case: str) -> None:
    data, reason = CONNECT_CASES[case]
    name = f"malformed-connect-{case}"
    topic = f"malformed/connect/{case}"
    since = len(broker.output())
    bad = RawClient(broker.port)
    watcher = watcher_on(broker, broker.worker_holding(bad.local_port), name, topic)
    peer = f"127.0.0.1:{bad.local_port}"

    bad.send(data)
    assert bad.read_until_closed() == b""  # no CONNACK
    bad.close()

    assert_logged_once(broker, peer, reason, since)
    assert_still_served(broker, watcher, name, topic)
    watcher.close()


# -- max_packet_size -----------------------------------------------------------------------------------


def test_packet_above_max_packet_size_closes_that_client_only(start_broker: Callable[..., Broker],
                                                              tmp_path: Path) -> None:
    config = tmp_path / "plexmq.toml"
    config.write_text("max_packet_size = 1024\n")
    b = start_broker("--workers", "2", "--config", str(config))
    topic = "malformed/size"
    topic_bytes = topic.encode()

    def publish_of_size(total: int) -> bytes:
        """A QoS 0 PUBLISH whose whole packet (fixed header included) is `total` bytes."""
        payload_len = total - 3 - 2 - len(topic_bytes)  # 1 type byte, 2 remaining-length bytes, topic length
        data = p.encode_publish(topic_bytes, b"z" * payload_len)
        assert len(data) == total
        return data

    fits = RawClient(b.port)
    assert fits.connect("malformed-size-fits") == (False, 0)
    watcher = watcher_on(b, b.worker_of(fits.local_port), "malformed-size", topic)

    # exactly at the limit: accepted and delivered whole
    fits.send(publish_of_size(1024))
    first, body = watcher.recv()
    assert first >> 4 == p.PUBLISH
    got_topic, packet_id, payload = p.decode_publish(first & 15, body)
    assert (got_topic, len(payload)) == (topic, 1024 - 5 - len(topic_bytes))
    if packet_id:
        watcher.send(p.encode_puback(packet_id))
    fits.send(p.PINGREQ_PACKET)
    assert fits.recv() == (0xD0, b"")

    # one byte over the limit: that client is closed and its message goes nowhere
    over = RawClient(b.port)
    assert over.connect("malformed-size-over") == (False, 0)
    over.send(publish_of_size(1025))
    assert over.read_until_closed() == b""
    over.close()
    assert_logged_once(b, "malformed-size-over", r"exceeds|size|maximum|large")

    # a huge packet is refused as soon as its length is known, without waiting for the body
    huge = RawClient(b.port)
    assert huge.connect("malformed-size-huge") == (False, 0)
    huge.send(b"\x30" + p.encode_remaining_length(200_000_000) + string(topic) + b"z" * 100)
    assert huge.read_until_closed() == b""
    huge.close()
    assert_logged_once(b, "malformed-size-huge", r"exceeds|size|maximum|large")

    # the client that stayed within the limit is still served, and the watcher got nothing oversized
    assert_still_served(b, watcher, "malformed-size", topic)
    fits.send(p.PINGREQ_PACKET)
    assert fits.recv() == (0xD0, b"")
    for raw in (fits, watcher):
        raw.close()
