"""Tenants in the router core (tests/router_harness.py; docs/architecture.md, issue 23): each tenant
is a partition of its own (sessions, subscriptions, retained messages, shared groups, wills, the
store), and a connection's tenant is the one its CONNECT named."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from plexmq.router.listing import ClientDisconnect
from plexmq.wire import Close, Kick, Routes, Session, Suback
from tests.router_harness import Deliver, DeliverRaw, RouterHarness, Sub, WorkerEnd


def connected(h: RouterHarness, end: WorkerEnd, conn: int, client_id: str, tenant: str, clean: bool = True,
              subs: tuple[tuple[str, int], ...] = (), **connect: Any) -> None:
    """A client of `tenant` on `end` with its SESSION (and SUBACK), the inbox emptied."""
    end.connect(conn, client_id, clean, tenant=tenant, **connect)
    h.turn()
    assert Session(conn, False, []) in end.take()
    if subs:
        end.subscribe(conn, 1, list(subs))
        h.turn()
        assert [r[:2] for r in end.take() if isinstance(r, Suback)] == [(conn, 1)]


def payloads(end: WorkerEnd) -> list[tuple[int, bytes]]:
    """(connection, payload) of every DELIVER in the inbox, which is emptied."""
    return [(sub.conn, r.payload) for r in end.take() if isinstance(r, Deliver) for sub in r.subs]


def test_the_same_client_id_in_two_tenants_is_two_sessions_and_takeover_stays_within_one() -> None:
    h = RouterHarness()
    w0, w1 = h.worker("w0"), h.worker("w1")
    connected(h, w0, 1, "dev", "a")
    connected(h, w1, 2, "dev", "b")  # no KICK: another tenant's client
    assert w0.take() == [] and w1.take() == []
    assert h.router.tenants["a"].sessions["dev"] is not h.router.tenants["b"].sessions["dev"]
    w1.connect(3, "dev", tenant="a")  # the same worker: a takeover at once
    h.turn()
    assert Kick(2) not in w1.take() and Kick(1) in w0.take()
    assert h.router.tenants["b"].sessions["dev"].conn_id == 2


def test_a_message_reaches_only_its_tenants_subscribers_both_ways() -> None:
    h = RouterHarness()
    w0 = h.worker("w0")
    for conn, tenant in ((1, "a"), (2, "b")):
        connected(h, w0, conn, "exact", tenant, subs=(("a/b", 1),))
        connected(h, w0, conn + 10, "all", tenant, subs=(("#", 0),))
    connected(h, w0, 3, "pub-a", "a")
    connected(h, w0, 4, "pub-b", "b")
    w0.pub(3, "a/b", b"from a", qos=1, pid=1)
    h.turn()
    assert sorted(payloads(w0)) == [(1, b"from a"), (11, b"from a")]
    w0.pub(4, "a/b", b"from b", qos=1, pid=1)
    h.turn()
    assert sorted(payloads(w0)) == [(2, b"from b"), (12, b"from b")]


def test_a_qos0_run_reaches_only_its_tenants_subscribers() -> None:
    h = RouterHarness()
    w0 = h.worker("w0")
    connected(h, w0, 1, "sub-a", "a", subs=(("t", 0),))
    connected(h, w0, 2, "sub-b", "b", subs=(("t", 0),))
    connected(h, w0, 3, "pub-b", "b")
    w0.pub0(3, "t", [b"x", b"y"])
    h.turn()
    assert [r.subs for r in w0.take() if isinstance(r, DeliverRaw)] == [(Sub(2, 0, 0),)]


def test_a_record_of_a_connection_the_router_does_not_know_is_dropped_and_counted() -> None:
    """Not routed into the default tenant: the router does not know its tenant."""
    h = RouterHarness()
    w0 = h.worker("w0")
    connected(h, w0, 1, "sub", "", subs=(("t", 0),))
    w0.pub0(7, "t", [b"x", b"y"])
    w0.pub(7, "t", b"z")
    h.turn()
    assert not [r for r in w0.take() if isinstance(r, (Deliver, DeliverRaw))]
    assert h.router.unknown == 3
    connected(h, w0, 7, "pub", "")
    w0.gone(7)  # ended: unknown again
    w0.pub0(7, "t", [b"late"])
    h.turn()
    assert not [r for r in w0.take() if isinstance(r, (Deliver, DeliverRaw))] and h.router.unknown == 4


def test_a_publish_right_after_a_connect_that_waits_to_take_over_is_routed_in_its_tenant() -> None:
    h = RouterHarness()
    w0, w1 = h.worker("w0"), h.worker("w1")
    connected(h, w0, 1, "dev", "a", clean=False)
    connected(h, w0, 2, "sub", "a", subs=(("t", 0),))
    w1.connect(5, "dev", clean=False, tenant="a")  # waits for w0's KICKED
    w1.pub(5, "t", b"pipelined")
    h.turn()
    assert payloads(w0) == [(2, b"pipelined")]


def test_retained_messages_of_one_tenant_are_not_sent_to_anothers_subscriber() -> None:
    h = RouterHarness()
    w0 = h.worker("w0")
    connected(h, w0, 1, "pub", "a")
    w0.pub(1, "r", b"kept in a", qos=1, pid=1, retain=True)
    h.turn()
    connected(h, w0, 2, "sub-b", "b")
    connected(h, w0, 3, "sub-a", "a")
    w0.subscribe(2, 1, [("r", 1), ("#", 1)])
    w0.subscribe(3, 1, [("#", 1)])
    h.turn()
    assert [(sub.conn, r.payload, r.retain) for r in w0.take() if isinstance(r, Deliver) for sub in r.subs] == \
        [(3, b"kept in a", True)]


def test_a_shared_group_of_one_name_in_two_tenants_is_two_groups() -> None:
    h = RouterHarness()
    w0 = h.worker("w0")
    connected(h, w0, 1, "m-a", "a", subs=(("$share/g/x", 1),))
    connected(h, w0, 2, "m-b", "b", subs=(("$share/g/x", 1),))
    connected(h, w0, 3, "pub-a", "a")
    connected(h, w0, 4, "pub-b", "b")
    for n in range(2):  # one group of one member: else round robin would give one to the other
        w0.pub(3, "x", b"a%d" % n, qos=1, pid=n + 1)
    w0.pub(4, "x", b"b", qos=1, pid=1)
    h.turn()
    assert sorted(payloads(w0)) == [(1, b"a0"), (1, b"a1"), (2, b"b")]


def test_a_will_goes_out_in_its_tenant_now_and_after_its_delay() -> None:
    h = RouterHarness()
    w0 = h.worker("w0")
    connected(h, w0, 1, "watch-a", "a", subs=(("will/#", 0),))
    connected(h, w0, 2, "watch-b", "b", subs=(("will/#", 0),))
    connected(h, w0, 3, "dev", "a", will=("will/now", b"gone", 0, False))
    connected(h, w0, 4, "dev2", "a", clean=False, expiry=3600, will=("will/later", b"late", 0, False),
              will_extra=[5, "", 0], fresh=True)
    w0.gone(3)
    h.turn()
    assert payloads(w0) == [(1, b"gone")]
    w0.gone(4)
    h.turn()
    assert payloads(w0) == []
    h.router.due(time.time() + 10)
    h.turn()
    assert payloads(w0) == [(1, b"late")]


def test_persistent_sessions_of_one_client_id_in_two_tenants_keep_their_own_queues_over_a_restart(tmp_path: Path) -> None:
    h = RouterHarness(tmp_path)
    w0 = h.worker("w0")
    for conn, tenant in ((1, "a"), (2, "b")):
        connected(h, w0, conn, "dev", tenant, clean=False, subs=(("t", 1),))
        w0.gone(conn)
    connected(h, w0, 3, "pub-a", "a")
    connected(h, w0, 4, "pub-b", "b")
    w0.pub(3, "t", b"for a", qos=1, pid=1)
    w0.pub(4, "t", b"for b", qos=1, pid=1)
    w0.pub(4, "t", b"for b again", qos=1, pid=2)
    h.turn()
    h = h.restart()
    w0 = h.worker("w0")
    assert h.router.tenants["a"].sessions["dev"].subs == {"t": 1} == h.router.tenants["b"].sessions["dev"].subs
    for conn, tenant, queued in ((5, "a", [b"for a"]), (6, "b", [b"for b", b"for b again"])):
        w0.connect(conn, "dev", clean=False, tenant=tenant)
        h.turn()
        records = w0.take()
        assert records[0] == Session(conn, True, [["t", 1]])
        assert [r.payload for r in records[1:] if isinstance(r, Deliver)] == queued


def test_the_route_table_names_each_filters_tenant() -> None:
    h = RouterHarness()
    w0 = h.worker("w0")
    w0.take(everything=True)
    connected(h, w0, 1, "dev", "a", subs=(("a/b", 0),))
    connected(h, w0, 2, "dev", "", subs=(("a/b", 0),))
    entries = [e for r in w0.inbox + [r for s in h.sent for r in s.records] if isinstance(r, Routes) for e in r.entries]
    assert ["a", "a/b", ["w0"]] in entries and ["", "a/b", ["w0"]] in entries


def test_an_administrator_disconnects_a_client_by_tenant_and_client_id() -> None:
    h = RouterHarness()
    w0 = h.worker("w0")
    connected(h, w0, 1, "dev", "a")
    connected(h, w0, 2, "dev", "b")
    for tenant, found in (("b", True), ("c", False), ("", False)):
        request = ClientDisconnect("dev", tenant)
        h.router.disconnect_client(request)
        assert request.found is found and request.done.is_set()
    h.turn()
    assert w0.take() == [Close(2)]
