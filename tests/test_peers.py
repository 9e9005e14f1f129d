"""Worker to worker (workers/peers.py, issue 35): a QoS 0 or 1 message whose topic only workers' own
subscribers want goes to their workers straight, and so does a QoS 2 one of a session that ends with
its connection (exactly once: the connection keeps its ids until PUBREL); nothing overtakes it through
the router. In-process, over the connection harness (its peers a `FakePeers`: each frame kept, each
answer given by the test), and end to end: cross-worker messages flow with the router stopped."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import psutil
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from plexmq import grants, wire
from plexmq.acceptor.config import curve_keys
from plexmq.mqtt import properties as P
from plexmq.mqtt import reasons, v5
from plexmq.mqtt import v4 as p
from plexmq.mqtt.framing import packets_in
from plexmq.workers import from_peers, host_links
from plexmq.workers import peers as peer_links
from plexmq.workers.routes import RouteTables
from tests.conftest import Broker, free_port
from tests.connection_harness import Client, ConnectionHarness, FakePeers, kick, parse, routed, routes, suback
from tests.mqtt import Client as Paho
from tests.mqtt import RawClient
from tests.steps import ping, publish, raw_on, receive, subscribe, uid, worker_of


def direct(**settings: Any) -> tuple[ConnectionHarness, FakePeers]:
    """Worker w0 (its settings the defaults but `settings`) with its table known: `t` served on worker
    w1 alone, `r` by w1 and the router."""
    h = ConnectionHarness(direct=True, **settings)
    h.from_router(routes(1, True, [["", "t", ["w1"]], ["", "r", ["w1", ""]]]))
    peers = h.worker.peers
    assert isinstance(peers, FakePeers)
    return h, peers


def peer_records(frame: bytes) -> list[tuple[int, bytes, bytes]]:
    """(kind, topic, payload) of each record of a frame to a peer."""
    found = []
    for kind, header, payload in wire.records(frame):
        start = wire.PEER_HEAD.size + wire.PEER_HEAD.unpack_from(header)[0]
        if kind == wire.PEER_MSG:
            _flags, length = wire.unpack_deliver(header, start)
            start += wire.DELIVER_HEAD.size
            header = header[:start + length]
        else:
            start += wire.COUNT.size  # the packets' count
        found.append((kind, header[start:], payload))
    return found


def test_a_qos0_message_only_another_workers_subscribers_want_goes_to_that_worker_not_the_router() -> None:
    h, peers = direct()
    c = h.client("pub")
    c.send(p.encode_publish(b"t", b"one") + p.encode_publish(b"t", b"two"))
    h.turn()
    assert h.records() == []
    [(place, frame)] = peers.frames
    assert place == "w1" and peer_records(frame) == [(wire.PEER_RAW, b"t", p.encode_publish(b"t", b"one") +
                                                       p.encode_publish(b"t", b"two"))]
    assert peers.unconfirmed == 1
    peers.answer("w1")
    assert peers.unconfirmed == 0


def test_a_qos1_publishers_puback_waits_for_its_peers_answer_and_later_ones_keep_their_order() -> None:
    """QoS 1 to `t` goes to w1 with its PUBACK held until w1 has delivered it; a QoS 1 message only this
    worker's subscribers want (none: 0x10 for 5.0, a plain PUBACK here) and an ACL-denied one are
    acknowledged behind it, never before."""
    h, peers = direct()
    c = h.client("pub")
    c.send(p.encode_publish(b"t", b"one", 1, packet_id=1) + p.encode_publish(b"mine", b"two", 1, packet_id=2))
    h.turn()
    h.worker.deny(c.conn, 3, 1)
    h.turn()
    assert h.records() == [] and c.packets() == []
    [(place, frame)] = peers.frames
    assert place == "w1" and [(kind, topic) for kind, topic, _payload in peer_records(frame)] == [(wire.PEER_MSG, b"t")]
    peers.answer("w1")
    h.turn()
    assert [(packet.kind, packet.pid) for packet in c.packets()] == [(p.PUBACK, 1), (p.PUBACK, 2), (p.PUBACK, 3)]


def test_a_publisher_taken_over_while_its_message_waits_for_a_peer_gets_no_puback_and_the_message_still_goes() -> None:
    """Takeover (KICK) of a connection whose QoS 1 message is on its way to a peer: the message is not
    recalled (the peer delivers it), the closed connection is written nothing more when the answer
    comes, and a PUBLISH of another client queued behind it still gets its PUBACK, in order."""
    h, peers = direct()
    c = h.client("pub")
    other = h.client("other")
    c.send(p.encode_publish(b"t", b"one", 1, packet_id=1))
    h.turn()
    other.send(p.encode_publish(b"t", b"two", 1, packet_id=7))
    h.turn()
    assert [(place, [payload for _kind, _topic, payload in peer_records(frame)]) for place, frame in peers.frames] == \
        [("w1", [b"one"]), ("w1", [b"two"])]
    h.from_router(kick(c.conn_id))
    assert ("KICKED", (c.conn_id,)) in [(r.kind, tuple(r.fields)) for r in h.records()]
    c.packets()  # (the close)
    peers.answer("w1")
    h.turn()
    assert c.packets() == [] and acks(other) == [(p.PUBACK, 7)]


def test_a_denied_qos2_publish_behind_a_puback_waiting_for_a_peer_gets_a_pubrec() -> None:
    h, peers = direct()
    c = h.client("pub")
    c.send(p.encode_publish(b"t", b"one", 1, packet_id=1))
    h.turn()
    h.worker.deny(c.conn, 2, 2)
    h.turn()
    assert c.packets() == []
    peers.answer("w1")
    h.turn()
    assert [(packet.kind, packet.pid) for packet in c.packets()] == [(p.PUBACK, 1), (p.PUBREC, 2)]


def peer_qos(frame: bytes) -> list[int]:
    """The QoS of each PEER_MSG record of a frame to a peer."""
    found = []
    for kind, header, _payload in wire.records(frame):
        if kind == wire.PEER_MSG:
            start = wire.PEER_HEAD.size + wire.PEER_HEAD.unpack_from(header)[0]
            found.append(wire.unpack_deliver(header, start)[0] & 3)
    return found


def subscribed_here(h: ConnectionHarness, topic_filter: str, qos: int) -> Client:
    """A client of this worker whose subscription the router placed here (served by the worker itself)."""
    sub = h.client("sub")
    sub.send(p.encode_subscribe(1, [(topic_filter, qos)]))
    h.from_router(suback(sub.conn_id, 1, [qos], [[topic_filter, qos]]))
    assert [packet.kind for packet in sub.packets()] == [p.SUBACK]
    return sub


def acks(c: Client) -> list[tuple[int, int]]:
    return [(packet.kind, packet.pid) for packet in c.packets()]


def subscribed_v5(h: ConnectionHarness, topic_filter: str, options: int, identifier: int = 0) -> Client:
    """A 5.0 client of this worker whose subscription with MQTT 5 `options` (and `identifier`) the router
    placed here, as it places a clean session's (router/subscribing.py): with its routing grant."""
    sub = h.client(f"sub5-{uid()}", version=5)
    sub.send(v5.encode_subscribe(1, [(topic_filter, options)],
                                 {P.SUBSCRIPTION_IDENTIFIER: identifier} if identifier else None))
    h.from_router(suback(sub.conn_id, 1, [options & 3], [[topic_filter, grants.make(options & 15, identifier)]]))
    assert [packet.kind for packet in sub.packets()] == [p.SUBACK]
    h.records()  # its SUBSCRIBE, which the router answered
    return sub


def delivered_to(c: Client) -> list[tuple[bytes, int, object]]:
    """(payload, QoS, subscription identifiers or None) of each PUBLISH written to `c`."""
    return [(packet.payload, packet.qos, (packet.props or {}).get(P.SUBSCRIPTION_IDENTIFIER))
            for packet in c.packets() if packet.kind == p.PUBLISH]


def test_subscriptions_with_mqtt5_options_are_served_here_each_message_resolved_for_each() -> None:
    """No local, an identifier and a lower QoS, without the router: the no-local subscriber hears nothing
    it published itself, in a run of QoS 0 packets or alone (and its PUBACK says a subscription matched,
    as the router's would); the other gets each with its identifier, at the QoS it was granted."""
    h, peers = direct()
    own = subscribed_v5(h, "x", 1 | grants.NO_LOCAL)
    other = subscribed_v5(h, "x/#", 0, identifier=7)
    own.send(v5.encode_publish(b"x", b"run-1") + v5.encode_publish(b"x", b"run-2") +
             v5.encode_publish(b"x", b"one", 1, packet_id=5))
    h.turn()
    assert h.records() == [] and peers.frames == []
    assert [(packet.kind, packet.pid, packet.body) for packet in own.packets()] == [(p.PUBACK, 5, b"")]
    assert delivered_to(other) == [(b"run-1", 0, [7]), (b"run-2", 0, [7]), (b"one", 0, [7])]
    pub = h.client("pub4")
    pub.send(p.encode_publish(b"x", b"from another", 1, packet_id=1))
    h.turn()
    assert h.records() == [] and acks(pub) == [(p.PUBACK, 1)]
    assert delivered_to(own)[0][:2] == (b"from another", 1) and delivered_to(other) == [(b"from another", 0, [7])]


def peer_frame(*records: tuple[int, bytes, bytes]) -> bytes:
    """A frame from a peer of the default tenant: (kind, topic, payload) records, as workers/peers.py makes them."""
    batch = wire.Batch()
    for kind, topic, payload in records:
        head = wire.PEER_HEAD.pack(0)
        if kind == wire.PEER_MSG:
            batch.add(kind, head + wire.deliver_head(topic, 1, False, False, b"", 0), payload)
        else:
            batch.add(kind, head + wire.COUNT.pack(packets_in(payload)) + topic, payload)
    return batch.take()


def test_a_peers_messages_reach_subscriptions_with_mqtt5_options_here_each_with_its_own() -> None:
    """What another worker sends (a QoS 1 message, a run of QoS 0 packets) goes to this worker's
    subscribers with identifiers, each with its own, and with no local (another worker's client
    published it): the router has none of it."""
    h, _peers = direct()
    seven = subscribed_v5(h, "y/+", 1, identifier=7)
    nine = subscribed_v5(h, "y/z", 2 | grants.NO_LOCAL, identifier=9)
    plain = subscribed_here(h, "y/z", 0)
    h.records()
    run = p.encode_publish(b"y/z", b"a") + p.encode_publish(b"y/z", b"b")
    from_peers.deliver(h.worker, peer_frame((wire.PEER_MSG, b"y/z", b"q1"), (wire.PEER_RAW, b"y/z", run)))
    h.turn()
    assert h.records() == []
    assert delivered_to(seven) == [(b"q1", 1, [7]), (b"a", 0, [7]), (b"b", 0, [7])]
    assert delivered_to(nine) == [(b"q1", 1, [9]), (b"a", 0, [9]), (b"b", 0, [9])]
    assert [(packet.payload, packet.qos) for packet in plain.packets()] == [(b"q1", 0), (b"a", 0), (b"b", 0)]


def test_a_clean_sessions_qos2_message_goes_to_local_subscribers_and_peers_with_its_pubrec_after_their_answer() -> None:
    """Nothing reaches the router: not the message, not its PUBREL (the connection held its id)."""
    h, peers = direct()
    sub = subscribed_here(h, "t", 2)
    c = h.client("pub")
    c.send(p.encode_publish(b"t", b"once", 2, packet_id=1))
    h.turn()
    assert h.records() == []
    [delivered] = sub.packets()
    assert (delivered.kind, delivered.qos, delivered.payload) == (p.PUBLISH, 2, b"once")
    [(place, frame)] = peers.frames
    assert place == "w1" and peer_qos(frame) == [2]
    assert c.packets() == [], "PUBREC before the peer delivered"
    peers.answer("w1")
    h.turn()
    assert acks(c) == [(p.PUBREC, 1)]
    c.send(p.encode_pubrel(1))
    assert acks(c) == [(p.PUBCOMP, 1)] and h.records() == []
    assert c.conn.incoming == {}


def test_a_qos2_resend_before_pubrel_is_delivered_once_and_acknowledged_in_order() -> None:
    """A DUP resend of an id delivered here, before its PUBREC and after, gets only a PUBREC (behind a
    PUBACK still waiting for its peer); after PUBREL the id is new again."""
    h, peers = direct()
    sub = subscribed_here(h, "t", 2)
    c = h.client("pub")
    c.send(p.encode_publish(b"t", b"one", 2, packet_id=1) + p.encode_publish(b"t", b"two", 1, packet_id=2))
    c.send(p.encode_publish(b"t", b"one", 2, dup=True, packet_id=1))
    assert [packet.payload for packet in sub.packets()] == [b"one", b"two"]
    assert [peer_qos(frame) for _place, frame in peers.frames] == [[2, 1]]
    assert c.packets() == []
    peers.answer("w1")
    h.turn()
    assert acks(c) == [(p.PUBREC, 1), (p.PUBACK, 2), (p.PUBREC, 1)]
    c.send(p.encode_publish(b"t", b"one", 2, dup=True, packet_id=1))
    assert acks(c) == [(p.PUBREC, 1)] and sub.packets() == [] and len(peers.frames) == 1
    c.send(p.encode_pubrel(1))
    assert acks(c) == [(p.PUBCOMP, 1)]
    c.send(p.encode_publish(b"t", b"three", 2, packet_id=1))
    assert [packet.payload for packet in sub.packets()] == [b"three"]
    assert h.records() == []


def test_a_qos2_id_the_router_took_goes_back_to_it_when_resent_and_is_released_there() -> None:
    """`r` is served by the router too: its QoS 2 message and the resend go there (the router drops the
    duplicate), and its PUBREL becomes REL; the id delivered here gets none."""
    h, peers = direct()
    c = h.client("pub")
    c.send(p.encode_publish(b"t", b"here", 2, packet_id=1))
    peers.answer("w1")
    h.turn()
    assert acks(c) == [(p.PUBREC, 1)]
    c.send(p.encode_publish(b"r", b"routed", 2, packet_id=2))
    c.send(p.encode_publish(b"r", b"routed", 2, dup=True, packet_id=2))
    c.send(p.encode_publish(b"t", b"here", 2, dup=True, packet_id=1))  # waits its turn behind the router's
    assert [(r.kind, r.fields[1:3]) for r in h.records()] == [("PUB", (2, 2)), ("PUB", (2, 2))]
    assert c.packets() == []
    h.from_router(routed(2))
    assert acks(c) == [(p.PUBREC, 2), (p.PUBREC, 2), (p.PUBREC, 1)]
    c.send(p.encode_pubrel(1) + p.encode_pubrel(2))
    assert acks(c) == [(p.PUBCOMP, 1), (p.PUBCOMP, 2)]
    assert [(r.kind, tuple(r.fields)[1:]) for r in h.records()] == [("REL", (2,))]


def test_a_persistent_publishers_qos2_message_goes_to_the_router() -> None:
    """Its ids outlive the connection (a resend may come on the next one): the router keeps them."""
    h, peers = direct()
    c = h.client("pub", clean=False)
    c.send(p.encode_publish(b"t", b"kept", 2, packet_id=1))
    assert [(r.kind, r.fields[1:3]) for r in h.records()] == [("PUB", (1, 2))] and peers.frames == []
    h.from_router(routed(1))
    assert acks(c) == [(p.PUBREC, 1)]
    c.send(p.encode_pubrel(1))
    assert acks(c) == [(p.PUBCOMP, 1)] and [r.kind for r in h.records()] == ["REL"]


def test_a_v5_clean_sessions_qos2_messages_delivered_here_count_against_the_receive_maximum_until_pubrel() -> None:
    h, peers = direct(receive_maximum=2)
    c = h.client("pub5", version=5)
    c.send(v5.encode_publish(b"t", b"1", 2, packet_id=1) + v5.encode_publish(b"t", b"2", 2, packet_id=2))
    c.send(v5.encode_publish(b"t", b"1", 2, dup=True, packet_id=1))  # a resend: no more of the maximum
    peers.answer("w1")
    h.turn()
    assert acks(c) == [(p.PUBREC, 1), (p.PUBREC, 2), (p.PUBREC, 1)]
    c.send(v5.encode_ack(p.PUBREL, 1))
    assert acks(c) == [(p.PUBCOMP, 1)]
    c.send(v5.encode_publish(b"t", b"3", 2, packet_id=3))
    assert c.packets() == []  # room for it: not refused
    c.send(v5.encode_publish(b"t", b"4", 2, packet_id=4))
    [refused] = c.packets()
    assert refused.kind == p.DISCONNECT and refused.body[:1] == bytes((reasons.RECEIVE_MAXIMUM_EXCEEDED,))
    assert [r.kind for r in h.records()] == ["GONE"]


def test_what_goes_to_the_router_waits_until_the_peers_have_delivered_what_they_were_sent() -> None:
    """A message for the router (here to `r`, which the router serves too) must not overtake through it
    what a peer has not delivered: the router's frame waits for the peer's answer, and the QoS 0
    messages after it go to the router behind it (the router has not confirmed it: nothing skips it)."""
    h, peers = direct()
    c = h.client("pub")
    c.send(p.encode_publish(b"t", b"1"))
    h.turn()
    c.send(p.encode_publish(b"r", b"2") + p.encode_publish(b"t", b"3"))
    h.turn()
    assert h.records() == [] and len(peers.frames) == 1
    peers.answer("w1")
    h.turn()
    assert [(r.kind, r.fields[-1]) for r in h.records()] == [("PUB0", "r"), ("PUB0", "t")]
    h.from_router(routed(0, 2))
    c.send(p.encode_publish(b"t", b"4"))
    h.turn()
    assert [peer_records(frame)[0][2] for _place, frame in peers.frames[1:]] == [p.encode_publish(b"t", b"4")]


def test_a_qos1_message_for_the_router_after_one_on_its_way_to_a_peer_waits_for_it_and_so_do_the_clients_last_records() -> None:
    """Order across QoS levels, and a client that publishes and closes: its PUB and GONE leave behind the
    QoS 0 message its peer has not delivered yet, in the order they were made."""
    h, peers = direct()
    c = h.client("pub")
    c.send(p.encode_publish(b"t", b"0") + p.encode_publish(b"r", b"1", 1, packet_id=1))
    h.turn()
    assert h.records() == [] and len(peers.frames) == 1
    c.conn.close("gone")
    h.turn()
    assert h.records() == []
    peers.answer("w1")
    h.turn()
    assert [r.kind for r in h.records()] == ["PUB", "GONE"]


def test_a_peer_that_never_answers_is_taken_for_gone_after_its_patience() -> None:
    h, peers = direct()
    c = h.client("pub")
    c.send(p.encode_publish(b"t", b"1"))
    h.turn()
    c.send(p.encode_publish(b"r", b"2"))
    h.turn()
    assert h.records() == []
    h.loop.now += peer_links.PATIENCE
    peers.expire(h.loop.now)
    h.turn()
    assert [(r.kind, r.fields[-1]) for r in h.records()] == [("PUB0", "r")]


def test_other_nodes_workers_get_qos0_messages_directly_once_reached_and_qos1_ones_through_the_router() -> None:
    """A worker of node n1: n1's other workers take QoS 0 and 1 from it; another node's only QoS 0, and
    only while it reaches that worker (`RouteTables.reach`, from DIRECTORY less those shunned); any
    place it does not reach, or the router's, sends the message through the router."""
    tables = RouteTables(wire.identity("n1", 0), direct=True)
    tables.apply(True, [["", "a", ["n1/w1"]], ["", "b", ["n2/w0"]], ["", "c", ["n1/w1", "n2/w0"]],
                        ["", "d", ["n2/w0", ""]]])
    t = tables.default
    assert t.targets(b"a") == ((), ("n1/w1",), ("n1/w1",), ())
    assert t.targets(b"b") == ((), None, None, ())
    tables.reach({"n2/w0"})
    assert t.targets(b"b") == ((), ("n2/w0",), None, ())
    assert t.targets(b"c") == ((), ("n1/w1", "n2/w0"), None, ())
    assert t.targets(b"d") == ((), None, None, ())
    tables.reach(set())
    assert t.targets(b"b") == ((), None, None, ()) and t.targets(b"c") == ((), None, None, ())


def test_another_nodes_worker_that_does_not_answer_is_shunned_and_tried_again_later(tmp_path: Path) -> None:
    """Real sockets: n2/w0's endpoint has nobody listening. After PATIENCE its frame counts as answered
    (QoS 0 only goes there: dropped, at most once), its link closes and n2 is not reached (its
    messages cross the router) until RETRY has passed."""
    loop = asyncio.new_event_loop()
    reached: list[set[str]] = []
    answers: list[int] = []
    peers = peer_links.Peers(loop, str(tmp_path), b"n1/w0", lambda frame: None, lambda: answers.append(1),
                             reached.append, f"tcp://127.0.0.1:{free_port()}", curve_keys(""))
    try:
        peers.directory({"n1/w0": "tcp://127.0.0.1:1", "n2/w0": f"tcp://127.0.0.1:{free_port()}"})
        assert reached == [{"n2/w0"}]  # its own node's workers take Unix sockets, not the directory
        peers.raw("n2/w0", "", b"t", p.encode_publish(b"t", b"x"), 1, False)
        peers.send()
        assert peers.unconfirmed == 1 and not answers
        now = loop.time()
        peers.expire(now + peer_links.PATIENCE / 2)
        assert peers.unconfirmed == 1
        peers.expire(now + peer_links.PATIENCE)
        assert reached[-1] == set() and peers.unconfirmed == 0 and answers and "n2/w0" not in peers.peers
        peers.expire(now + peer_links.PATIENCE + peer_links.RETRY)
        assert reached[-1] == {"n2/w0"} and not peers.shunned
        peers.directory({})
        assert reached[-1] == set()
    finally:
        peers.close()
        loop.close()


def run_until(loop: asyncio.AbstractEventLoop, done: Callable[[], bool], what: str) -> None:
    """Turns of `loop` until `done` (10 s at most)."""
    deadline = loop.time() + 10
    while not done():
        assert loop.time() < deadline, f"no {what} in 10 s"
        loop.run_until_complete(asyncio.sleep(0.001))


def test_a_host_peers_frames_arrive_whole_and_in_order_and_are_answered_with_the_last_number(tmp_path: Path) -> None:
    """Real Unix sockets: frames of a few bytes and one of 4 MB (more than a socket takes at once, so
    written in parts as it drains, and read in parts) arrive whole, in order; the answers say so."""
    loop = asyncio.new_event_loop()
    frames: list[bytes] = []
    answers: list[int] = []
    path = host_links.inbox_path(str(tmp_path), "w1")
    inbox = host_links.HostInbox(loop, path, frames.append)
    peer = host_links.HostPeer(loop, path, lambda _peer, seq: answers.append(seq), lambda _peer: answers.append(-1))
    try:
        sent = [b"one", bytes(range(256)) * (1 << 14), b"three"]
        for seq, frame in enumerate(sent, 1):
            assert peer.send(seq, frame) is False
        assert peer.out, "4 MB taken by the socket at once: nothing was written in parts"
        run_until(loop, lambda: bool(answers) and answers[-1] == 3, "answer to the last frame")
        assert frames == sent and answers == sorted(answers) and -1 not in answers
    finally:
        peer.close()
        inbox.close()
        loop.close()
    assert not Path(path).exists()


def test_a_host_peer_that_is_gone_or_not_there_counts_as_answered_at_once(tmp_path: Path) -> None:
    """Worker w1's inbox closes (killed): what w0 sends it next counts as delivered without waiting
    for PATIENCE (nothing here calls `expire`), and so does what it sends a worker that never was."""
    loop = asyncio.new_event_loop()
    got: list[bytes] = []
    answers: list[int] = []
    w0 = peer_links.Peers(loop, str(tmp_path), b"w0", lambda frame: None, lambda: answers.append(0), lambda _: None)
    w1 = peer_links.Peers(loop, str(tmp_path), b"w1", got.append, lambda: None, lambda _: None)
    try:
        marks = w0.message(("w1",), "", b"t", b"first", None, 1)
        w0.send()
        run_until(loop, lambda: peer_links.delivered(marks), "answer from w1")
        assert len(got) == 1 and w0.unconfirmed == 0
        w1.close()
        for place in ("w1", "w9"):
            marks = w0.message((place,), "", b"t", b"lost", None, 1)
            w0.send()
            run_until(loop, partial(peer_links.delivered, marks), f"{place} taken for gone")
            assert w0.unconfirmed == 0 and place not in w0.peers
        assert len(got) == 1
    finally:
        w0.close()
        loop.close()


def pair_across(b: Broker, qos: int = 1) -> tuple[str, RawClient, RawClient, psutil.Process]:
    """A topic, its subscriber (at `qos`) on worker 1 and a publisher on worker 0, and the router, which
    has confirmed all the publisher's worker sent it (a QoS 1 PUBACK) when this returns."""
    topic = f"peers/{uid()}"
    sub = raw_on(b, want=1)
    sub.connect(f"peers-sub-{uid()}")
    assert subscribe(sub, 1, [(topic, qos)]) == [qos]
    pub = raw_on(b, want=0)
    pub.connect(f"peers-pub-{uid()}")
    publish(pub, topic, b"warm", 1)
    assert [m.payload for m in receive(sub, count=1)] == [b"warm"]
    router = b.router()
    assert router is not None
    return topic, sub, pub, router


def test_workers_deliver_to_each_other_with_the_router_stopped(start_broker: Callable[..., Broker]) -> None:
    """The router (SIGSTOP) takes no part in a QoS 0 or 1 message between clean subscribers of two
    workers: it arrives, in order, and a QoS 1 publisher has its PUBACK; with direct_delivery = false
    it waits for the router."""
    b = start_broker("--workers", "2")
    topic, sub, pub, router = pair_across(b)
    router.send_signal(signal.SIGSTOP)
    try:
        payloads = [b"m%d" % i for i in range(200)]
        for i, payload in enumerate(payloads):
            publish(pub, topic, payload, i % 2, packet_id=i + 1)  # QoS 1: its PUBACK came without the router
        assert [m.payload for m in receive(sub, payloads=payloads)] == payloads
    finally:
        router.send_signal(signal.SIGCONT)
    assert "taken for gone" not in b.output(), "a peer's answers were not read"
    for c in (sub, pub):
        c.close()


def test_a_sigkill_of_the_publishers_worker_loses_no_message_it_acknowledged_on_its_way_to_another_worker(
        start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    """A QoS 1 PUBACK leaves only once the subscriber's worker has the message (its answer), so a
    worker killed with a window of messages on their way to another worker has acknowledged none it
    had not handed over: each one acknowledged arrives (the subscriber's queue holds them all)."""
    config = tmp_path / "plexmq.toml"
    config.write_text("max_queued_messages = 100000\n")
    b = start_broker("--workers", "2", "--config", str(config))
    topic, sub, pub, _router = pair_across(b)
    victim = b.workers()[worker_of(b, pub)]
    n = 30_000  # more than it handles before the kill lands
    pub.send(b"".join(p.encode_publish(topic.encode(), b"m%05d" % i, 1, packet_id=i + 1) for i in range(n)))
    assert pub.recv()[0] == 0x40  # the first PUBACK: the rest are on their way
    victim.kill()
    rest = parse(pub.read_until_closed())
    acked = [1] + [packet.pid for packet in rest if packet.kind == p.PUBACK]
    assert acked == list(range(1, len(acked) + 1)), "PUBACKs out of order"
    assert len(acked) < n, "every message acknowledged before the kill: it tested nothing"
    got = receive(sub, payloads=[b"m%05d" % (pid - 1) for pid in acked])
    assert [m.payload for m in got][:len(acked)] == [b"m%05d" % i for i in range(len(acked))]
    sub.close()


def test_a_clean_sessions_qos2_messages_cross_workers_exactly_once_with_the_router_stopped(
        start_broker: Callable[..., Broker]) -> None:
    """Each completes (PUBREC, PUBREL, PUBCOMP) without the router, and arrives once, in order; a resend
    before PUBREL is not delivered again."""
    b = start_broker("--workers", "2")
    topic, sub, pub, router = pair_across(b, 2)
    router.send_signal(signal.SIGSTOP)
    try:
        payloads = [b"m%d" % i for i in range(100)]
        for i, payload in enumerate(payloads):
            publish(pub, topic, payload, 2, packet_id=i % 7 + 1)  # ids used again once released
        for dup in (False, True):  # the resend: only its PUBREC again
            pub.send(p.encode_publish(topic.encode(), b"last", 2, dup=dup, packet_id=9))
            assert pub.recv() == (0x50, b"\x00\x09")
        pub.send(p.encode_pubrel(9))
        assert pub.recv() == (0x70, b"\x00\x09")
        got = receive(sub, payloads=[*payloads, b"last"])
        assert [m.payload for m in got] == [*payloads, b"last"] and {m.qos for m in got} == {2}
    finally:
        router.send_signal(signal.SIGCONT)
    for c in (sub, pub):
        c.close()


def paho_v5_across(b: Broker, sub: Paho) -> tuple[Paho, list[Paho]]:
    """A 5.0 publisher on another worker than `sub`'s, and the connections that landed beside `sub` first."""
    sub_worker = b.worker_holding(sub.client.socket().getsockname()[1])  # type: ignore[union-attr]  # connected
    spare: list[Paho] = []
    while True:  # the balancer puts the next one on the less loaded worker: keep those that land beside it
        assert len(spare) < 16, "16 connections in a row on the subscriber's worker"
        pub = Paho(b.port, f"peers-pub5-{uid()}", protocol=paho.MQTTv5)
        if b.worker_holding(pub.client.socket().getsockname()[1]) != sub_worker:  # type: ignore[union-attr]  # connected
            return pub, spare
        spare.append(pub)


def stopped_router(b: Broker, topic: str, sub: Paho, pub: Paho) -> psutil.Process:
    """The router, once it has confirmed all `pub`'s worker sent it (a QoS 1 PUBACK) and `sub` has that message."""
    pub.publish(topic, b"warm", 1)
    assert sub.get().payload == b"warm"
    router = b.router()
    assert router is not None
    router.send_signal(signal.SIGSTOP)
    return router


def test_paho_v5_qos2_crosses_workers_with_the_router_stopped(start_broker: Callable[..., Broker]) -> None:
    b = start_broker("--workers", "2")
    topic = f"peers/{uid()}"
    sub = Paho(b.port, f"peers-sub5-{uid()}", protocol=paho.MQTTv5)
    assert sub.subscribe(topic, 2) == [2]
    pub, spare = paho_v5_across(b, sub)
    router = stopped_router(b, topic, sub, pub)
    try:
        payloads = [b"v5-%d" % i for i in range(50)]
        for payload in payloads:
            pub.publish(topic, payload, 2)  # waits for its PUBCOMP
        got = [sub.get() for _ in payloads]
        assert [(m.payload, m.qos) for m in got] == [(payload, 2) for payload in payloads]
    finally:
        router.send_signal(signal.SIGCONT)
    for c in (sub, pub, *spare):
        c.disconnect()


def test_paho_v5_subscription_identifiers_and_no_local_cross_workers_with_the_router_stopped(
        start_broker: Callable[..., Broker]) -> None:
    """A subscription with an identifier and no local, served by its worker: another worker's messages
    arrive with the identifier while the router is stopped, and the subscriber's own do not come back."""
    b = start_broker("--workers", "2")
    topic = f"peers/{uid()}"
    sub = Paho(b.port, f"peers-sub5-{uid()}", protocol=paho.MQTTv5)
    identifier = Properties(PacketTypes.SUBSCRIBE)
    identifier.SubscriptionIdentifier = 42
    sub.client.subscribe(topic, options=SubscribeOptions(qos=1, noLocal=True), properties=identifier)
    assert sub.subacks.get(timeout=5) == [1]
    pub, spare = paho_v5_across(b, sub)
    router = stopped_router(b, topic, sub, pub)
    try:
        payloads = [b"id-%d" % i for i in range(50)]
        for i, payload in enumerate(payloads):
            pub.publish(topic, payload, i % 2)
        got = [sub.get() for _ in payloads]
        ids = [m.properties.SubscriptionIdentifier for m in got]  # type: ignore[union-attr]  # 5.0: set
        assert [(m.payload, m.qos) for m in got] == [(payload, i % 2) for i, payload in enumerate(payloads)]
        assert ids == [[42]] * len(payloads)
        sub.publish(topic, b"its own", 1)  # PUBACK without the router
        pub.publish(topic, b"marker", 1)
        assert sub.get().payload == b"marker", "a no-local subscriber got its own message"
    finally:
        router.send_signal(signal.SIGCONT)
    for c in (sub, pub, *spare):
        c.disconnect()


def test_without_direct_delivery_the_router_carries_it(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    config = tmp_path / "plexmq.toml"
    config.write_text("direct_delivery = false\n")
    b = start_broker("--workers", "2", "--config", str(config))
    topic, sub, pub, router = pair_across(b)
    router.send_signal(signal.SIGSTOP)
    try:
        publish(pub, topic, b"via the router", 0)
        ping(pub)
        try:
            got = sub.recv(0.5)
            raise AssertionError(f"delivered while the router was stopped: {got}")
        except TimeoutError:
            pass
    finally:
        router.send_signal(signal.SIGCONT)
    assert [m.payload for m in receive(sub, count=1)] == [b"via the router"]
    for c in (sub, pub):
        c.close()


def test_a_new_table_is_acknowledged_once_the_peers_have_delivered_what_they_were_sent_before_it() -> None:
    """A SUBACK that gives a filter a new place waits for every worker's ROUTES_ACK (router/routes.py): a
    worker says it only once its peers have delivered what it sent them before, so a message published
    before that SUBSCRIBE cannot reach the new subscription late, by a peer's inbox behind its SUBACK."""
    h, peers = direct()
    c = h.client("pub")
    c.send(p.encode_publish(b"t", b"before"))
    h.from_router(routes(2, False, [["", "t", ["w1", "w2"]]]))
    assert h.records() == [], "acknowledged before w1 delivered what it was sent"
    peers.answer("w1")
    h.turn()
    assert [(r.kind, r.fields) for r in h.records()] == [("ROUTES_ACK", (2,))]
