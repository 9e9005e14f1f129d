"""The router lease (router/ha/lease.py) against a private PostgreSQL server: exactly one router holds
it, another takes it only once it has lapsed in the database, and the old holder's fenced commits
then write nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import psutil
import psycopg
import pytest

from plexmq.bench import postgres
from plexmq.router.ha.lease import Lease
from tests.conftest import wait_for

pytestmark = pytest.mark.skipif(not postgres.installed(), reason="no PostgreSQL server installed")

LEASE = 0.5  # seconds: the shortest router_lease allows, so that expiries come quickly


@pytest.fixture
def leases(pg_dsn: str) -> Iterator[Callable[[str], Lease]]:
    made: list[Lease] = []

    def make(name: str) -> Lease:
        made.append(Lease(pg_dsn, name, f"tcp://{name}:7883", LEASE))
        return made[-1]

    yield make
    for lease in made:
        lease.close()


def test_one_wins_the_other_only_after_expiry(leases: Callable[[str], Lease]) -> None:
    a, b = leases("a"), leases("b")
    first = a.try_acquire()
    assert first is not None and first.epoch == 1 and first.previous == ""
    assert b.try_acquire() is None  # a holds it
    assert b.holder() == ("a", "tcp://a:7883", 1)
    taken = wait_for(b.try_acquire, LEASE + 5, "b to take the lapsed lease")
    assert taken.epoch == 2 and taken.previous == "a"
    assert taken.gap >= 0  # taken after the old lease's expiry, by the database's clock
    assert a.holder() == ("b", "tcp://b:7883", 2)
    assert a.try_acquire() is None


def test_fenced_commit_of_the_old_holder_writes_nothing(pg_dsn: str, leases: Callable[[str], Lease]) -> None:
    a, b = leases("a"), leases("b")
    assert a.try_acquire() is not None
    with psycopg.connect(pg_dsn, autocommit=True) as store:
        store.execute("CREATE TABLE rows (n int)")

        def commit(lease: Lease, n: int) -> None:
            with store.transaction():
                sql, args = lease.fence()
                store.execute(sql, args)
                store.execute("INSERT INTO rows VALUES (%s)", (n,))

        commit(a, 1)  # a's fence passes while it holds the lease (and renews it)
        wait_for(b.try_acquire, LEASE + 5, "b to take the lapsed lease")
        with pytest.raises(psycopg.errors.DivisionByZero):
            commit(a, 2)
        commit(b, 3)
        assert [n for (n,) in store.execute("SELECT n FROM rows ORDER BY n")] == [1, 3]


def test_renewal_keeps_the_lease(leases: Callable[[str], Lease], pg_dsn: str) -> None:
    """The fence renews: while a commits within the lease, b never gets it."""
    a, b = leases("a"), leases("b")
    assert a.try_acquire() is not None
    with psycopg.connect(pg_dsn, autocommit=True) as store:
        deadline = time.monotonic() + 3 * LEASE
        while time.monotonic() < deadline:
            sql, args = a.fence()
            store.execute(sql, args)
            assert b.try_acquire() is None
            time.sleep(LEASE / 8)  # the active's renewal period, and the standby's tries


def test_held_renews_while_the_new_active_loads(leases: Callable[[str], Lease]) -> None:
    """A store load longer than the lease: the lease stays with the router that loads."""
    a, b = leases("a"), leases("b")
    assert a.try_acquire() is not None
    with a.held():
        deadline = time.monotonic() + 3 * LEASE
        while time.monotonic() < deadline:
            assert b.try_acquire() is None
            time.sleep(LEASE / 8)
        assert not a.must_step_down(time.monotonic())
    wait_for(b.try_acquire, LEASE + 5, "b to take the lease once a no longer renews it")


def test_a_lease_taken_from_a_paused_database_is_kept(pg_dsn: str, leases: Callable[[str], Lease]) -> None:
    """b asks for the lease while its database backend is paused (SIGSTOP of the server, a link down)
    for longer than the lease; once it answers, b holds the lease and keeps it: judged by the start of
    its ask, it would step down at once (the epoch skipped, a failover that never served was counted)."""
    a, b = leases("a"), leases("b")
    assert a.try_acquire() is not None
    assert b.try_acquire() is None  # b's connection is open: its backend is the one to pause
    with psycopg.connect(pg_dsn, autocommit=True) as db:
        row = db.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND "
                         "application_name = 'plexmq lease b'").fetchone()
    assert row is not None
    backend = psutil.Process(row[0])
    results: list[object] = []
    backend.suspend()
    try:
        asking = threading.Thread(target=lambda: results.append(b.try_acquire()))
        asking.start()
        time.sleep(2 * LEASE)  # the pause itself, longer than the lease (a's lapses meanwhile)
    finally:
        backend.resume()
    asking.join(30)
    assert results and results[0] is not None, results
    assert not b.must_step_down(time.monotonic())
    assert b.holder() == ("b", "tcp://b:7883", 2)


def test_the_step_down_line_says_who_was_late(leases: Callable[[str], Lease]) -> None:
    """The database when a renewal is asked and not answered, the router's loop when none was asked
    (a router that was itself stopped: tests/test_standby.py)."""
    a = leases("a")
    assert a.try_acquire() is not None
    late = a.last_renewal + LEASE
    assert a.must_step_down(late)
    assert a.late(late).endswith("(the router's loop asked for none: a turn ran long): stepping down")
    with a.renewal():
        assert a.asked is not None
        line = a.late(a.asked + 0.8 * LEASE)
    assert line.endswith(f"(the database has not answered a renewal for {0.8 * LEASE:.1f} s): stepping down"), line


def test_step_down_bookkeeping(leases: Callable[[str], Lease]) -> None:
    a = leases("a")
    assert a.try_acquire() is not None
    started = a.last_renewal
    assert not a.must_step_down(started + 0.7 * LEASE)
    assert a.must_step_down(started + 0.8 * LEASE)
    a.renewed(started + 0.5 * LEASE)
    assert not a.must_step_down(started + 0.8 * LEASE)
    assert a.renew_due(started) > 0


@pytest.mark.parametrize("round_", range(3))
def test_both_start_at_once(leases: Callable[[str], Lease], round_: int) -> None:
    """Two routers on a fresh database, tables not made yet: exactly one gets the lease."""
    contenders = [leases("a"), leases("b")]
    barrier = threading.Barrier(2)
    results: dict[str, object] = {}

    def race(lease: Lease) -> None:
        barrier.wait()
        results[lease.name] = lease.try_acquire()

    threads = [threading.Thread(target=race, args=(lease,)) for lease in contenders]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    winners = [name for name, taken in results.items() if taken is not None]
    assert len(results) == 2 and len(winners) == 1, results


def test_members(leases: Callable[[str], Lease]) -> None:
    a, b = leases("a"), leases("b")
    assert a.try_acquire() is not None
    a.say("active")
    b.say("standby")
    assert [(m.name, m.state) for m in b.members()] == [("a", "active"), ("b", "standby")]
    assert all(m.age < 60 for m in a.members())


def test_after_a_failover_only_the_new_holder_reads_as_active(leases: Callable[[str], Lease]) -> None:
    """The old active's row still says "active" (it was killed, or is stepping down) until its restart
    says "standby" or it falls silent: read beside the new active's, an alert on two actives fired at
    every failover (issue 34). Only the lease's holder reads as active; the old one as gone."""
    a, b = leases("a"), leases("b")
    assert a.try_acquire() is not None
    a.say("active")
    wait_for(b.try_acquire, LEASE + 5, "b to take the lapsed lease")
    b.say("active")
    assert [(m.name, m.state) for m in b.members()] == [("a", "gone"), ("b", "active")]
