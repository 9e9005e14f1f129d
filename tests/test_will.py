"""End to end: the will is published, with its QoS and retain flag, on every close other than DISCONNECT."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from plexmq.mqtt import v4 as p
from tests.conftest import Broker, wait_for
from tests.mqtt import Client, RawClient


def raw_on_worker(b: Broker, want: Callable[[int], bool]) -> RawClient:
    """A TCP connection (no CONNECT sent yet) held by a worker that `want` accepts."""
    spare: list[RawClient] = []
    try:
        for _ in range(8):
            raw = RawClient(b.port)
            if want(b.worker_holding(raw.local_port)):
                return raw
            spare.append(raw)
        raise AssertionError("the acceptor never put a connection on the wanted worker")
    finally:
        for raw in spare:
            raw.close()


def will_client(b: Broker, client_id: str, topic: str, payload: bytes, qos: int, retain: bool,
                keepalive: int = 60, clean: bool = True) -> RawClient:
    raw = RawClient(b.port)
    assert raw.connect(client_id, clean, keepalive, will=p.Will(topic, payload, qos, retain)) == (False, 0)
    return raw


def subscriber(b: Broker, client_id: str, topic: str, qos: int = 2) -> Client:
    sub = Client(b.port, client_id)
    assert sub.subscribe(topic, qos) == [qos]
    return sub


def expect_will(sub: Client, topic: str, payload: bytes, qos: int, timeout: float = 5.0) -> None:
    """The next message `sub` gets is the will, as a live subscriber sees it (retain 0)."""
    msg = sub.get(timeout)
    assert (msg.topic, msg.payload, msg.qos, msg.retain) == (topic, payload, qos, False)


def clear_retained(b: Broker, topic: str) -> None:
    cleaner = Client(b.port)
    cleaner.publish(topic, b"", qos=1, retain=True)
    cleaner.disconnect()


# -- closes that publish the will ----------------------------------------------------------------------


@pytest.mark.parametrize("qos,retain", [(0, False), (1, False), (2, False), (1, True)])
def test_will_on_socket_closed_without_disconnect(broker: Broker, qos: int, retain: bool) -> None:
    topic = f"will/closed/{qos}/{int(retain)}"
    sub = subscriber(broker, f"will-closed-sub-{qos}-{int(retain)}", topic)
    raw = will_client(broker, f"will-closed-{qos}-{int(retain)}", topic, b"gone", qos, retain)
    raw.close()
    expect_will(sub, topic, b"gone", qos)
    assert sub.nothing(), "the will was published more than once"
    sub.disconnect()
    if retain:
        clear_retained(broker, topic)


def test_will_from_paho_client_dropped(broker: Broker) -> None:
    topic = "will/paho/drop"
    sub = subscriber(broker, "will-paho-sub", topic)
    client = Client(broker.port, "will-paho", will=(topic, b"paho gone", 1, False))
    client.drop()
    expect_will(sub, topic, b"paho gone", 1)
    sub.disconnect()


def test_will_qos_is_capped_by_the_granted_qos(broker: Broker) -> None:
    topic = "will/capped"
    sub = subscriber(broker, "will-capped-sub", topic, qos=0)
    raw = will_client(broker, "will-capped", topic, b"capped", 2, False)
    raw.close()
    expect_will(sub, topic, b"capped", 0)
    sub.disconnect()


def test_will_on_keepalive_expiry(broker: Broker) -> None:
    topic = "will/keepalive"
    sub = subscriber(broker, "will-keepalive-sub", topic)
    raw = will_client(broker, "will-keepalive", topic, b"timed out", 1, False, keepalive=1)
    # silent: closed 1.5 s after CONNECT, plus up to ~2 s for the once-a-second sweep
    expect_will(sub, topic, b"timed out", 1, timeout=5.0)
    raw.read_until_closed(timeout=1)
    raw.close()
    sub.disconnect()


@pytest.mark.parametrize("garbage", [b"\xff" * 8, b"\x36\x05\x00\x01a\x00\x01", b"\x30\x03\x00\x01#"],
                         ids=["garbage", "publish-qos3", "publish-wildcard"])
def test_will_on_protocol_violation(broker: Broker, garbage: bytes) -> None:
    topic = f"will/violation/{garbage[0]:x}/{len(garbage)}"
    sub = subscriber(broker, f"will-violation-sub-{garbage[0]:x}-{len(garbage)}", topic)
    raw = will_client(broker, f"will-violation-{garbage[0]:x}-{len(garbage)}", topic, b"violated", 2, False)
    raw.send(garbage)
    raw.read_until_closed()
    raw.close()
    expect_will(sub, topic, b"violated", 2)
    sub.disconnect()


def test_will_on_second_connect(broker: Broker) -> None:
    """A second CONNECT is a protocol violation too."""
    topic = "will/second-connect"
    sub = subscriber(broker, "will-second-sub", topic)
    raw = will_client(broker, "will-second", topic, b"twice", 1, False)
    raw.send(p.encode_connect("will-second"))
    raw.read_until_closed()
    raw.close()
    expect_will(sub, topic, b"twice", 1)
    sub.disconnect()


@pytest.mark.parametrize("placement", ["same-worker", "other-worker"])
@pytest.mark.parametrize("clean", [True, False], ids=["clean", "persistent"])
def test_will_on_takeover(broker: Broker, placement: str, clean: bool) -> None:
    topic = f"will/takeover/{placement}/{int(clean)}"
    cid = f"will-takeover-{placement}-{int(clean)}"
    sub = subscriber(broker, f"{cid}-sub", topic)
    old = will_client(broker, cid, topic, b"taken over", 1, False, clean=clean)
    old_worker = broker.worker_of(old.local_port)

    def wanted(worker: int) -> bool:
        return (worker == old_worker) == (placement == "same-worker")

    new = raw_on_worker(broker, wanted)
    new.send(p.encode_connect(cid, clean_session=clean))  # no will of its own
    first, body = new.recv()
    assert first == 0x20 and p.decode_connack(0, body)[1] == 0
    old.read_until_closed()
    old.close()
    expect_will(sub, topic, b"taken over", 1)
    assert sub.nothing(), "the will was published more than once"

    # the new connection is the live one, and its DISCONNECT publishes nothing
    new.send(p.PINGREQ_PACKET)
    assert new.recv() == (0xD0, b"")
    new.send(p.DISCONNECT_PACKET)
    new.read_until_closed()
    new.close()
    assert sub.nothing()
    sub.disconnect()
    if not clean:
        cleanup = RawClient(broker.port)
        cleanup.connect(cid, clean=True)
        cleanup.close()


# -- DISCONNECT: no will -----------------------------------------------------------------------------


@pytest.mark.parametrize("retain", [False, True], ids=["plain", "retained"])
def test_no_will_after_disconnect(broker: Broker, retain: bool) -> None:
    topic = f"will/disconnect/{int(retain)}"
    cid = f"will-disconnect-{int(retain)}"
    sub = subscriber(broker, f"{cid}-sub", topic)
    raw = will_client(broker, cid, topic, b"must not appear", 1, retain)
    # a marker publisher on the same worker: its PUB reaches the router after the will client's GONE
    marker = raw_on_worker(broker, lambda w: w == broker.worker_of(raw.local_port))
    assert marker.connect(f"{cid}-marker") == (False, 0)

    raw.send(p.DISCONNECT_PACKET)
    raw.read_until_closed()
    raw.close()
    marker.send(p.encode_publish(topic.encode(), b"marker", 1, packet_id=1))
    assert marker.recv() == (0x40, b"\x00\x01")
    msg = sub.get()
    assert msg.payload == b"marker", f"got {msg.payload!r} before the marker: the will was published"
    assert sub.nothing()
    marker.close()
    sub.disconnect()
    if retain:  # and nothing was retained either
        late = Client(broker.port, f"{cid}-late")
        late.subscribe(topic, 1)
        assert late.nothing(), "a retained will was stored although the client sent DISCONNECT"
        late.disconnect()


def test_no_will_after_paho_disconnect(broker: Broker) -> None:
    topic = "will/paho/disconnect"
    sub = subscriber(broker, "will-paho-disconnect-sub", topic)
    client = Client(broker.port, "will-paho-disconnect", will=(topic, b"must not appear", 1, False))
    client.disconnect()
    wait_for(client.disconnected.is_set, 5, "paho to disconnect")
    assert sub.nothing(0.5)
    sub.disconnect()


# -- retained will ---------------------------------------------------------------------------------------


def test_retained_will_is_retained(broker: Broker) -> None:
    topic = "will/retained/t"
    live = subscriber(broker, "will-retained-live", topic)
    raw = will_client(broker, "will-retained", topic, b"last words", 1, True)
    raw.close()
    expect_will(live, topic, b"last words", 1)  # live subscribers get retain 0
    live.disconnect()

    later = Client(broker.port, "will-retained-later")
    assert later.subscribe(topic, 2) == [2]
    msg = later.get()
    assert (msg.topic, msg.payload, msg.qos, msg.retain) == (topic, b"last words", 1, True)
    later.disconnect()

    capped = Client(broker.port, "will-retained-capped")
    assert capped.subscribe("will/retained/+", 0) == [0]
    msg = capped.get()
    assert (msg.topic, msg.payload, msg.qos, msg.retain) == (topic, b"last words", 0, True)
    capped.disconnect()
    clear_retained(broker, topic)
