"""Carried wills (issue 24): on a PostgreSQL store the router writes every live connection's will, so
that a router that takes the store over sends the wills of clients whose node died with the old
active router, once; and only those. A SQLite store writes none of it.

Each test plays two routers in-process on one store (tests/router_harness.py): router A has the
connections on worker w0 and "dies" (its connection to the database is closed without a commit);
router B loads the store. The wills are seen in the outbox of an offline persistent watcher
subscribed to them: each will published is one stored message of the watcher's."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg

from plexmq.router.store.postgres import PgStore
from tests.router_harness import RouterHarness

TIMEOUT = 5.0  # the routers' link_timeout


def _router_a(store: PgStore | None = None, tmp_path: Path | None = None) -> RouterHarness:
    """Router A: an offline watcher of w/# (QoS 1), and on w0 a clean session and a persistent one,
    each with a will."""
    a = RouterHarness(tmp_path, store=store, link_timeout=TIMEOUT)
    w1 = a.worker("w1")
    w1.connect(1, "watcher", clean=False, expiry=3600)
    w1.subscribe(1, 1, [("w/#", 1)])
    w1.gone(1, publish_will=False)
    w0 = a.worker("w0")
    w0.connect(1, "clean", will=("w/clean", b"gone", 1, False))
    w0.connect(2, "pers", clean=False, expiry=3600, will=("w/pers", b"gone too", 1, False))
    a.turn()
    return a


def _die(a: RouterHarness) -> None:
    """Router A stops without another word to the database (what it had not committed is lost)."""
    assert isinstance(a.store, PgStore)
    a.store.db.close()


def _rows(dsn: str, query: str) -> list[tuple]:
    with psycopg.connect(dsn) as db:
        return db.execute(query).fetchall()


def _wills_queued(dsn: str) -> list[str]:
    """The will topics the watcher's outbox holds, as committed."""
    return [bytes(topic).decode() for topic, in _rows(dsn, "SELECT topic FROM messages WHERE client_id = 'watcher' "
                                                           "ORDER BY seq")]


def test_wills_of_a_worker_that_never_joins_go_out_once_after_the_link_timeout(pg_dsn: str) -> None:
    dsn = pg_dsn
    a = _router_a(PgStore(dsn))
    assert sorted(_rows(dsn, "SELECT client_id, worker, conn_id FROM live_wills")) == [("clean", "w0", 1), ("pers", "w0", 2)]
    _die(a)

    b = RouterHarness(store=PgStore(dsn), link_timeout=TIMEOUT)
    router = b.router
    assert sorted(s.client_id for s in router.by_conn_id.values()) == ["clean", "pers"]  # connected on w0 until...
    assert router.links.alive() == [b"w0"] and router.links.joined() == []
    assert router.tenants[""].connections == 2
    heard = router.links.links[b"w0"].heard
    assert router.links.silent(heard + TIMEOUT / 2) == []  # not yet taken for dead
    lost = router.links.silent(heard + TIMEOUT + 1)
    assert lost == [b"w0"]
    for worker in lost:
        router.worker_lost(worker)
    b.turn()  # the commit of the turn that published them
    assert sorted(_wills_queued(dsn)) == ["w/clean", "w/pers"]
    assert _rows(dsn, "SELECT * FROM live_wills") == []
    assert "clean" not in router.tenants[""].sessions and router.tenants[""].sessions["pers"].worker is None
    assert router.by_conn_id == {} and router.tenants[""].connections == 0
    assert router.links.silent(time.monotonic() + 2 * TIMEOUT) == []  # once taken for dead, never again

    c = RouterHarness(store=PgStore(dsn), link_timeout=TIMEOUT)  # a third router: nothing left to carry
    assert c.router.by_conn_id == {} and c.router.links.alive() == []
    assert sorted(_wills_queued(dsn)) == ["w/clean", "w/pers"]


def test_a_worker_that_joins_again_ends_only_its_dead_connections_with_their_wills(pg_dsn: str) -> None:
    dsn = pg_dsn
    _die(_router_a(PgStore(dsn)))

    b = RouterHarness(store=PgStore(dsn), link_timeout=TIMEOUT)
    w0 = b.worker("w0", live=(2,))  # w0 lived on and joins B; of its two connections only the persistent one did
    w0.connect(2, "pers", clean=False, connack_sent=1, fresh=False, expiry=3600,  # registered again, with its will
               will=("w/pers", b"gone too", 1, False))
    b.turn()
    assert _wills_queued(dsn) == ["w/clean"]
    assert _rows(dsn, "SELECT client_id, worker, conn_id FROM live_wills") == [("pers", "w0", 2)]

    w0.gone(2)  # and the live one's will goes out when its connection ends, as ever
    b.turn()
    assert _wills_queued(dsn) == ["w/clean", "w/pers"]
    assert _rows(dsn, "SELECT * FROM live_wills") == []


def test_a_sqlite_store_writes_no_will_of_a_live_connection(tmp_path: Path) -> None:
    a = _router_a(tmp_path=tmp_path)
    assert a.store is not None
    assert a.store.db.execute("SELECT count(*) FROM live_wills").fetchone() == (0,)
    b = a.restart()  # and a restarted router carries none
    assert b.router.by_conn_id == {} and b.router.links.alive() == []
