"""End to end: the per-connection outbound window (max_inflight) and the bounded queue beyond it.

Dedicated brokers with small limits. The subscriber is a raw socket that acknowledges only when the test
says so. Nothing sleeps: after the publisher has its PUBACKs (the router routed everything), a SUBSCRIBE
from the subscriber is a barrier (the worker wrote every delivery it got before the SUBACK), and after an
ack, a PINGREQ is one (the worker writes what the ack released before the PINGRESP).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from plexmq.mqtt import v4 as p
from tests.conftest import Broker
from tests.mqtt import RawClient
from tests.steps import Pub, connect, publish, read_until, subscribe, sync, uid


def dedicated(start_broker: Callable[..., Broker], tmp_path: Path, max_inflight: int, max_queued: int) -> Broker:
    config = tmp_path / "plexmq.toml"
    config.write_text(f"max_inflight = {max_inflight}\nmax_queued_messages = {max_queued}\n")
    return start_broker("--workers", "2", "--config", str(config))


def released(c: RawClient, *acks: int) -> list[Pub]:
    """PUBACK these packet ids; the PUBLISHes the broker sends in return (not acknowledged)."""
    c.send(b"".join(p.encode_puback(pid) for pid in acks) + p.PINGREQ_PACKET)
    return read_until(c, lambda first, body: first == 0xD0, ack=False)


def test_max_inflight_window(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    b = dedicated(start_broker, tmp_path, max_inflight=3, max_queued=100)
    topic = f"flow/window/{uid()}"
    sub = connect(b.port)
    assert subscribe(sub, 1, [(topic, 1)]) == [1]
    pub = connect(b.port)
    for i in range(8):
        publish(pub, topic, b"m%d" % i, 1, packet_id=i + 1)

    window = sync(sub, ack=False)
    assert [m.payload for m in window] == [b"m0", b"m1", b"m2"]  # exactly the window, nothing acked
    assert len({m.packet_id for m in window}) == 3 and all(m.qos == 1 and not m.dup for m in window)
    assert [m.payload for m in released(sub)] == []  # a PINGREQ alone releases nothing

    one = released(sub, window[1].packet_id)  # acking one releases exactly one more
    assert [m.payload for m in one] == [b"m3"]
    assert one[0].packet_id not in (window[0].packet_id, window[2].packet_id)
    assert [m.payload for m in released(sub, window[1].packet_id)] == []  # a second PUBACK of it: nothing
    two = released(sub, window[0].packet_id, window[2].packet_id)
    assert [m.payload for m in two] == [b"m4", b"m5"]
    rest = released(sub, one[0].packet_id, *(m.packet_id for m in two))
    assert [m.payload for m in rest] == [b"m6", b"m7"]
    assert released(sub, *(m.packet_id for m in rest)) == []
    assert sync(sub, ack=False) == []
    sub.close()
    pub.close()


def test_qos0_is_not_held_by_the_window(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    """The window counts QoS 1/2 only: with it full and nothing queued, QoS 0 still flows."""
    b = dedicated(start_broker, tmp_path, max_inflight=1, max_queued=100)
    topic = f"flow/qos0/{uid()}"
    sub = connect(b.port)
    assert subscribe(sub, 1, [(topic, 1)]) == [1]
    pub = connect(b.port)
    publish(pub, topic, b"q1", 1)
    for i in range(5):
        publish(pub, topic, b"z%d" % i, 0)
    publish(pub, f"flow/fence/{uid()}", b"", 1)  # the QoS 0 messages before it are routed
    got = sync(sub, ack=False)
    assert [(m.payload, m.qos) for m in got] == [(b"q1", 1)] + [(b"z%d" % i, 0) for i in range(5)]
    sub.close()
    pub.close()


def test_queue_beyond_the_window_is_bounded_and_drops_qos0_first(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    """max_inflight 1, max_queued 3, a subscriber that does not ack.

    m1 fills the window; m2, a, b fill the queue (QoS 0 waits behind m2 to keep the order); m3 and m4
    each push out a QoS 0 message; then the queue holds only QoS 1 and m5, c, m6 are dropped.
    """
    b = dedicated(start_broker, tmp_path, max_inflight=1, max_queued=3)
    topic = f"flow/drop/{uid()}"
    sub = connect(b.port)
    assert subscribe(sub, 1, [(topic, 1)]) == [1]
    pub = connect(b.port)
    for payload, qos in [(b"m1", 1), (b"m2", 1), (b"a", 0), (b"b", 0), (b"m3", 1), (b"m4", 1), (b"m5", 1),
                         (b"c", 0), (b"m6", 1)]:
        publish(pub, topic, payload, qos)

    got = sync(sub, ack=False)
    assert [m.payload for m in got] == [b"m1"]
    received = [got[0]]
    while True:
        more = released(sub, received[-1].packet_id)
        assert len(more) <= 1, more  # one ack frees one slot of the window
        if not more:
            break
        received += more
    assert [(m.payload, m.qos) for m in received] == [(b"m1", 1), (b"m2", 1), (b"m3", 1), (b"m4", 1)]
    # the connection is healthy afterwards
    publish(pub, topic, b"after", 1)
    assert [m.payload for m in sync(sub)] == [b"after"]
    sub.close()
    pub.close()
