"""The router's stores on their own: an older SQLite schema is upgraded in place and nothing it held is
lost (a version 7 store gains the bans); every backend (SQLite, PostgreSQL: a private server, a fresh
database per test) keeps what the journal writes through the same cases; PostgreSQL's fence, schema
version and failures."""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from plexmq.bans import ADDRESS, BROKER, CLIENT_ID, make
from plexmq.bench.postgres import PostgreSQL
from plexmq.bench.postgres import installed as postgres_installed
from plexmq.router.message import Message
from plexmq.router.ops import audit
from plexmq.router.outbox import QUEUED, RELEASING, SENT, Pending
from plexmq.router.sessions import NEVER, Session, Will
from plexmq.router.store import SCHEMA_VERSION, StoreError, journal, postgres, sqlite
from plexmq.router.store.journal import Journal
from plexmq.router.store.postgres import PgStore
from plexmq.router.store.sqlite import SqliteStore

# the tables of schema 5, as a plexmq before tenants made them
_VERSION_5 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT INTO meta VALUES ('schema', 5);
CREATE TABLE sessions (client_id TEXT PRIMARY KEY, last_seen REAL NOT NULL, expiry INTEGER NOT NULL DEFAULT -1);
CREATE TABLE subscriptions (client_id TEXT NOT NULL, filter TEXT NOT NULL, qos INTEGER NOT NULL,
                            PRIMARY KEY (client_id, filter)) WITHOUT ROWID;
CREATE TABLE messages (seq INTEGER PRIMARY KEY, client_id TEXT NOT NULL, packet_id INTEGER NOT NULL,
                       topic BLOB NOT NULL, payload BLOB NOT NULL, qos INTEGER NOT NULL, retain INTEGER NOT NULL,
                       state INTEGER NOT NULL, props BLOB NOT NULL DEFAULT x'', expiry INTEGER NOT NULL DEFAULT 0);
CREATE UNIQUE INDEX message_ids ON messages (client_id, packet_id);
CREATE TABLE incoming (client_id TEXT NOT NULL, packet_id INTEGER NOT NULL,
                       PRIMARY KEY (client_id, packet_id)) WITHOUT ROWID;
CREATE TABLE retained (topic TEXT PRIMARY KEY, payload BLOB NOT NULL, qos INTEGER NOT NULL,
                       props BLOB NOT NULL DEFAULT x'', expiry INTEGER NOT NULL DEFAULT 0);
CREATE TABLE wills (client_id TEXT PRIMARY KEY, due REAL NOT NULL, topic BLOB NOT NULL, payload BLOB NOT NULL,
                    qos INTEGER NOT NULL, retain INTEGER NOT NULL, props BLOB NOT NULL, expiry INTEGER NOT NULL);
INSERT INTO sessions VALUES ('dev', 10.0, 3600);
INSERT INTO subscriptions VALUES ('dev', 'a/#', 1);
INSERT INTO messages VALUES (7, 'dev', 3, x'612f62', x'717565756564', 1, 0, 0, x'', 0);
INSERT INTO incoming VALUES ('dev', 9);
INSERT INTO retained VALUES ('a/r', x'6b657074', 1, x'', 0);
INSERT INTO wills VALUES ('dev', 99.0, x'77', x'676f6e65', 0, 0, x'', 0);
"""

_TABLES = ("sessions", "subscriptions", "messages", "incoming", "retained", "wills")


def test_a_version_5_store_is_upgraded_with_every_row_in_the_default_tenant(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with sqlite3.connect(data / "plexmq.db") as db:
        db.executescript(_VERSION_5)
    db.close()
    store = SqliteStore(str(data), "normal")
    rows = {table: store.db.execute(f"SELECT * FROM {table}").fetchall() for table in _TABLES}
    assert store.db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() == (SCHEMA_VERSION,) == (8,)
    assert {table: [row[0] for row in found] for table, found in rows.items() if table != "messages"} == \
        {table: [""] for table in _TABLES if table != "messages"}
    assert rows["messages"] == [(7, "", "dev", 3, b"a/b", b"queued", 1, 0, 0, b"", 0)]
    assert rows["sessions"] == [("", "dev", 10.0, 3600)] and rows["wills"][0][:3] == ("", "dev", 99.0)
    loaded = store.load()
    assert list(loaded.sessions) == [""] and list(loaded.retained) == [""]
    session = loaded.sessions[""]["dev"]
    assert (session.tenant, session.subs, list(session.unacked), session.incoming, session.will_at) == \
        ("", {"a/#": 1}, [3], {9}, 99.0)
    assert loaded.retained[""]["a/r"].payload == b"kept" and loaded.next_seq == 8
    # the keys name the tenant: the same client id in another tenant is another row
    store.db.execute("INSERT INTO sessions (tenant, client_id, last_seen) VALUES ('acme', 'dev', 0)")
    store.db.execute("INSERT INTO messages (tenant, client_id, packet_id, topic, payload, qos, retain, state) "
                     "VALUES ('acme', 'dev', 3, x'', x'', 1, 0, 0)")
    assert sorted(store.load().sessions) == ["", "acme"]
    store.close()


def test_a_version_6_store_gains_the_live_wills_table_and_keeps_every_row(tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = SqliteStore(str(data), "normal")
    j = Journal(store)
    dev = _session("dev", "acme")
    j.session_saved(dev, 10.0)
    j.subscription_added(dev, "a/#", 1)
    j.message_kept(dev, 3, Pending(b"a/b", b"queued", 1, False))
    j.incoming_added(dev, 9)
    dev.will_at = 99.0
    j.will_saved(dev, Will(b"w", b"gone", 0, False))
    j.retained_set("acme", "a/r", Message(b"a/r", b"kept", 1, True))
    store.commit()
    store.db.executescript("DROP TABLE live_wills; UPDATE meta SET value = 6 WHERE key = 'schema';")  # as version 6 made it
    rows = {table: store.db.execute(f"SELECT * FROM {table}").fetchall() for table in _TABLES}
    store.close()
    store = SqliteStore(str(data), "normal")
    assert store.db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() == (SCHEMA_VERSION,) == (8,)
    assert {table: store.db.execute(f"SELECT * FROM {table}").fetchall() for table in _TABLES} == rows
    assert all(rows.values()) and store.db.execute("SELECT * FROM live_wills").fetchall() == []
    store.close()


def test_a_version_7_store_gains_the_bans_table_and_keeps_every_row(tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = SqliteStore(str(data), "normal")
    Journal(store).retained_set("acme", "a/r", Message(b"a/r", b"kept", 1, True))
    store.commit()
    store.db.executescript("DROP TABLE bans; UPDATE meta SET value = 7 WHERE key = 'schema';")  # as version 7 made it
    store.close()
    store = SqliteStore(str(data), "normal")
    assert store.db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() == (SCHEMA_VERSION,)
    loaded = store.load()
    assert loaded.bans == [] and loaded.retained["acme"]["a/r"].payload == b"kept"
    store.close()


# -- every backend, through the same cases ------------------------------------------------------------

Opener = Callable[[], SqliteStore | PgStore]


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """Opens the store of this test (again after a close): SQLite in tmp_path, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return lambda: SqliteStore(str(tmp_path / "data"), "normal")
    dsn: str = request.getfixturevalue("pg_dsn")
    return lambda: PgStore(dsn, None)


def _session(client_id: str, tenant: str = "") -> Session:
    session = Session(client_id, True, tenant)
    session.expiry = NEVER
    return session


def test_every_op_has_sql_in_every_backend() -> None:
    assert sorted(sqlite._SQL) == sorted(postgres._SQL) == list(journal.OPS)


def test_what_is_committed_comes_back_after_a_reopen(backend: Opener) -> None:
    store = backend()
    j = Journal(store)
    dev, other = _session("dev"), _session("dev", "acme")
    j.session_saved(dev, 10.5)
    j.session_saved(other, 11.0)
    j.subscription_added(dev, "a/#", 1)
    j.subscription_added(dev, "b", 2)
    j.subscription_added(dev, "b", 1)  # replaced
    j.subscription_added(other, "x", 0)
    for pid, payload in ((1, b"one"), (2, b"two"), (3, b"three")):
        j.message_kept(dev, pid, Pending(b"a/b", payload, 1, pid == 2, b"\x01", 99))
    j.message_sent(dev, 1)
    j.message_kept(dev, 4, Pending(b"q2", b"gone soon", 2, False))
    j.message_received(dev, 4)
    j.message_done(dev, 3)
    j.message_kept(other, 1, Pending(b"x", b"theirs", 1, False))
    j.incoming_added(dev, 7)
    j.incoming_added(dev, 7)  # a resend: kept once
    j.incoming_added(dev, 8)
    j.incoming_released(dev, 8)
    dev.will_at = 123.5
    j.will_saved(dev, Will(b"w", b"bye", 1, True, b"", 5))
    j.retained_set("", "r/1", Message(b"r/1", b"kept", 1, True, b"", 0))
    j.retained_set("", "r/2", Message(b"r/2", b"cleared", 0, True))
    j.retained_set("", "r/2", Message(b"r/2", b"", 0, True))
    j.retained_set("acme", "r/1", Message(b"r/1", b"theirs", 0, True))
    j.retained_set("", "$SYS/broker/uptime", Message(b"$SYS/broker/uptime", b"1", 0, True))  # never kept
    kept, lifted = make(BROKER, ADDRESS, "10.0.0.0/8", "scan", 3600, "ops", 5.0), make("acme", CLIENT_ID, "dev", now=6.0)
    j.ban_saved(lifted)
    j.ban_saved(make(BROKER, ADDRESS, "10.0.0.0/8", "first", now=4.0))
    j.ban_saved(kept)  # made again: replaces the first
    j.ban_dropped(lifted.key)
    store.commit()
    store.close()

    store = backend()
    loaded = store.load()
    session = loaded.sessions[""]["dev"]
    assert (session.tenant, session.seen, session.expiry, session.subs) == ("", 10.5, NEVER, {"a/#": 1, "b": 1})
    assert [(pid, m.payload, m.retain, m.props, m.expires_at, m.state) for pid, m in session.unacked.items()] == \
        [(1, b"one", False, b"\x01", 99, SENT), (2, b"two", True, b"\x01", 99, QUEUED), (4, b"", False, b"", 0, RELEASING)]
    assert session.incoming == {7} and session.will_at == 123.5
    assert session.will is not None and (session.will.payload, session.will.retain, session.will.expiry) == (b"bye", True, 5)
    assert list(loaded.sessions["acme"]["dev"].subs) == ["x"]
    assert {tenant: {topic: m.payload for topic, m in kept.items()} for tenant, kept in loaded.retained.items()} == \
        {"": {"r/1": b"kept"}, "acme": {"r/1": b"theirs"}}
    assert loaded.next_seq == j.seq + 1  # stored messages go on past the last one
    assert loaded.bans == [kept]

    j = Journal(store)
    j.seq = loaded.next_seq
    j.session_dropped(session)
    j.will_dropped(loaded.sessions["acme"]["dev"])
    j.subscription_removed(loaded.sessions["acme"]["dev"], "x")
    j.retained_cleared("acme", "r/1")
    store.commit()
    loaded = store.load()
    assert list(loaded.sessions) == ["acme"] and loaded.sessions["acme"]["dev"].subs == {}
    assert list(loaded.sessions["acme"]["dev"].unacked) == [1] and list(loaded.retained) == [""]
    store.verify()
    store.close()


def test_a_commit_writes_all_of_a_turn_or_nothing(backend: Opener) -> None:
    """A failing statement in a turn leaves none of its changes (one transaction)."""
    store = backend()
    j = Journal(store)
    dev = _session("dev")
    j.session_saved(dev, 1.0)
    store.ops.append((journal.SUBSCRIPTION_SAVE, ("", "dev", "a", None)))  # NOT NULL qos: the statement fails
    with pytest.raises(StoreError):
        store.commit()
    store.db.close()  # as the router's end: nothing more is written
    assert backend().load().sessions == {}


def test_the_audit_log_is_kept_bounded_and_comes_back_after_a_reopen(backend: Opener) -> None:
    """The admins' actions (router/ops/audit.py): each save trims the entries past the last KEEP and those
    older than AGE; a reopened store gives the rest back, oldest first."""
    store = backend()
    j = Journal(store)
    now = 1_000_000.0
    for seq in range(1, 8):
        at = now - audit.AGE - 1 if seq == 1 else now + seq  # the first is too old by the time the others come
        j.audited((seq, at, "ops", "127.0.0.1", "", audit.DISCONNECT, f"c{seq}", "disconnected"), seq - 5, at - audit.AGE)
    store.commit()
    store.close()
    store = backend()
    assert [(row[0], row[6]) for row in store.load().audit] == [(3, "c3"), (4, "c4"), (5, "c5"), (6, "c6"), (7, "c7")]
    store.close()



def test_a_turn_of_interleaved_messages_is_written_in_one_run_per_op(tmp_path: Path) -> None:
    """A QoS 1 flow's turn: new messages kept, older ones acknowledged, one after the other; in turn
    order that was a run (an executemany) per change."""
    store = SqliteStore(str(tmp_path / "data"), "normal")
    j, dev = Journal(store), _session("dev")
    for pid in range(1, 11):
        j.message_kept(dev, pid + 100, Pending(b"a", b"new", 1, False))
        j.message_done(dev, pid)
    assert [(kind, len(args)) for kind, args in journal.runs(store.ops)] == \
        [(journal.MESSAGE_SAVE, 10), (journal.MESSAGE_DELETE, 10)]
    store.close()


def test_a_kept_message_comes_back_as_kept_small_or_large(backend: Opener) -> None:
    """Every field of a stored message, a payload SQLite binds copied (small) or as it is (large)."""
    store = backend()
    j, dev = Journal(store), _session("dev")
    j.session_saved(dev, 1.0)
    kept = {1: Pending(b"a/small", b"s" * 10, 1, True, b"\x01\x02", 77), 2: Pending(b"a/large", b"L" * 100_000, 2, False)}
    for pid, message in kept.items():
        j.message_kept(dev, pid, message)
    store.commit()
    store.close()
    store = backend()
    unacked = store.load().sessions[""]["dev"].unacked
    assert {pid: (m.topic, m.payload, m.qos, m.retain, m.props, m.expires_at) for pid, m in unacked.items()} == \
        {pid: (m.topic, m.payload, m.qos, m.retain, m.props, m.expires_at) for pid, m in kept.items()}
    store.close()

def test_a_commit_leaves_what_the_turn_s_changes_one_by_one_leave(backend: Opener, tmp_path: Path) -> None:
    """Gathered into runs (journal.runs), a turn's changes leave the store as they would in turn order,
    however they interleave: ids taken again, states changed and sessions dropped between them."""
    rng = random.Random(36)
    store, one_by_one = backend(), SqliteStore(str(tmp_path / "one-by-one"), "normal")
    j = Journal(store)
    sessions = [_session("dev"), _session("dev", "acme"), _session("other")]

    def messages(s: SqliteStore | PgStore) -> list[tuple]:  # every row, a dropped session's left over too
        return sorted(s._rows("SELECT tenant, client_id, packet_id, payload, state, seq FROM messages"))

    for turn in range(30):
        for _ in range(rng.randrange(1, 40)):
            session, pid, pick = rng.choice(sessions), rng.randrange(1, 5), rng.random()
            if pick < 0.35:
                j.message_kept(session, pid, Pending(b"t", f"{turn}.{pid}".encode(), 1, False))
            elif pick < 0.5:
                j.message_sent(session, pid)
            elif pick < 0.6:
                j.message_received(session, pid)
            elif pick < 0.9:
                j.message_done(session, pid)
            elif pick < 0.95:
                j.session_saved(session, float(turn))
            else:
                j.session_dropped(session)
        for change in store.ops:
            one_by_one.ops.append(change)
            one_by_one.commit()
        store.commit()
        assert messages(store) == messages(one_by_one), f"turn {turn}"
    assert messages(store) != []
    store.close()
    one_by_one.close()

# -- PostgreSQL only ------------------------------------------------------------------------------------

def test_pg_a_store_of_a_newer_plexmq_is_refused(pg_dsn: str) -> None:
    dsn = pg_dsn
    PgStore(dsn).close()
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute("UPDATE meta SET value = %s WHERE key = 'schema'", (SCHEMA_VERSION + 1,))
    with pytest.raises(StoreError, match=f"store schema version {SCHEMA_VERSION + 1}, this plexmq reads {SCHEMA_VERSION}"):
        PgStore(dsn)


@pytest.mark.parametrize("version, tables", [(6, ("live_wills", "bans")), (7, ("bans",))])
def test_pg_an_older_store_gains_the_tables_it_lacks(pg_dsn: str, version: int, tables: tuple[str, ...]) -> None:
    dsn = pg_dsn
    PgStore(dsn).close()
    with psycopg.connect(dsn, autocommit=True) as db:
        for table in tables:
            db.execute(f"DROP TABLE {table}")
        db.execute("UPDATE meta SET value = %s WHERE key = 'schema'", (version,))
    store = PgStore(dsn)
    loaded = store.load()
    assert loaded.carried == [] and loaded.bans == []
    store.close()
    with psycopg.connect(dsn) as db:
        assert db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() == (SCHEMA_VERSION,)


def test_pg_the_fence_runs_first_in_every_commit_even_an_empty_one(pg_dsn: str) -> None:
    dsn = pg_dsn
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute("CREATE TABLE fence (epoch bigint, renewals bigint)")
        db.execute("INSERT INTO fence VALUES (1, 0)")
    fence = ("WITH f AS (UPDATE fence SET renewals = renewals + 1 WHERE epoch = %s RETURNING 1) SELECT 1 / count(*) FROM f",
             (1,))
    store = PgStore(dsn, fence)
    store.commit()  # nothing to write: the fence runs all the same
    Journal(store).session_saved(_session("dev"), 1.0)
    store.commit()
    with psycopg.connect(dsn) as db:
        assert db.execute("SELECT renewals FROM fence").fetchone() == (2,)
        db.execute("UPDATE fence SET epoch = 2")  # another router took the lease
    Journal(store).session_saved(_session("late"), 1.0)
    with pytest.raises(StoreError, match="division by zero"):
        store.commit()
    store.db.close()
    assert list(PgStore(dsn).load().sessions[""]) == ["dev"]  # nothing of the fenced turn


def test_pg_a_dead_database_fails_a_commit_with_one_line_without_the_password(tmp_path: Path) -> None:
    if not postgres_installed():
        pytest.skip("no PostgreSQL server installed")
    server = PostgreSQL()
    try:
        server.sql("ALTER USER postgres PASSWORD 'sekrit'")
        dsn = server.dsn.replace("postgres@", "postgres:sekrit@")
        store = PgStore(dsn)
        server.kill()
        Journal(store).session_saved(_session("dev"), 1.0)
        with pytest.raises(StoreError) as caught:
            store.commit()
        line = str(caught.value)
        assert "\n" not in line and "sekrit" not in line
        assert line.startswith(f"postgresql://{server.host}:{server.port}/postgres: ")
        with pytest.raises(StoreError, match=f"^postgresql://{server.host}:{server.port}/postgres: ") as caught:
            PgStore(dsn)  # and so does opening it
        assert "sekrit" not in str(caught.value) and "\n" not in str(caught.value)
    finally:
        server.remove()
