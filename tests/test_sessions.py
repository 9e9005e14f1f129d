"""End to end: sessions (clean session 0 and 1), offline queues, resends with DUP, QoS 2 state, takeover.

Raw sockets, byte-exact. No sleeps: an absence is checked with a barrier. The router answers a
SUBSCRIBE (or a CONNECT) after everything it routed before, so the SUBACK of a fresh filter follows every
delivery already on its way; PINGRESP follows everything the worker released for the client's earlier
packets (acks). When a client must be known offline before a publish, the publisher shares its worker:
one worker's records reach the router in order, so the router sees GONE before the PUBLISH.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
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


def raw_on(broker: Broker, want: int | None = None, avoid: int | None = None) -> RawClient:
    """A raw socket (not yet CONNECTed) held by worker `want`, or by any worker but `avoid`.

    Sockets that land elsewhere stay open meanwhile, so that the balancer (least loaded first, from
    the counts the workers report) sends the next one to the other worker.
    """
    spare: list[RawClient] = []
    try:
        def attempt() -> RawClient | None:
            c = RawClient(broker.port)
            w = worker_of(broker, c)
            if (want is None or w == want) and (avoid is None or w != avoid):
                return c
            spare.append(c)
            return None
        return wait_for(attempt, 10, f"a socket on the wanted worker (want {want}, avoid {avoid})")  # type: ignore[return-value]
    finally:
        for c in spare:
            c.close()


def disconnect(c: RawClient) -> None:
    c.send(p.DISCONNECT_PACKET)
    c.expect_closed()


def forget(port: int, client_id: str) -> None:
    """Discard a persistent session (connect with clean session 1, then DISCONNECT)."""
    c = RawClient(port)
    assert c.connect(client_id, clean=True) == (False, 0)
    disconnect(c)



# ------------------------------------------------------------------------------- clean session


def test_clean_session_1_discards_state(broker: Broker) -> None:
    cid, topic = f"clean-{uid()}", f"sess/clean/{uid()}"
    pub = connect(broker.port)

    c = connect(broker.port, cid, clean=False)
    assert subscribe(c, 1, [(topic, 1)]) == [1]
    disconnect(c)
    c = RawClient(broker.port)
    assert c.connect(cid, clean=True) == (False, 0)  # a persistent session is discarded by clean session 1
    publish(pub, topic, b"x", 1)
    assert sync(c) == []
    assert subscribe(c, 1, [(topic, 1)]) == [1]
    disconnect(c)

    c = RawClient(broker.port)
    assert c.connect(cid, clean=True) == (False, 0)  # nothing kept from the clean session either
    publish(pub, topic, b"y", 1)
    assert sync(c) == []
    disconnect(c)

    c = RawClient(broker.port)
    assert c.connect(cid, clean=False) == (False, 0)
    publish(pub, topic, b"z", 1)
    assert sync(c) == []
    disconnect(c)
    c = RawClient(broker.port)
    assert c.connect(cid, clean=True) == (False, 0)
    c.close()
    pub.close()


# -------------------------------------------------------------------------- persistent session


def test_clean_session_0_keeps_subscriptions_and_queues_qos1_qos2_in_order(broker: Broker) -> None:
    cid, topic = f"keep-{uid()}", f"sess/keep/{uid()}"
    sub = connect(broker.port, cid, clean=False)
    assert subscribe(sub, 1, [(topic, 2)]) == [2]
    pub = raw_on(broker, want=worker_of(broker, sub))
    assert pub.connect(f"keep-pub-{uid()}") == (False, 0)
    disconnect(sub)

    sent = [(b"m1", 1), (b"m2", 0), (b"m3", 2), (b"m4", 1), (b"m5", 0), (b"m6", 2), (b"m7", 1)]
    for payload, qos in sent:
        publish(pub, topic, payload, qos)

    sub = RawClient(broker.port)
    assert sub.connect(cid, clean=False) == (True, 0)
    got = sync(sub)
    assert [(m.topic, m.payload, m.qos, m.dup, m.retain) for m in got] == [
        (topic, payload, qos, False, False) for payload, qos in sent if qos]  # QoS 0 is not queued
    # the subscription is still there
    publish(pub, topic, b"live", 1)
    assert [(m.payload, m.qos) for m in sync(sub)] == [(b"live", 1)]
    disconnect(sub)
    # everything was acknowledged: nothing is resent
    sub = RawClient(broker.port)
    assert sub.connect(cid, clean=False) == (True, 0)
    assert sync(sub) == []
    disconnect(sub)
    forget(broker.port, cid)
    pub.close()


def test_unacknowledged_qos1_is_resent_with_dup_and_the_same_packet_id(broker: Broker) -> None:
    cid, topic = f"dup-{uid()}", f"sess/dup/{uid()}"
    sub = connect(broker.port, cid, clean=False)
    assert subscribe(sub, 1, [(topic, 1)]) == [1]
    pub = connect(broker.port)
    publish(pub, topic, b"unacked", 1)
    first, body = sub.recv()
    assert first == 0x32
    m = as_pub(first, body)
    assert (m.topic, m.payload) == (topic, b"unacked")
    sub.close()  # no PUBACK, no DISCONNECT

    sub = RawClient(broker.port)
    assert sub.connect(cid, clean=False) == (True, 0)
    first, body = sub.recv()
    assert first == 0x3A  # QoS 1 with DUP
    again = as_pub(first, body)
    assert (again.topic, again.payload, again.packet_id) == (topic, b"unacked", m.packet_id)
    sub.send(p.encode_puback(again.packet_id))
    assert sync(sub) == []
    disconnect(sub)

    sub = RawClient(broker.port)
    assert sub.connect(cid, clean=False) == (True, 0)
    assert sync(sub) == []  # acknowledged now: not resent
    disconnect(sub)
    forget(broker.port, cid)
    pub.close()


def test_reconnect_sets_dup_only_on_messages_sent_before(broker: Broker) -> None:
    """Messages beyond the inflight window were never sent: after a reconnect they go out with DUP=0
    (MQTT 3.1.1 section 3.3.1.1: DUP 0 means the first attempt to send this PUBLISH)."""
    cid, topic = f"dupwin-{uid()}", f"sess/dupwin/{uid()}"
    sub = connect(broker.port, cid, clean=False)
    assert subscribe(sub, 1, [(topic, 1)]) == [1]
    pub = connect(broker.port)
    n = 25
    pub.send(b"".join(p.encode_publish(topic.encode(), b"%d" % i, 1, packet_id=i + 1) for i in range(n)))
    for i in range(n):
        assert pub.recv() == (0x40, (i + 1).to_bytes(2, "big"))
    window = sync(sub, ack=False)  # the default window (20), none acknowledged
    assert 0 < len(window) < n
    assert [m.payload for m in window] == [b"%d" % i for i in range(len(window))]
    assert not any(m.dup for m in window)
    sub.close()

    sub = RawClient(broker.port)
    assert sub.connect(cid, clean=False) == (True, 0)
    got = sync(sub)
    assert [m.payload for m in got] == [b"%d" % i for i in range(n)]
    assert [(m.dup, m.packet_id) for m in got[:len(window)]] == [(True, m.packet_id) for m in window]
    assert [m.payload for m in got[len(window):] if m.dup] == []  # never sent before: DUP 0
    disconnect(sub)
    forget(broker.port, cid)
    pub.close()


def test_qos2_outgoing_after_pubrec_a_reconnect_resends_pubrel(broker: Broker) -> None:
    cid, topic = f"rel-{uid()}", f"sess/rel/{uid()}"
    sub = connect(broker.port, cid, clean=False)
    assert subscribe(sub, 1, [(topic, 2)]) == [2]
    pub = connect(broker.port)
    publish(pub, topic, b"two", 2)
    first, body = sub.recv()
    assert first == 0x34
    m = as_pub(first, body)
    pid = m.packet_id.to_bytes(2, "big")
    sub.send(p.encode_pubrec(m.packet_id))
    assert sub.recv() == (0x62, pid)
    sub.close()  # no PUBCOMP

    sub = RawClient(broker.port)
    assert sub.connect(cid, clean=False) == (True, 0)
    assert sub.recv() == (0x62, pid)  # PUBREL again, not the PUBLISH
    sub.send(p.encode_pubcomp(m.packet_id))
    assert sync(sub) == []
    disconnect(sub)

    sub = RawClient(broker.port)
    assert sub.connect(cid, clean=False) == (True, 0)
    sub.send(p.PINGREQ_PACKET)
    assert sub.recv() == (0xD0, b"")  # completed: neither PUBLISH nor PUBREL comes again
    assert sync(sub) == []
    disconnect(sub)
    forget(broker.port, cid)
    pub.close()


@pytest.mark.parametrize("reconnect", [False, True], ids=["same-connection", "after-reconnect"])
def test_qos2_incoming_is_routed_exactly_once(broker: Broker, reconnect: bool) -> None:
    topic = f"sess/once/{uid()}"
    cid = f"once-{uid()}"
    sub = connect(broker.port)
    assert subscribe(sub, 1, [(topic, 2)]) == [2]
    pub = connect(broker.port, cid, clean=not reconnect)
    pub.send(p.encode_publish(topic.encode(), b"once", 2, packet_id=9))
    assert pub.recv() == (0x50, b"\x00\x09")
    if reconnect:  # the session keeps the QoS 2 packet ids it received and has not released
        pub.close()
        pub = RawClient(broker.port)
        assert pub.connect(cid, clean=False) == (True, 0)
    pub.send(p.encode_publish(topic.encode(), b"once", 2, dup=True, packet_id=9))
    assert pub.recv() == (0x50, b"\x00\x09")  # PUBREC again
    assert [(m.payload, m.qos) for m in sync(sub)] == [(b"once", 2)]  # but routed once
    pub.send(p.encode_pubrel(9))
    assert pub.recv() == (0x70, b"\x00\x09")
    # released: the packet id is new again
    pub.send(p.encode_publish(topic.encode(), b"twice", 2, packet_id=9))
    assert pub.recv() == (0x50, b"\x00\x09")
    pub.send(p.encode_pubrel(9))
    assert pub.recv() == (0x70, b"\x00\x09")
    assert [(m.payload, m.qos) for m in sync(sub)] == [(b"twice", 2)]
    sub.close()
    disconnect(pub)
    if reconnect:
        forget(broker.port, cid)


# ------------------------------------------------------------------------------------ takeover


@pytest.mark.parametrize("clean", [True, False], ids=["clean", "persistent"])
@pytest.mark.parametrize("placement", ["same-worker", "other-worker"])
def test_takeover_closes_the_old_connection(broker: Broker, placement: str, clean: bool) -> None:
    cid, topic = f"take-{uid()}", f"sess/take/{uid()}"
    old = connect(broker.port, cid, clean=clean)
    assert subscribe(old, 1, [(topic, 1)]) == [1]
    w = worker_of(broker, old)
    new = raw_on(broker, want=w) if placement == "same-worker" else raw_on(broker, avoid=w)
    assert new.connect(cid, clean=clean) == (not clean, 0)
    old.expect_closed()
    assert (worker_of(broker, new) == w) == (placement == "same-worker")
    # the new connection is the session: with clean session 0 it kept the subscription
    if clean:
        assert subscribe(new, 1, [(topic, 1)]) == [1]
    pub = connect(broker.port)
    publish(pub, topic, b"to-new", 1)
    assert [(m.payload, m.qos) for m in sync(new)] == [(b"to-new", 1)]
    disconnect(new)
    if not clean:
        forget(broker.port, cid)
    pub.close()


# ---------------------------------------------------------------------------- bounded offline queue


def test_offline_queue_is_bounded(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    max_inflight, max_queued = 2, 5
    config = tmp_path / "plexmq.toml"
    config.write_text(f"max_inflight = {max_inflight}\nmax_queued_messages = {max_queued}\n")
    b = start_broker("--workers", "2", "--config", str(config))
    cid, topic = f"bound-{uid()}", f"sess/bound/{uid()}"
    sub = connect(b.port, cid, clean=False)
    assert subscribe(sub, 1, [(topic, 1)]) == [1]
    pub = raw_on(b, want=worker_of(b, sub))
    assert pub.connect(f"bound-pub-{uid()}") == (False, 0)
    disconnect(sub)
    for i in range(20):
        publish(pub, topic, b"%d" % i, 1, packet_id=i + 1)

    sub = RawClient(b.port)
    assert sub.connect(cid, clean=False) == (True, 0)
    got = sync(sub)
    numbers = [int(m.payload) for m in got]
    assert max_queued <= len(numbers) <= max_inflight + max_queued, numbers
    assert numbers == sorted(numbers), numbers
    assert all(m.qos == 1 for m in got)
    # still subscribed and flowing after the overflow
    publish(pub, topic, b"after", 1)
    assert [m.payload for m in sync(sub)] == [b"after"]
    # and what was dropped is gone for good: it does not come back on the next reconnect
    disconnect(sub)
    sub = RawClient(b.port)
    assert sub.connect(cid, clean=False) == (True, 0)
    assert sync(sub) == []
    sub.close()
    pub.close()
