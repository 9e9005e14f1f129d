"""A worker's connection without a broker (tests/connection_harness.py): the inbound QoS 1/2 flow
(acknowledged only once the router has routed), the outbound window (max_inflight, a 5.0 client's
Receive Maximum), the queue while the socket is backed up, what goes back to the router."""

from __future__ import annotations

from plexmq import wire
from plexmq.mqtt import properties as props
from plexmq.mqtt import reasons, v5
from plexmq.mqtt import v4 as p
from tests.connection_harness import ConnectionHarness, Packet, Record, deliver, kick, resend_rel, routed, session


def publish(topic: str, payload: bytes, qos: int = 0, pid: int = 0) -> bytes:
    return p.encode_publish(topic.encode(), payload, qos, False, False, pid)


def pids(packets: list[Packet]) -> list[int]:
    return [packet.pid for packet in packets]


# -- from the client: acknowledged once routed ------------------------------------------------------------


def test_puback_only_after_routed():
    """A QoS 1 PUBLISH goes to the router (PUB); its PUBACK only once the router says it is routed."""
    h = ConnectionHarness()
    c = h.client("pub")
    c.send(publish("t", b"x", 1, 5))
    assert c.packets() == []
    assert h.records() == [Record("PUB", (c.conn_id, 5, 1, False, "t"), b"x")]
    h.from_router(routed(1))
    assert c.packets() == [Packet(p.PUBACK, 0, 5)]


def test_acks_follow_routed_counts_in_publish_order():
    """ROUTED counts PUBs in order: each one acknowledges that many of the oldest, across clients."""
    h = ConnectionHarness()
    a, b = h.client("a"), h.client("b")
    a.send(publish("t", b"1", 1, 1))
    b.send(publish("t", b"2", 1, 1))
    a.send(publish("t", b"3", 1, 2))
    h.from_router(routed(2))
    assert a.packets() == [Packet(p.PUBACK, 0, 1)]
    assert b.packets() == [Packet(p.PUBACK, 0, 1)]
    h.from_router(routed(1))
    assert a.packets() == [Packet(p.PUBACK, 0, 2)]
    h.from_router(routed(0, 1))  # a QoS 0 record confirmed: acknowledges nothing
    assert a.packets() == [] and b.packets() == []


def test_qos2_pubrec_after_routed_then_release():
    """QoS 2: PUBREC once routed; the client's PUBREL is passed on (REL) and answered with PUBCOMP."""
    h = ConnectionHarness()
    c = h.client("pub")
    c.send(publish("t", b"x", 2, 7))
    assert c.packets() == []
    assert [r.kind for r in h.records()] == ["PUB"]
    h.from_router(routed(1))
    assert c.packets() == [Packet(p.PUBREC, 0, 7)]
    c.send(p.encode_pubrel(7))
    assert c.packets() == [Packet(p.PUBCOMP, 0, 7)]
    assert h.records() == [Record("REL", (c.conn_id, 7))]


def test_broker_receive_maximum_closes_a_client_past_it():
    """5.0: a client with more unacknowledged QoS 1/2 PUBLISHes than the broker's Receive Maximum is
    closed with 0x93; up to it, they wait for ROUTED."""
    h = ConnectionHarness(receive_maximum=2)
    c = h.client("pub", version=5)
    c.send(v5.encode_publish(b"t", b"1", 1, packet_id=1) + v5.encode_publish(b"t", b"2", 1, packet_id=2))
    assert c.packets() == [] and not c.transport.closed
    h.from_router(routed(2))
    assert pids(c.packets()) == [1, 2]  # the window is free again
    c.send(b"".join(v5.encode_publish(b"t", b"%d" % n, 1, packet_id=n) for n in (3, 4, 5)))
    [disconnect] = c.packets()
    assert disconnect.kind == p.DISCONNECT and disconnect.body[0] == reasons.RECEIVE_MAXIMUM_EXCEEDED
    assert c.transport.closed


def test_v5_qos0_publishes_take_the_raw_path_only_with_an_empty_property_block():
    """5.0 QoS 0: a PUBLISH whose property block is empty joins the raw run (one PUB0_V5 record for the
    run, the packets as they came); one with properties goes alone, decoded (PUB); one that ends
    before its property length is malformed: DISCONNECT 0x81, and what came before it is routed."""
    h = ConnectionHarness()
    c = h.client("pub", version=5)
    plain = v5.encode_publish(b"t", b"1", 0) + v5.encode_publish(b"t", b"2", 0)
    told = v5.encode_publish(b"t", b"3", 0, properties={props.CONTENT_TYPE: "text/plain"})
    c.send(plain + told + v5.encode_publish(b"t", b"4", 0))
    h.turn()
    assert [(r.kind, r.fields) for r in h.records()] == [("PUB0_V5", (2, c.conn_id, "t")), ("PUB", (c.conn_id, 0, 0, False, "t")),
                                                         ("PUB0_V5", (1, c.conn_id, "t"))]
    c.send(v5.encode_publish(b"t", b"5", 0) + bytes.fromhex("3003 0001") + b"t")  # no property length at all
    h.turn()
    assert [(r.kind, r.fields) for r in h.records()] == [("PUB0_V5", (1, c.conn_id, "t")), ("GONE", (c.conn_id, True))]
    [disconnect] = c.packets()
    assert disconnect.kind == p.DISCONNECT and disconnect.body[0] == reasons.MALFORMED_PACKET


# -- to the client: the window --------------------------------------------------------------------------------


def test_window_holds_max_inflight_and_pumps_on_puback():
    """A clean session's QoS 1 deliveries (numbered by the worker): max_inflight in flight, the rest
    queued, one more written per PUBACK, in order; nothing goes back to the router for them."""
    h = ConnectionHarness(max_inflight=2)
    c = h.client("sub")
    h.from_router(*[deliver(b"t", b"%d" % n, 1, [(c.conn_id, 1, 0)]) for n in range(5)])
    written = c.packets()
    assert [(m.pid, m.payload) for m in written] == [(1, b"0"), (2, b"1")]
    c.send(p.encode_puback(2))
    assert [(m.pid, m.payload) for m in c.packets()] == [(3, b"2")]
    c.send(p.encode_puback(1) + p.encode_puback(3))
    assert [(m.pid, m.payload) for m in c.packets()] == [(4, b"3"), (5, b"4")]
    assert h.records() == []


def test_qos0_is_not_held_by_the_window_when_nothing_waits():
    h = ConnectionHarness(max_inflight=1)
    c = h.client("sub")
    h.from_router(deliver(b"t", b"a", 1, [(c.conn_id, 1, 0)]), deliver(b"t", b"b", 0, [(c.conn_id, 0, 0)]))
    assert [(m.qos, m.payload) for m in c.packets()] == [(1, b"a"), (0, b"b")]


def test_queued_qos0_keeps_its_place_behind_a_full_window():
    """Once something waits, everything queues behind it (QoS 0 too): the order is kept."""
    h = ConnectionHarness(max_inflight=1)
    c = h.client("sub")
    h.from_router(deliver(b"t", b"a", 1, [(c.conn_id, 1, 0)]), deliver(b"t", b"b", 1, [(c.conn_id, 1, 0)]),
                  deliver(b"t", b"c", 0, [(c.conn_id, 0, 0)]))
    assert [m.payload for m in c.packets()] == [b"a"]
    c.send(p.encode_puback(1))
    assert [m.payload for m in c.packets()] == [b"b", b"c"]


def test_client_receive_maximum_narrows_the_window():
    """5.0: the client's Receive Maximum below max_inflight is its window."""
    h = ConnectionHarness(max_inflight=10)
    c = h.client("sub", version=5, properties={props.RECEIVE_MAXIMUM: 1})
    h.from_router(*[deliver(b"t", b"%d" % n, 1, [(c.conn_id, 1, 0)]) for n in range(3)])
    assert [m.payload for m in c.packets()] == [b"0"]
    c.send(v5.encode_ack(p.PUBACK, 1))
    assert [m.payload for m in c.packets()] == [b"1"]


def test_the_window_goes_to_the_router_and_a_bridges_is_its_receive_maximum():
    """A connection's CONNECT tells the router its window (its session's there): max_inflight, a 5.0
    client's Receive Maximum below it; a bridge's is the Receive Maximum it asks for, above max_inflight."""
    h = ConnectionHarness(max_inflight=10, bridges={"plexmq-bridge-b": (b"token", "")})
    windows = []
    for client_id, password, receive_maximum in (("plain", None, 50), ("small", None, 5), ("plexmq-bridge-b", b"token", 50)):
        c = h.open()
        c.send(v5.encode_connect(client_id, False, 60, password=password, protocol_level=5,
                                 properties={props.RECEIVE_MAXIMUM: receive_maximum, props.SESSION_EXPIRY_INTERVAL: 60}))
        [connect] = h.records()
        windows.append(wire.Connect(*connect.fields).window)
    assert windows == [10, 5, 50]
    h.from_router(session(c.conn_id, False))
    c.packets()
    h.from_router(*[deliver(b"t", b"%d" % n, 1, [(c.conn_id, 1, wire.ROUTER_PIDS_FROM + n)]) for n in range(60)])
    assert len(c.packets()) == 50


def test_paused_transport_queues_and_resumes_in_order():
    """While the transport is backed up, deliveries queue (bounded: QoS 0 is dropped first) and the
    client is not read; once it drains, they are written in order."""
    h = ConnectionHarness(max_inflight=10, max_queued=3)
    c = h.client("sub")
    c.pause_writing()
    assert not c.transport.reading
    h.from_router(deliver(b"t", b"q0", 0, [(c.conn_id, 0, 0)]), deliver(b"t", b"a", 1, [(c.conn_id, 1, 0)]),
                  deliver(b"t", b"b", 1, [(c.conn_id, 1, 0)]), deliver(b"t", b"c", 1, [(c.conn_id, 1, 0)]))
    assert c.packets() == []
    assert h.worker.counters.dropped == 1  # the QoS 0 one made room
    c.resume_writing()
    assert c.transport.reading
    assert [(m.qos, m.pid, m.payload) for m in c.packets()] == [(1, 1, b"a"), (1, 2, b"b"), (1, 3, b"c")]


# -- a persistent session: the router numbers, the worker reports acks ---------------------------------------


def test_persistent_acks_go_to_the_router():
    """Deliveries the router numbered: PUBACK, PUBREC and PUBCOMP go back as ACK records (PUBREC as
    ACK_RECEIVED, with the PUBREL written at once)."""
    h = ConnectionHarness()
    c = h.client("dev", clean=False)
    h.from_router(deliver(b"t", b"one", 1, [(c.conn_id, 1, 3)]), deliver(b"t", b"two", 2, [(c.conn_id, 2, 4)]))
    assert [(m.qos, m.pid) for m in c.packets()] == [(1, 3), (2, 4)]
    c.send(p.encode_puback(3) + p.encode_pubrec(4))
    assert c.packets() == [Packet(p.PUBREL, 2, 4)]
    c.send(p.encode_pubcomp(4))
    assert h.records() == [Record("ACK", (c.conn_id, 3, wire.ACK_DONE)), Record("ACK", (c.conn_id, 4, wire.ACK_RECEIVED)),
                           Record("ACK", (c.conn_id, 4, wire.ACK_DONE))]


def test_resend_after_reconnect_keeps_ids_and_dup_and_fills_the_window():
    """What the router resends to a resumed session: the PUBLISHes with their ids and DUP, the
    PUBREL of a received QoS 2 message; they count in the window, so a new message waits."""
    h = ConnectionHarness(max_inflight=3)
    c = h.client("dev", clean=False, present=True)
    h.from_router(resend_rel(c.conn_id, 1), deliver(b"t", b"a", 1, [(c.conn_id, 1, 2)], dup=True),
                  deliver(b"t", b"b", 2, [(c.conn_id, 2, 3)], dup=True), deliver(b"t", b"new", 1, [(c.conn_id, 1, 4)]))
    written = c.packets()
    assert [(m.kind, m.pid, m.dup) for m in written] == [(p.PUBREL, 1, False), (p.PUBLISH, 2, True),
                                                         (p.PUBLISH, 3, True)]
    c.send(p.encode_pubcomp(1))
    assert [(m.kind, m.pid, m.dup, m.payload) for m in c.packets()] == [(p.PUBLISH, 4, False, b"new")]
    assert h.records() == [Record("ACK", (c.conn_id, 1, wire.ACK_DONE))]


def test_kick_closes_quietly_then_says_kicked():
    """KICK (a takeover): the connection closes without GONE (the router handled its will), and
    KICKED follows its last records."""
    h = ConnectionHarness()
    c = h.client("dev", clean=False)
    h.from_router(deliver(b"t", b"x", 1, [(c.conn_id, 1, 9)]))
    c.send(p.encode_puback(9))
    h.from_router(kick(c.conn_id))
    assert c.transport.closed
    assert h.records() == [Record("ACK", (c.conn_id, 9, wire.ACK_DONE)), Record("KICKED", (c.conn_id,))]


def test_session_answer_sends_the_connack_and_registers():
    """A persistent session's CONNECT waits for the router: CONNACK (session present as it says) only
    at SESSION."""
    h = ConnectionHarness()
    c = h.open()
    c.send(p.encode_connect("dev", False, 60))
    assert c.packets() == []
    [connect] = h.records()
    assert connect.kind == "CONNECT" and connect.fields[:3] == (c.conn_id, "dev", True)  # persistent
    h.from_router(session(c.conn_id, True))
    [connack] = c.packets()
    assert connack.kind == p.CONNACK and p.decode_connack(0, connack.body) == (True, 0)


def test_what_follows_a_connect_waits_for_the_session_and_goes_on_in_order():
    """A client may send on right after its CONNECT [MQTT-3.1.4]: what follows waits, the socket no longer
    read, until the router has answered the CONNECT (a SUBSCRIBE needs the session there, which a takeover
    from another worker may still hold), then goes on in order."""
    h = ConnectionHarness()
    c = h.open()
    c.send(p.encode_connect("dev", False, 60) + p.encode_subscribe(1, [("t/#", 1)]) + publish("t/a", b"x", 1, 7))
    assert [r.kind for r in h.records()] == ["CONNECT"] and c.packets() == []
    assert not c.transport.reading
    c.send(publish("t/b", b"y"))  # what the socket still had
    assert h.records() == [] and c.packets() == []
    h.from_router(session(c.conn_id, False))
    assert [packet.kind for packet in c.packets()] == [p.CONNACK]
    assert [r.kind for r in h.records()] == ["SUBSCRIBE", "PUB", "PUB0"]
    assert c.transport.reading
