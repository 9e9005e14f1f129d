"""End to end: sessions (clean session 0 and 1), offline queues, resends with DUP, QoS 2 state, takeover.

Raw sockets, byte-exact. No sleeps: an absence is checked with a barrier. The router answers a
SUBSCRIBE (or a CONNECT) after everything it routed before, so the SUBACK of a fresh filter follows every
delivery already on its way; PINGRESP follows everything the worker released for the client's earlier
packets (acks). When a client must be known offline before a publish, the publisher shares its worker:
one worker's records reach the router in order, so the router sees GONE before the PUBLISH.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from plexmq.mqtt import v4 as p
from tests.conftest import Broker, wait_for
from tests.mqtt import RawClient
from tests.steps import as_pub, connect, publish, raw_on, subscribe, sync, uid, worker_of


def disconnect(c: RawClient) -> None:
    c.send(p.DISCONNECT_PACKET)
    c.read_until_closed()


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
    old.read_until_closed()
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


@pytest.mark.parametrize("placement", ["same-worker", "other-worker"])
def test_what_a_client_sends_right_after_its_connect_waits_for_a_takeover(broker: Broker, placement: str) -> None:
    """Clients need not wait for the CONNACK [MQTT-3.1.4]: a SUBSCRIBE and a QoS 1 PUBLISH in the CONNECT's
    write are answered once the session is taken over (from another worker: after the old connection is
    closed there), the subscription made in the resumed session."""
    cid, topic = f"pipe-{uid()}", f"sess/pipe/{uid()}"
    old = connect(broker.port, cid, clean=False)
    w = worker_of(broker, old)
    new = raw_on(broker, want=w) if placement == "same-worker" else raw_on(broker, avoid=w)
    new.send(p.encode_connect(cid, False) + p.encode_subscribe(1, [(topic, 1)]) +
             p.encode_publish(topic.encode(), b"mine", 1, False, packet_id=7))
    assert new.recv() == (0x20, b"\x01\x00")  # session present
    old.read_until_closed()
    answers = {new.recv() for _ in range(3)}  # SUBACK, the PUBACK, and its own message (subscribed first)
    assert {(first, body) for first, body in answers if first != 0x32} == {(0x90, b"\x00\x01\x01"), (0x40, b"\x00\x07")}
    [(_, body)] = [a for a in answers if a[0] == 0x32]
    mine = as_pub(0x32, body)
    assert (mine.topic, mine.payload) == (topic, b"mine")
    new.send(p.encode_puback(mine.packet_id))
    disconnect(new)
    forget(broker.port, cid)


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


def test_offline_queue_is_bounded_by_bytes_too(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    """max_queued_bytes: 100-byte payloads into 1,000 bytes; the rest is dropped, counted and logged."""
    config = tmp_path / "plexmq.toml"
    config.write_text("max_queued_bytes = 1000\n")
    b = start_broker("--workers", "1", "--config", str(config))
    cid, topic = f"bytes-{uid()}", f"sess/bytes/{uid()}"
    sub = connect(b.port, cid, clean=False)
    assert subscribe(sub, 1, [(topic, 1)]) == [1]
    disconnect(sub)
    pub = connect(b.port, f"bytes-pub-{uid()}")
    for i in range(15):
        publish(pub, topic, b"%03d" % i + bytes(97), 1, packet_id=i + 1)
    sub = RawClient(b.port)
    assert sub.connect(cid, clean=False) == (True, 0)
    assert [m.payload[:3] for m in sync(sub)] == [b"%03d" % i for i in range(10)]
    wait_for(lambda: f"client {cid}: queue full, dropping messages (1 so far)" in b.output(), 5, "the drops logged")
    sub.close()
    pub.close()


def test_abandoned_persistent_sessions_expire(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    config = tmp_path / "plexmq.toml"
    config.write_text('persistent_client_expiration = "1s"\n')
    b = start_broker("--workers", "1", "--config", str(config))
    cid = f"expire-{uid()}"
    sub = connect(b.port, cid, clean=False)
    assert subscribe(sub, 1, [(f"sess/expire/{cid}", 1)]) == [1]
    disconnect(sub)
    wait_for(lambda: f"client {cid}: persistent session expired" in b.output(), 10, "the session to expire")
    sub = RawClient(b.port)
    assert sub.connect(cid, clean=False) == (False, 0)  # a new session: the old one is gone
    sub.close()


# ------------------------------------------------------------------ acknowledgements of the wrong kind


@pytest.mark.parametrize("qos,wrong", [(1, "pubrec"), (1, "pubcomp"), (2, "puback"), (2, "pubcomp")],
                         ids=["PUBREC-for-QoS1", "PUBCOMP-for-QoS1", "PUBACK-for-QoS2", "PUBCOMP-before-PUBREL"])
def test_an_ack_of_the_wrong_kind_closes_the_client_and_the_session_keeps_the_message(
        broker: Broker, qos: int, wrong: str) -> None:
    """[MQTT-4.8.0-1]: a PUBREC or PUBCOMP for a QoS 1 delivery, a PUBACK for a QoS 2 one, or a PUBCOMP
    before the broker sent PUBREL is a protocol violation: the client is closed, the message stays."""
    cid, topic = f"wrong-ack-{uid()}", f"sess/wrongack/{uid()}"
    sub = connect(broker.port, cid, clean=False)
    assert subscribe(sub, 1, [(topic, qos)]) == [qos]
    pub = connect(broker.port)
    publish(pub, topic, b"kept", qos)
    first, body = sub.recv()
    m = as_pub(first, body)
    assert (m.qos, m.payload) == (qos, b"kept")
    sub.send(getattr(p, f"encode_{wrong}")(m.packet_id))
    assert sub.read_until_closed() == b""

    sub = RawClient(broker.port)
    assert sub.connect(cid, clean=False) == (True, 0)
    first, body = sub.recv()
    again = as_pub(first, body)
    assert (again.payload, again.packet_id, again.dup) == (b"kept", m.packet_id, True)
    assert sync(sub) == []  # acknowledged properly now
    disconnect(sub)
    forget(broker.port, cid)
    pub.close()


@pytest.mark.parametrize("ack", ["puback", "pubrec", "pubcomp"])
def test_an_ack_for_an_id_not_in_flight_is_harmless(broker: Broker, ack: str) -> None:
    c = connect(broker.port)
    c.send(getattr(p, f"encode_{ack}")(4321))
    if ack == "pubrec":
        assert c.recv() == (0x62, (4321).to_bytes(2, "big"))  # PUBREL, as for a PUBREC that came twice
    c.send(p.PINGREQ_PACKET)
    assert c.recv() == (0xD0, b"")
    disconnect(c)


def test_a_takeover_from_another_worker_waits_for_the_old_connections_last_acks(
        start_broker: Callable[..., Broker]) -> None:
    """Frames of two workers reach the router in no set order: a session taken over from another
    worker is resumed only once that worker has closed the old connection, so a PUBREC the old
    connection sent is never lost. Worker 0 is stopped with the PUBREC unread in its socket: the new
    connection (worker 1) gets no CONNACK meanwhile; then it gets the PUBREL if worker 0 read the
    PUBREC before closing the connection, else the PUBLISH again."""
    b = start_broker("--workers", "2")
    cid, topic = f"move-{uid()}", f"sess/move/{uid()}"
    old = raw_on(b, want=0)
    assert old.connect(cid, clean=False) == (False, 0)
    assert subscribe(old, 1, [(topic, 2)]) == [2]
    publish(connect(b.port), topic, b"two", 2)
    m = as_pub(*old.recv())
    worker = b.workers()[0]
    new = raw_on(b, want=1)
    os.kill(worker.pid, signal.SIGSTOP)
    try:
        old.send(p.encode_pubrec(m.packet_id))
        new.send(p.encode_connect(cid, False))
        with pytest.raises(TimeoutError):
            new.recv(timeout=1.0)  # the router waits for worker 0
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    released = old.read_until_closed() == p.encode_pubrel(m.packet_id)
    assert new.recv() == (0x20, b"\x01\x00")
    again = new.recv()
    if released:
        assert again == (0x62, m.packet_id.to_bytes(2, "big"))
    else:
        assert again[0] == 0x3C and as_pub(*again).packet_id == m.packet_id  # DUP, QoS 2
    new.close()
