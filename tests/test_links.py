"""The worker <-> router link's fault handling on one host: a worker that goes silent past
`link_timeout` is taken for dead (wills out, persistent sessions kept) and, when it speaks again, is
told to join again and registers the connections it still holds (router/links.py)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from plexmq import wire
from plexmq.mqtt import v4 as p
from plexmq.router import links
from tests.conftest import Broker, wait_for
from tests.link_peer import hello, link_peer, router_endpoint
from tests.steps import ping, publish, raw_on, receive, subscribe, sync, uid

TIMEOUT = 2.0  # link_timeout of these brokers (the least allowed)


def test_a_silent_worker_is_taken_for_dead_and_joins_again_when_it_speaks(start_broker: Callable[..., Broker],
                                                                         tmp_path: Path) -> None:
    config = tmp_path / "plexmq.toml"
    config.write_text(f"link_timeout = {TIMEOUT}\n")
    b = start_broker("--workers", "2", "--config", str(config))
    tag = uid()
    will_t, queue_t, live_t = f"links/{tag}/will", f"links/{tag}/q", f"links/{tag}/live"
    frozen, awake = 0, 1
    watcher = raw_on(b, want=awake)
    assert watcher.connect(f"lk-watch-{tag}") == (False, 0)
    assert subscribe(watcher, 1, [(will_t, 1), (live_t, 1)]) == [1, 1]
    pub = raw_on(b, want=awake)
    assert pub.connect(f"lk-pub-{tag}") == (False, 0)
    pers = raw_on(b, want=frozen)
    assert pers.connect(f"lk-pers-{tag}", clean=False, will=p.Will(will_t, b"gone quiet", 1, False)) == (False, 0)
    assert subscribe(pers, 1, [(queue_t, 1)]) == [1]
    clean = raw_on(b, want=frozen)
    assert clean.connect(f"lk-clean-{tag}") == (False, 0)
    assert subscribe(clean, 1, [(live_t, 1)]) == [1]
    worker = b.workers()[frozen]

    os.kill(worker.pid, signal.SIGSTOP)
    try:
        # the router hears nothing from it: its clients' wills go out, the persistent session stays
        will = receive(watcher, count=1, timeout=TIMEOUT + 5)
        assert [(m.topic, m.payload) for m in will] == [(will_t, b"gone quiet")]
        queued = [b"while-silent-%d" % i for i in range(3)]
        for i, payload in enumerate(queued):
            publish(pub, queue_t, payload, 1, packet_id=10 + i)
    finally:
        os.kill(worker.pid, signal.SIGCONT)

    # its next heartbeat is refused and answered with REJOIN: it registers its connections again, and
    # the persistent session gets what was queued for it; nobody was disconnected
    got = receive(pers, payloads=queued, timeout=TIMEOUT + 5)
    assert [m.payload for m in got] == queued
    for c in (pers, clean, watcher, pub):
        ping(c)
    publish(pub, live_t, b"after", 1, packet_id=20)
    assert [m.payload for m in receive(clean, payloads=[b"after"])] == [b"after"]
    assert b"after" in [m.payload for m in sync(watcher)]
    assert sync(watcher) == [], "the will was published more than once"
    assert b.workers()[frozen].pid == worker.pid, "the silent worker was restarted"
    log = b.output()
    assert "taken for dead" in log and "joined the router again" in log, log[-3000:]


def test_a_qos2_release_the_router_refused_does_not_drop_the_next_message_with_that_id(
        start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    """A PUBREL that reaches the worker while the router refuses its frames (taken for dead) never
    reaches the router; the session registered again must not keep the id waiting for a release, or
    the next QoS 2 PUBLISH with it would be acknowledged (PUBREC) and dropped as a resend."""
    config = tmp_path / "plexmq.toml"
    config.write_text(f"link_timeout = {TIMEOUT}\n")
    b = start_broker("--workers", "2", "--config", str(config))
    topic = f"links/rel/{uid()}"
    sub = raw_on(b, want=1)
    assert sub.connect(f"lk-rs-{uid()}", clean=False) == (False, 0)
    assert subscribe(sub, 1, [(topic, 2)]) == [2]
    pub = raw_on(b, want=0)
    assert pub.connect(f"lk-rp-{uid()}", clean=False) == (False, 0)
    pub.send(p.encode_publish(topic.encode(), b"first", 2, False, packet_id=7))
    assert pub.recv() == (0x50, (7).to_bytes(2, "big"))
    worker = b.workers()[0]
    os.kill(worker.pid, signal.SIGSTOP)
    try:
        pub.send(p.encode_pubrel(7))  # read by the worker only once it runs again: refused by the router
        wait_for(lambda: "taken for dead" in b.output(), TIMEOUT + 5, "the router to take worker 0 for dead")
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    assert pub.recv() == (0x70, (7).to_bytes(2, "big"))
    wait_for(lambda: "joined the router again" in b.output(), TIMEOUT + 5, "worker 0 to join again")
    pub.send(p.encode_publish(topic.encode(), b"second", 2, False, packet_id=7))
    assert pub.recv() == (0x50, (7).to_bytes(2, "big"))
    pub.send(p.encode_pubrel(7))
    assert pub.recv() == (0x70, (7).to_bytes(2, "big"))
    got = [m.payload for m in receive(sub, payloads=[b"first", b"second"])]
    assert got[-1] == b"second" and set(got) == {b"first", b"second"}, got


def test_a_worker_that_lost_frames_and_went_away_holds_up_no_suback(start_broker: Callable[..., Broker],
                                                                    tmp_path: Path) -> None:
    """A peer that joins, loses frames (a gap) and never joins again: nobody waits for its route
    table acknowledgement (a SUBACK elsewhere comes), and it is taken for dead after link_timeout."""
    config = tmp_path / "plexmq.toml"
    config.write_text(f"link_timeout = {TIMEOUT}\n")
    b = start_broker("--workers", "2", "--config", str(config))
    with link_peer(router_endpoint(b), b"w9") as peer:
        peer.send(0, hello(9))
        assert peer.frame(5) is not None, "the router did not answer the HELLO"  # the whole route table: joined
        peer.send(3, (wire.ROUTES_ACK, wire.RoutesAck(0).encode()))  # frames 1 and 2 lost: a gap
        kinds: list[int] = []
        while wire.REJOIN not in kinds:  # a BEAT may come first
            kinds += peer.kinds(5)
    c = raw_on(b, want=0)
    assert c.connect(f"lk-gap-{uid()}") == (False, 0)
    assert subscribe(c, 1, [(f"links/gap/{uid()}", 0)]) == [0]
    wait_for(lambda: "worker w9 silent" in b.output(), TIMEOUT + 5, "the router to take the peer for dead")
    ping(c)


# -- the router's bookkeeping of joins (router/links.py), one step at a time ----------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(links.time, "monotonic", clock)
    return clock


def tag(join: int, seq: int) -> bytes:
    return wire.LINK.pack(join, seq)


# (seconds later, join, seq) -> (taken, REJOIN sent for that join, gap recorded)
STEPS = [
    ((0.0, 3, 5), (False, True, False)),  # a worker this router never heard say HELLO (it restarted)
    ((0.1, 3, 6), (False, False, False)),  # asked already: one REJOIN a second
    ((1.0, 3, 7), (False, True, False)),  # a second later, asked again (the first may be lost)
    ((0.1, 4, 0), (True, False, False)),  # HELLO: join 4
    ((0.1, 4, 1), (True, False, False)),
    ((0.1, 4, 3), (False, True, True)),  # frame 2 lost
    ((0.1, 4, 4), (False, False, False)),
    ((0.1, 1, 0), (True, False, False)),  # a new process counts its joins from 1 again
    ((0.1, 1, 2), (False, True, True)),  # and is told to rejoin at once (not "asked already")
    ((0.1, 2, 0), (True, False, False)),
    ((0.1, 2, 1), (True, False, False)),
]


def test_frames_are_taken_only_in_sequence_of_the_accepted_join(clock: Clock) -> None:
    table = links.Links(timeout=5.0)
    for (later, join, seq), (taken, asked, gap) in STEPS:
        clock.now += later
        assert table.accept(b"w0", tag(join, seq)) == taken, (join, seq)
        assert (table.rejoins == [(b"w0", join)]) == asked, (join, seq, table.rejoins)
        assert (table.gaps == [b"w0"]) == gap, (join, seq)
        table.rejoins.clear()
        table.gaps.clear()
    assert [table.tag(b"w0"), table.tag(b"w0")] == [tag(2, 0), tag(2, 1)], "the router numbers its frames per join"
    assert not table.accept(b"w0", b"short"), "a frame without a link tag is not one of ours"


def test_a_worker_is_taken_for_dead_when_silent_or_when_it_does_not_join_again_after_a_gap(clock: Clock) -> None:
    table = links.Links(timeout=5.0)
    assert table.silent(clock.now) == []
    table.accept(b"w0", tag(1, 0))
    table.accept(b"w1", tag(1, 0))
    clock.now += 3.0
    table.accept(b"w1", tag(1, 2))  # a gap: w1 still talks, but never joins again
    assert table.joined() == [b"w0"]
    clock.now += 2.5
    assert table.silent(clock.now) == [b"w0"], "w0 silent for 5.5 s"
    table.accept(b"w1", tag(1, 3))
    clock.now += 3.0
    assert table.silent(clock.now) == [b"w1"], "w1 lost frames 5.5 s ago and has not joined since"
    assert table.silent(clock.now) == [], "taken for dead once"
    table.accept(b"w0", tag(2, 0))
    assert table.joined() == [b"w0"] and table.links[b"w0"].alive
