"""The router core without a broker (tests/router_harness.py): the orderings and windows of sessions
and QoS that the end-to-end tests can only reach through timing: takeover, the resend after a
reconnect, the window, a shared group's re-share, the commit before an acknowledgement."""

from __future__ import annotations

from plexmq import wire
from plexmq.router.outbox import QUEUED, SENT
from plexmq.wire import Kick, ResendRel, Session, Suback, Unsuback
from tests.router_harness import Deliver, Routed, RouterHarness, Sub, routed_of


def connected(h: RouterHarness, end, conn: int, client_id: str, clean: bool = True, subs=()) -> None:
    """A client on `end` with its SESSION (and its SUBACK when it subscribes), the inbox emptied."""
    end.connect(conn, client_id, clean)
    h.turn()
    assert Session(conn, False, []) in end.take()
    if subs:
        end.subscribe(conn, 1, list(subs))
        h.turn()
        assert [r[:3] for r in end.take() if isinstance(r, Suback)] == \
            [(conn, 1, [g & 3 for _, g in subs])]  # conn, packet id, codes


# -- takeover ---------------------------------------------------------------------------------------


def test_takeover_from_another_worker_waits_for_kicked():
    """A second CONNECT of a client id on another worker: KICK to the old connection's worker; the
    new connection's SESSION comes only once that worker said the old one is closed (KICKED), so
    the acknowledgement it sent before (in flight to the router) still counts: the acked message is
    not sent again."""
    h = RouterHarness()
    w0, w1, pub = h.worker("w0"), h.worker("w1"), h.worker("w2")
    connected(h, pub, 9, "publisher")  # a connection the router knows (its tenant)
    connected(h, w0, 1, "dev", clean=False, subs=[("t", 1)])
    pub.pub(9, "t", b"m1", qos=1, pid=1)
    pub.pub(9, "t", b"m2", qos=1, pid=2)
    h.turn()
    assert w0.delivered(1) == [(b"t", b"m1", 1, False, 1), (b"t", b"m2", 1, False, 2)]

    w1.connect(5, "dev", clean=False)
    h.turn()
    assert w0.take() == [Kick(1)]
    assert w1.take() == []  # no SESSION while the old connection may still have records on their way

    w0.ack(1, 1)  # the PUBACK the old connection got before it closed
    w0.kicked(1)
    h.turn()
    assert w1.take() == [Session(5, True, [["t", 1]]),
                         Deliver(b"t", b"m2", 1, False, True, (Sub(5, 1, 2),))]  # only m2, again, with DUP
    assert w0.take() == []


def test_takeover_goes_on_at_gone_too():
    """The old connection closed by itself before its KICK arrived: its GONE lets the takeover go on
    (and its will out, as at any takeover)."""
    h = RouterHarness()
    w0, w1, watcher = h.worker("w0"), h.worker("w1"), h.worker("w2")
    connected(h, watcher, 3, "watcher", subs=[("will/#", 0)])
    w0.connect(1, "dev", clean=False, will=("will/dev", b"bye", 0, False))
    h.turn()
    w0.take()
    w1.connect(5, "dev", clean=False)
    h.turn()
    assert w0.take() == [Kick(1)]
    assert w1.take() == [] and watcher.take() == []
    w0.gone(1, publish_will=True)
    h.turn()
    assert w1.take() == [Session(5, True, [])]
    assert watcher.delivered(3) == [(b"will/dev", b"bye", 0, False, 0)]


def test_takeover_on_the_same_worker_is_at_once():
    """On the same worker the records of both connections are in order: SESSION in the same turn as
    the KICK, which comes first."""
    h = RouterHarness()
    w0 = h.worker("w0")
    connected(h, w0, 1, "dev", clean=False)
    w0.connect(2, "dev", clean=False)
    h.turn()
    assert w0.take() == [Kick(1), Session(2, True, [])]


def test_a_newer_connection_wins_over_one_waiting_to_take_over():
    """Two takeovers in a row: the first one waiting is kicked, the newest gets the session."""
    h = RouterHarness()
    w0, w1, w2 = h.worker("w0"), h.worker("w1"), h.worker("w2")
    connected(h, w0, 1, "dev", clean=False)
    w1.connect(5, "dev", clean=False)
    h.turn()
    w2.connect(7, "dev", clean=False)
    h.turn()
    assert w0.take() == [Kick(1), Kick(1)]
    assert w1.take() == [Kick(5)]
    w0.kicked(1)
    h.turn()
    assert w2.take() == [Session(7, True, [])]
    assert w1.take() == []


def test_a_clean_connections_record_that_comes_after_a_later_claim_is_kicked_and_the_newer_one_kept():
    """A new clean session's worker sends the CONNACK itself and its CONNECT after it, and neither such
    CONNECT waits for the other workers: the client's next clean connection, claimed later on another
    worker of the host, may reach the router first. The one claimed later keeps the client id; the older,
    late one is taken over."""
    h = RouterHarness()
    w0, w1 = h.worker("w0"), h.worker("w1")
    w1.connect(5, "dev", connack_sent=1, claimed=200)
    w1.subscribe(5, 1, [("t", 1)])
    w0.connect(1, "dev", connack_sent=1, claimed=100)
    h.turn()
    assert w0.take() == [Kick(1)]
    assert not any(isinstance(r, Kick) for r in w1.take())
    session = h.router.default.sessions["dev"]
    assert (session.worker, session.conn_id, list(session.subs)) == (w1.identity, 5, ["t"])


def test_a_claim_later_than_the_live_ones_takes_the_session_over_and_one_between_it_and_a_waiting_one_is_kicked():
    h = RouterHarness()
    w0, w1, w2 = h.worker("w0"), h.worker("w1"), h.worker("w2")
    w1.connect(5, "dev", clean=False, claimed=200)
    h.turn()
    w1.take()
    w2.connect(7, "dev", clean=False, claimed=400)  # later: it waits for the KICKED of w1's
    h.turn()
    assert w1.take() == [Kick(5)] and w2.take() == []
    w0.connect(1, "dev", connack_sent=1, claimed=300)  # later than w1's, earlier than w2's waiting one
    h.turn()
    assert w0.take() == [Kick(1)] and w1.take() == []
    w1.kicked(5)
    h.turn()
    assert w2.take() == [Session(7, True, [])]


def test_claims_of_two_hosts_are_taken_in_the_order_their_records_come():
    """Another host's clock is not this one's: a node's claim is not compared with the router host's."""
    h = RouterHarness()
    here, there = h.worker("w0"), h.worker("n1", node="edge")
    here.connect(5, "dev", clean=False, claimed=200)
    h.turn()
    here.take()
    there.connect(1, "dev", connack_sent=1, claimed=100)
    h.turn()
    assert here.take() == [Kick(5)] and there.take() == []


def test_a_connect_that_resumes_a_session_waits_until_the_hosts_other_workers_have_answered_a_sync():
    """The client connected clean on w1 (whose CONNECT follows its CONNACK), left, and resumes on w2: the
    router holds w2's CONNECT until w0 and w1 have answered a SYNC sent after it, so w1's clean start is
    read first and the old session is gone (session present 0)."""
    h = RouterHarness()
    w0, w1, w2 = h.worker("w0"), h.worker("w1"), h.worker("w2")
    connected(h, w0, 1, "dev", clean=False, subs=[("t", 1)])
    w0.gone(1)
    h.turn()
    w1.take(everything=True)
    w1.answers_syncs = False
    w2.connect(5, "dev", clean=False, claimed=200)
    h.turn()
    assert w2.take() == []
    [sync] = [r for r in w1.take(everything=True) if isinstance(r, wire.Sync)]
    w1.connect(3, "dev", connack_sent=1, claimed=100)  # sent before the SYNC came
    w1.gone(3, publish_will=False)
    w1.synced(sync.number)
    h.turn()
    assert w2.take() == [Session(5, False, [])]


def test_a_held_connect_goes_on_when_a_worker_cannot_answer_and_is_dropped_when_its_connection_ends():
    h = RouterHarness()
    w0, w1 = h.worker("w0"), h.worker("w1")
    connected(h, w0, 1, "dev", clean=False)
    w0.gone(1)
    w0.answers_syncs = False
    w1.connect(5, "dev", clean=False)
    h.turn()
    assert w1.take() == []
    h.router.link_broken(w0.identity)  # its frames went missing: it answers nothing until it joins again
    h.turn()
    assert w1.take() == [Session(5, True, [])]
    w1.gone(5)
    w1.connect(6, "dev", clean=False)
    w1.gone(6)  # it left before the SYNC was answered: its CONNECT is not taken
    h.turn()
    w0.synced(h.router.claims.asked)
    h.turn()
    assert w1.take() == [] and h.router.default.sessions["dev"].worker is None


def test_only_the_workers_of_the_connects_own_host_are_waited_for():
    h = RouterHarness()
    here, there = h.worker("w0"), h.worker("n1", node="edge")
    there.answers_syncs = False
    here.connect(5, "dev", clean=False)
    h.turn()
    assert here.take() == [Session(5, False, [])]  # in the same turn
    assert not any(isinstance(r, wire.Sync) for r in there.take(everything=True))


# -- the resend after a reconnect, and the window ------------------------------------------------------


def test_resend_after_reconnect_in_order_with_dup_then_window():
    """What a persistent session had in flight comes again first, in order, with its packet ids and
    DUP; what waited for room follows, without DUP, only as acks make room (the window is recounted
    from what was in flight, not carried over)."""
    h = RouterHarness(max_inflight=2)
    w0, w1, pub = h.worker("w0"), h.worker("w1"), h.worker("w2")
    connected(h, pub, 9, "publisher")  # a connection the router knows (its tenant)
    connected(h, w0, 1, "dev", clean=False, subs=[("t", 1)])
    for n in range(1, 5):
        pub.pub(9, "t", b"m%d" % n, qos=1, pid=n)
    h.turn()
    assert w0.delivered(1) == [(b"t", b"m1", 1, False, 1), (b"t", b"m2", 1, False, 2)]  # the window: 2
    w0.gone(1)
    pub.pub(9, "t", b"m5", qos=1, pid=5)  # while offline: queued behind the others
    h.turn()

    w1.connect(4, "dev", clean=False)
    h.turn()
    records = w1.take()
    assert records[0] == Session(4, True, [["t", 1]])
    assert [(r.payload, r.dup, r.subs) for r in records[1:]] == [(b"m1", True, (Sub(4, 1, 1),)),
                                                                   (b"m2", True, (Sub(4, 1, 2),))]
    w1.ack(4, 2)  # out of order: room for one
    h.turn()
    assert w1.delivered(4) == [(b"t", b"m3", 1, False, 3)]
    w1.ack(4, 1)
    w1.ack(4, 3)
    h.turn()
    assert w1.delivered(4) == [(b"t", b"m4", 1, False, 4), (b"t", b"m5", 1, False, 5)]
    w1.ack(4, 4)
    w1.ack(4, 5)
    h.turn()
    assert w1.take() == []
    assert not h.router.default.sessions["dev"].unacked


def test_window_holds_max_inflight_and_opens_one_per_ack():
    """Only max_inflight deliveries of a persistent session are in flight; each ack lets exactly
    the next one go, in the order kept."""
    h = RouterHarness(max_inflight=3)
    w0, pub = h.worker("w0"), h.worker("w1")
    connected(h, pub, 9, "publisher")  # a connection the router knows (its tenant)
    connected(h, w0, 1, "dev", clean=False, subs=[("t", 1)])
    for n in range(1, 8):
        pub.pub(9, "t", b"%d" % n, qos=1, pid=n)
    h.turn()
    assert [pid for *_, pid in w0.delivered(1)] == [1, 2, 3]
    w0.ack(1, 99)  # an id not in flight frees nothing
    h.turn()
    assert w0.delivered(1) == []
    w0.ack(1, 2)
    h.turn()
    assert w0.delivered(1) == [(b"t", b"4", 1, False, 4)]
    w0.ack(1, 1)
    w0.ack(1, 3)
    h.turn()
    assert [pid for *_, pid in w0.delivered(1)] == [5, 6]
    session = h.router.default.sessions["dev"]
    assert session.inflight == 3 and list(session.queued) == [7]


def test_a_session_has_the_window_its_connection_says():
    """The window a CONNECT says is its session's: a 5.0 client's Receive Maximum below max_inflight
    (5 of 10), a bridge's above it (30); max_queued_messages are kept beyond it, the rest dropped."""
    h = RouterHarness(max_inflight=10, max_queued=4)
    small, bridge, pub = h.worker("w0"), h.worker("w1"), h.worker("w2")
    connected(h, pub, 9, "publisher")  # a connection the router knows (its tenant)
    for end, window in ((small, 5), (bridge, 30)):
        end.connect(1, f"dev{window}", clean=False, window=window)
        h.turn()  # a worker sends what follows a CONNECT once the router has answered it
        end.subscribe(1, 1, [("t", 1)])
        h.turn()
        end.take()
    for n in range(1, 41):
        pub.pub(9, "t", b"%d" % n, qos=1, pid=n)
    h.turn()
    assert [pid for *_, pid in small.delivered(1)] == [1, 2, 3, 4, 5]
    assert [pid for *_, pid in bridge.delivered(1)] == list(range(1, 31))
    kept = [len(h.router.default.sessions[client_id].unacked) for client_id in ("dev5", "dev30")]
    assert kept == [5 + 4, 30 + 4]
    small.ack(1, 2)
    h.turn()
    assert [pid for *_, pid in small.delivered(1)] == [6]  # one ack, one more: the window stays 5


def test_qos2_resend_after_reconnect_is_pubrel_for_what_was_received():
    """A QoS 2 delivery the client acknowledged with PUBREC comes back as RESEND_REL (PUBREL), one
    it had not as the PUBLISH again with DUP, in the order they were kept."""
    h = RouterHarness()
    w0, pub = h.worker("w0"), h.worker("w1")
    connected(h, pub, 9, "publisher")  # a connection the router knows (its tenant)
    connected(h, w0, 1, "dev", clean=False, subs=[("t", 2)])
    pub.pub(9, "t", b"a", qos=2, pid=1)
    pub.pub(9, "t", b"b", qos=2, pid=2)
    h.turn()
    assert [pid for *_, pid in w0.delivered(1)] == [1, 2]
    w0.ack(1, 1, wire.ACK_RECEIVED)
    w0.gone(1)
    w0.connect(2, "dev", clean=False)
    h.turn()
    assert w0.take() == [Session(2, True, [["t", 2]]), ResendRel(2, 1),
                         Deliver(b"t", b"b", 2, False, True, (Sub(2, 2, 2),))]


def test_resend_after_router_restart_comes_from_the_store(tmp_path):
    """Queued messages of an offline persistent session survive a router restart (they were
    committed), and come back in order with their packet ids."""
    h = RouterHarness(tmp_path)
    w0, pub = h.worker("w0"), h.worker("w1")
    connected(h, pub, 9, "publisher")  # a connection the router knows (its tenant)
    connected(h, w0, 1, "dev", clean=False, subs=[("t", 1)])
    w0.gone(1)
    for n in range(1, 4):
        pub.pub(9, "t", b"m%d" % n, qos=1, pid=n)
    h.turn()
    assert [(pid, payload, state) for pid, _, payload, _, state in h.stored_messages("dev")] == \
        [(1, b"m1", QUEUED), (2, b"m2", QUEUED), (3, b"m3", QUEUED)]

    h = h.restart()
    w0 = h.worker("w0")
    w0.connect(1, "dev", clean=False)
    h.turn()
    assert w0.take() == [Session(1, True, [["t", 1]])] + [
        Deliver(b"t", b"m%d" % n, 1, False, False, (Sub(1, 1, n),)) for n in range(1, 4)]


# -- shared subscriptions -----------------------------------------------------------------------------


def test_shared_group_reshares_unacked_messages_of_a_member_that_leaves():
    """A member of a shared group leaves with messages it has not acknowledged: they go to another
    member (numbered by the router), those it acknowledged do not."""
    h = RouterHarness()
    wa, wb, pub = h.worker("w0"), h.worker("w1"), h.worker("w2")
    connected(h, pub, 9, "publisher")  # a connection the router knows (its tenant)
    connected(h, wa, 1, "a", subs=[("$share/g/t", 1)])
    connected(h, wb, 2, "b", subs=[("$share/g/t", 1)])
    for n in range(1, 5):
        pub.pub(9, "t", b"m%d" % n, qos=1, pid=n)
    h.turn()
    to_a, to_b = wa.delivered(1), wb.delivered(2)
    assert [m[1] for m in to_a] == [b"m1", b"m3"] and [m[1] for m in to_b] == [b"m2", b"m4"]  # round robin
    assert all(pid >= wire.ROUTER_PIDS_FROM for *_, pid in to_a + to_b)
    wa.ack(1, to_a[0][4])  # m1 is done
    wa.gone(1)
    h.turn()
    moved = wb.delivered(2)
    assert [(topic, payload, qos, dup) for topic, payload, qos, dup, _ in moved] == [(b"t", b"m3", 1, False)]
    assert moved[0][4] >= wire.ROUTER_PIDS_FROM and moved[0][4] not in {pid for *_, pid in to_b}
    wb.ack(2, moved[0][4])
    h.turn()
    assert not h.router.default.sessions["b"].unacked.keys() - {pid for *_, pid in to_b}


def test_shared_group_keeps_what_a_member_received_with_pubrec():
    """A QoS 2 message the leaving member acknowledged with PUBREC is the client's: not re-shared."""
    h = RouterHarness()
    wa, wb, pub = h.worker("w0"), h.worker("w1"), h.worker("w2")
    connected(h, pub, 9, "publisher")  # a connection the router knows (its tenant)
    connected(h, wa, 1, "a", subs=[("$share/g/t", 2)])
    connected(h, wb, 2, "b", subs=[("$share/g/t", 2)])
    pub.pub(9, "t", b"x", qos=2, pid=1)
    h.turn()
    [(_, _, _, _, pid)] = wa.delivered(1)
    wb.take()
    wa.ack(1, pid, wire.ACK_RECEIVED)
    wa.gone(1)
    h.turn()
    assert wb.take() == []


# -- the commit before the acknowledgements ---------------------------------------------------------------


def test_publishers_ack_leaves_after_the_commit_that_keeps_the_message(tmp_path):
    """A QoS 1 message for a persistent session: its DELIVER may leave before the commit (the window
    does not wait for the disk), the publisher's ROUTED (its PUBACK) only after the commit, when the
    store has the message."""
    h = RouterHarness(tmp_path)
    w0, pub = h.worker("w0"), h.worker("w1")
    connected(h, pub, 9, "publisher")  # a connection the router knows (its tenant)
    connected(h, w0, 1, "dev", clean=False, subs=[("t", 1)])
    assert h.commits and not h.sent[-1].uncommitted  # the SUBACK of a persistent session, after its commit
    pub.pub(9, "t", b"kept", qos=1, pid=7)
    commits = h.commits
    sent = h.turn()
    assert h.commits == commits + 1
    [deliver] = [s for s in sent if any(isinstance(r, Deliver) for r in s.records)]
    [routed] = [s for s in sent if routed_of(s.records)]
    assert deliver.worker == b"w0" and deliver.uncommitted
    assert routed.worker == b"w1" and not routed.uncommitted and routed_of(routed.records) == Routed(1, 1)
    assert sent.index(routed) > sent.index(deliver)
    assert h.stored_messages("dev") == [(1, b"t", b"kept", 1, SENT)]


def test_qos2_delivery_waits_for_the_commit(tmp_path):
    """A QoS 2 delivery leaves only once the publisher's PUBREC could (the publisher will not send it
    again): after the commit."""
    h = RouterHarness(tmp_path)
    w0, pub = h.worker("w0"), h.worker("w1")
    connected(h, pub, 9, "publisher")  # a connection the router knows (its tenant)
    connected(h, w0, 1, "dev", clean=False, subs=[("t", 2)])
    pub.pub(9, "t", b"once", qos=2, pid=7)
    sent = h.turn()
    [deliver] = [s for s in sent if any(isinstance(r, Deliver) for r in s.records)]
    assert not deliver.uncommitted
    assert h.stored_messages("dev") == [(1, b"t", b"once", 2, SENT)]


def test_every_acknowledgement_leaves_after_the_commit(tmp_path):
    """Over a session's life (connect, subscribe, publish, ack, unsubscribe, reconnect), no SESSION,
    SUBACK, UNSUBACK or ROUTED leaves while the store has changes not committed."""
    h = RouterHarness(tmp_path, max_inflight=1)
    w0, w1, pub = h.worker("w0"), h.worker("w1"), h.worker("w2")
    connected(h, pub, 9, "publisher")  # a connection the router knows (its tenant)
    connected(h, w0, 1, "dev", clean=False, subs=[("t", 1), ("u", 2)])
    for n in range(3):
        pub.pub(9, "t", b"%d" % n, qos=1, pid=n + 1)
        pub.pub(9, "u", b"%d" % n, qos=2, pid=n + 10)
    h.turn()
    w0.ack(1, 1)
    w0.unsubscribe(1, 2, ["u"])
    h.turn()
    w0.gone(1)
    w1.connect(3, "dev", clean=False)
    h.turn()
    acks = [s for s in h.sent if any(isinstance(r, (Session, Suback, Unsuback, Routed)) for r in s.records)]
    assert len(acks) >= 5
    assert not [s for s in acks if s.uncommitted]


# -- where a subscription is served ------------------------------------------------------------------


def test_a_clean_sessions_subscriptions_with_mqtt5_options_are_placed_on_its_worker_and_a_persistent_ones_with_the_router():
    """Its worker resolves no local, retain as published and identifiers itself (workers/routes.py): the
    SUBACK places each there with its routing grant (retain handling left out); a shared one and those
    of a persistent session stay the router's."""
    h = RouterHarness()
    w0 = h.worker("w0")
    connected(h, w0, 1, "clean")
    options = [("a", 1 | 0x04), ("b", 2 | 0x08 | 0x20 | 7 << 8), ("$share/g/c", 1), ("d", 0)]
    w0.subscribe(1, 1, options)
    h.turn()
    [placed] = [r.placed for r in w0.take() if isinstance(r, Suback)]
    assert placed == [["a", 5], ["b", 2 | 0x08 | 7 << 8], ["$share/g/c", -1], ["d", 0]]
    connected(h, w0, 2, "durable", clean=False)
    w0.subscribe(2, 1, options[:2])
    h.turn()
    assert [r.placed for r in w0.take() if isinstance(r, Suback)] == [[["a", -1], ["b", -1]]]
