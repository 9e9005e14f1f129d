"""Which router is active: a lease row in PostgreSQL, decided by the database alone (issue 24).

Why a lease row with an epoch and not an advisory lock: the lock lives as long as one connection, so
an active router whose connection broke would not know it had lost it until its next statement, while
a lease fences every commit of the store by its epoch (`fence`): once another router has taken the
lease, the old active's commits abort and nothing of it is written. Only the database clock (`now()`)
decides expiry; the router's own monotonic clock decides only when to step down early
(`must_step_down`), so that an active cut off from the database stops acting before its lease lapses
there and a standby may take it.

The lease has its own autocommit connection (the store has another: a turn's commit carries the
fence, docs/architecture.md §12). Every psycopg error is the caller's: the standby logs it and keeps
trying, the active's member thread logs it once per outage.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import psycopg

from plexmq.process import STEPPED_DOWN

log = logging.getLogger("plexmq.router")

STEP_DOWN_AT = 0.75  # of the lease since the last successful renewal started: stop acting well before it lapses
RENEW_EVERY = 0.25  # of the lease: how often the active renews it at least (an empty commit while idle)

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS router_lease (id int PRIMARY KEY, epoch bigint NOT NULL, holder text NOT NULL, "
    "endpoint text NOT NULL, expires timestamptz NOT NULL, since timestamptz NOT NULL)",
    # keyed by name and endpoint: two routers given the same router_name by mistake stay two rows (and
    # the standby says so in its log) instead of overwriting each other's state
    "CREATE TABLE IF NOT EXISTS router_members (name text NOT NULL, endpoint text NOT NULL, state text NOT NULL, "
    "epoch bigint NOT NULL, seen timestamptz NOT NULL, PRIMARY KEY (name, endpoint))",
    # the one row, lapsed since ever: the first router to try takes it
    "INSERT INTO router_lease VALUES (1, 0, '', '', '-infinity', '-infinity') ON CONFLICT DO NOTHING",
)
_SCHEMA_LOCK = 0x706C65786D71  # "plexmq": two routers starting at once must not race CREATE TABLE
# the old row joined to the one updated: RETURNING then says whom this router took the lease from and
# how long after it lapsed (a concurrent taker makes the recheck of `l.expires` fail: exactly one wins)
_ACQUIRE = ("UPDATE router_lease l SET epoch = l.epoch + 1, holder = %s, endpoint = %s, "
            "expires = now() + make_interval(secs => %s), since = now() FROM router_lease o "
            "WHERE l.id = 1 AND o.id = 1 AND l.expires < now() "
            "RETURNING l.epoch, extract(epoch FROM l.since)::float8, o.holder, "
            "CASE WHEN isfinite(o.expires) THEN extract(epoch FROM now() - o.expires)::float8 ELSE 0 END")
# run first in every commit of the store: renews the lease, and a division by zero aborts the
# transaction when the epoch is no longer ours (another router took the lease)
FENCE = ("WITH f AS (UPDATE router_lease SET expires = now() + make_interval(secs => %s) WHERE id = 1 AND epoch = %s "
         "RETURNING 1) SELECT 1 / count(*) FROM f")
_RELEASE = "UPDATE router_lease SET expires = now() WHERE id = 1 AND epoch = %s"
_HOLDER = ("SELECT holder, CASE WHEN expires > now() THEN endpoint ELSE '' END, epoch FROM router_lease WHERE id = 1")
_SAY = ("INSERT INTO router_members VALUES (%s, %s, %s, %s, now()) ON CONFLICT (name, endpoint) DO UPDATE "
        "SET state = excluded.state, epoch = excluded.epoch, seen = excluded.seen")
# only the lease's holder reads as active: the row of an active whose epoch has passed (killed, or stepping
# down) still says "active" until its restart says "standby" or it falls silent, beside the new active's
_MEMBERS = ("SELECT m.name, CASE WHEN m.state = 'active' AND (m.epoch <> l.epoch OR l.expires <= now()) THEN 'gone' "
            "ELSE m.state END, extract(epoch FROM now() - m.seen)::float8 FROM router_members m, router_lease l "
            "WHERE l.id = 1 ORDER BY m.name")


def is_postgres(store: str) -> bool:
    """Whether the `store` setting names a PostgreSQL database (shared by routers: a lease decides)."""
    return store.startswith(("postgresql://", "postgres://"))


class SteppedDown(Exception):
    """The active router stops acting: its line for the log (router/main.py exits STEPPED_DOWN)."""


class Taken(NamedTuple):
    """The lease as this router acquired it."""

    epoch: int
    since: float  # when, in the database's time.time()
    previous: str  # the holder before ("": none ever)
    gap: float  # seconds between the previous lease's expiry and the takeover


class Holder(NamedTuple):
    name: str  # "" when none ever
    endpoint: str  # its link endpoint while its lease lasts, else ""
    epoch: int


class Member(NamedTuple):
    name: str
    state: str  # active (the lease's holder), standby, or gone (an active whose epoch has passed)
    age: float  # seconds since it last said so


class Lease:
    """This router's view of the lease: acquiring it, its fence, and when the active must step down."""

    def __init__(self, dsn: str, name: str, endpoint: str, seconds: float) -> None:
        self.dsn, self.name, self.endpoint, self.seconds = dsn, name, endpoint, seconds
        self.epoch = 0  # 0: not held
        self.since = 0.0
        self.last_renewal = 0.0  # time.monotonic() when the last successful renewal started
        self.asked: float | None = None  # time.monotonic() when the renewal in flight (or the last that failed) started
        self._wake_at = math.inf  # time.monotonic() when the watch thread means to wake next
        self._db: psycopg.Connection | None = None

    def _conn(self) -> psycopg.Connection:
        """The connection, (re)opened when there is none or it broke: every statement may wait about the
        lease time at most, so that an unreachable database is an error within it, not a hang."""
        if self._db is None or self._db.closed or self._db.broken:
            timeout_ms = max(int(self.seconds * 1000), 500)
            self._db = psycopg.connect(self.dsn, autocommit=True, connect_timeout=max(int(self.seconds + 0.999), 2),
                                       options=f"-c statement_timeout={timeout_ms}", keepalives=1,
                                       keepalives_idle=max(int(self.seconds), 1), keepalives_interval=1,
                                       keepalives_count=2, application_name=f"plexmq lease {self.name}")
            with self._db.transaction():
                self._db.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                for statement in _SCHEMA:
                    self._db.execute(statement)
        return self._db

    def try_acquire(self) -> Taken | None:
        """Take the lease if it has lapsed in the database; None while another router holds it.

        The acquisition may have waited in a paused database (or its answer on the way back) for longer
        than the lease: dated by its start, a fresh holder would step down at once. A renewal started
        after it, on a database that has just answered, dates the lease instead."""
        row = self._conn().execute(_ACQUIRE, (self.name, self.endpoint, self.seconds)).fetchone()
        if row is None:
            return None
        taken = Taken(*row)
        self.epoch, self.since = taken.epoch, taken.since
        with self.renewal():
            self._conn().execute(FENCE, (self.seconds, self.epoch))
        return taken

    def fence(self) -> tuple[str, tuple]:
        """(sql, args) that the store runs first in every commit while this router is active."""
        assert self.epoch, "fence() before the lease is held"
        return FENCE, (self.seconds, self.epoch)

    @contextmanager
    def held(self) -> Iterator[None]:
        """Keep the lease renewed from a thread (on the lease's own connection) while the new active
        loads its store: a load longer than the lease must not hand the lease on, nor make the router
        step down at its first turn. A failed renewal ends the thread: the first commit then says why."""
        done = threading.Event()

        def renew() -> None:
            while not done.wait(RENEW_EVERY * self.seconds):
                try:
                    with self.renewal():
                        self._conn().execute(FENCE, (self.seconds, self.epoch))
                except psycopg.Error:
                    return

        thread = threading.Thread(target=renew, name="lease-renewal", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    @contextmanager
    def renewal(self) -> Iterator[None]:
        """Around a statement that renews the lease (a commit that carries the fence, or the fence alone):
        its start dates the renewal once it succeeds; until then the database owes an answer (`late`)."""
        started = self.asked = time.monotonic()
        yield
        self.renewed(started)

    def renewed(self, started: float) -> None:
        """A renewal that started at time.monotonic() `started` succeeded."""
        self.last_renewal, self.asked = started, None

    def renew_due(self, now: float) -> float:
        """Seconds from `now` (time.monotonic()) until the active must renew (an empty commit if no other
        came first); 0 or less: now."""
        return self.last_renewal + RENEW_EVERY * self.seconds - now

    def watch(self) -> None:
        """From now on, step down (exit STEPPED_DOWN) the moment `must_step_down` holds, from a thread of
        its own: the router's loop may be waiting in a commit to a database that does not answer, and
        the lease may lapse there (and a standby take it) before that commit times out."""
        threading.Thread(target=self._watch, name="lease-watch", daemon=True).start()

    def _watch(self) -> None:
        """Wakes at the step-down deadline, and every renewal period at least: woken much later than it
        meant to, the process itself did not run (`late`)."""
        while True:
            now = time.monotonic()
            if self.must_step_down(now):
                log.error("%s", self.late(now))
                logging.shutdown()
                os._exit(STEPPED_DOWN)  # nothing the router would send after this may go: no cleanup
            self._wake_at = min(self.last_renewal + STEP_DOWN_AT * self.seconds, now + RENEW_EVERY * self.seconds) + 0.001
            time.sleep(self._wake_at - now)

    def must_step_down(self, now: float) -> bool:
        """Whether the last successful renewal started so long ago (by this process's monotonic clock)
        that the lease may soon lapse in the database: the active stops acting at once."""
        return now - self.last_renewal > STEP_DOWN_AT * self.seconds

    def late(self, now: float) -> str:
        """The step-down line, saying who was late: this router itself (stopped, swapped out or starved
        of CPU: the watch thread woke over a renewal period later than it meant to), the database (a
        renewal asked and not answered, or refused), or the router's loop (no renewal asked in time)."""
        line = f"router {self.name}: no renewal of the lease for {now - self.last_renewal:.1f} s"
        if now - self._wake_at > RENEW_EVERY * self.seconds:
            return (f"{line} (this router did not run for {now - self._wake_at:.1f} s or more: stopped, or starved "
                    "of CPU): stepping down")
        if self.asked is not None:
            return f"{line} (the database has not answered a renewal for {now - self.asked:.1f} s): stepping down"
        return f"{line} (the router's loop asked for none: a turn ran long): stepping down"

    def holder(self) -> Holder:
        row = self._conn().execute(_HOLDER).fetchone()
        return Holder(*row) if row else Holder("", "", 0)

    def say(self, state: str) -> None:
        """Record in router_members what this router is now (for the ops output)."""
        self._conn().execute(_SAY, (self.name, self.endpoint, state, self.epoch))

    def members(self) -> list[Member]:
        return [Member(*row) for row in self._conn().execute(_MEMBERS).fetchall()]

    def release(self) -> None:
        """A graceful stop of the active: the lease lapses now, so a standby takes over within lease/8
        instead of waiting out the lease (its epoch fences nothing more: this router has committed its last)."""
        try:
            self._conn().execute(_RELEASE, (self.epoch,))
            log.info("router %s hands the lease back (epoch %d): a standby takes over now", self.name, self.epoch)
        except psycopg.Error as exc:
            log.warning("router %s could not hand the lease back: %s (a standby takes it when it lapses)",
                        self.name, one_line(exc))

    def close(self) -> None:
        if self._db is not None:
            self._db.close()


class Members(threading.Thread):
    """The active's member bookkeeping, off the router's loop (a query may wait up to the lease time):
    says "active" and reads every member once a second on the lease's connection, which from now on is
    this thread's alone. `seen` is the last list read, replaced whole (the stats read it as it is)."""

    def __init__(self, lease: Lease, interval: float = 1.0) -> None:
        super().__init__(name="router-members", daemon=True)
        self.lease, self.interval = lease, interval
        self.silent_after = 3 * max(interval, lease.seconds)  # seconds: a member silent this long is taken for gone
        self.seen: list[Member] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        failing = False
        while not self.stopping.is_set():
            try:
                self.lease.say("active")
                self.seen = self.lease.members()
                if failing:
                    log.info("router members: the database answers again")
                failing = False
            except psycopg.Error as exc:
                if not failing:
                    log.warning("router members: cannot reach the database: %s", one_line(exc))
                failing = True
            self.stopping.wait(self.interval)


def one_line(exc: BaseException) -> str:
    """A psycopg error's first line (its text may run over several: DETAIL, HINT)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
