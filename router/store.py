"""The router's durable store: persistent sessions, their subscriptions and messages, and retained
messages, in SQLite (WAL mode) under the data dir.

Why it is shaped this way: the router records each change as it happens (router/journal.py: a named
operation that owns its statement appends it to `Store.ops`) and `commit` writes one turn's changes in
one transaction, in the order they were made, with one `executemany` per run of the same statement.
The router commits before it sends the turn's acknowledgements, so a publisher's PUBACK/PUBREC and a
SUBACK leave only once what they acknowledge is on disk; deliveries of QoS 0/1 go out before the
commit, so a persistent subscriber's window does not wait for the disk (after a crash a copy may come again, which QoS 1 allows).
Clean sessions are never recorded (the journal decides). `sync = "normal"` survives any crash of the broker's processes;
`"full"` also survives a power loss (one fsync per commit).
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass, field
from itertools import groupby

from plexmq.files import private_dir, private_file
from plexmq.router.message import Message
from plexmq.router.outbox import Pending, restore
from plexmq.router.sessions import Session, Will

SCHEMA_VERSION = 6
FILE_NAME = "plexmq.db"

# every table's rows belong to a tenant (router/tenants.py; '': the default tenant), part of each key
_TABLES = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    tenant TEXT NOT NULL DEFAULT '', client_id TEXT NOT NULL, last_seen REAL NOT NULL,
    expiry INTEGER NOT NULL DEFAULT -1, PRIMARY KEY (tenant, client_id)
);
CREATE TABLE IF NOT EXISTS subscriptions (
    tenant TEXT NOT NULL DEFAULT '', client_id TEXT NOT NULL, filter TEXT NOT NULL, qos INTEGER NOT NULL,
    PRIMARY KEY (tenant, client_id, filter)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY, tenant TEXT NOT NULL DEFAULT '', client_id TEXT NOT NULL, packet_id INTEGER NOT NULL,
    topic BLOB NOT NULL, payload BLOB NOT NULL, qos INTEGER NOT NULL, retain INTEGER NOT NULL, state INTEGER NOT NULL,
    props BLOB NOT NULL DEFAULT x'', expiry INTEGER NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX IF NOT EXISTS message_ids ON messages (tenant, client_id, packet_id);
CREATE TABLE IF NOT EXISTS incoming (
    tenant TEXT NOT NULL DEFAULT '', client_id TEXT NOT NULL, packet_id INTEGER NOT NULL,
    PRIMARY KEY (tenant, client_id, packet_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS retained (
    tenant TEXT NOT NULL DEFAULT '', topic TEXT NOT NULL, payload BLOB NOT NULL, qos INTEGER NOT NULL,
    props BLOB NOT NULL DEFAULT x'', expiry INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (tenant, topic)
);
CREATE TABLE IF NOT EXISTS wills (
    tenant TEXT NOT NULL DEFAULT '', client_id TEXT NOT NULL, due REAL NOT NULL, topic BLOB NOT NULL,
    payload BLOB NOT NULL, qos INTEGER NOT NULL, retain INTEGER NOT NULL, props BLOB NOT NULL, expiry INTEGER NOT NULL,
    PRIMARY KEY (tenant, client_id)
);
"""

_TO_VERSION_3 = """
BEGIN;
ALTER TABLE messages ADD COLUMN props BLOB NOT NULL DEFAULT x'';
ALTER TABLE messages ADD COLUMN expiry INTEGER NOT NULL DEFAULT 0;
ALTER TABLE retained ADD COLUMN props BLOB NOT NULL DEFAULT x'';
ALTER TABLE retained ADD COLUMN expiry INTEGER NOT NULL DEFAULT 0;
UPDATE meta SET value = 3 WHERE key = 'schema';
COMMIT;
"""

_TO_VERSION_4 = """
BEGIN;
ALTER TABLE sessions ADD COLUMN expiry INTEGER NOT NULL DEFAULT -1;
UPDATE meta SET value = 4 WHERE key = 'schema';
COMMIT;
"""

_TO_VERSION_5 = """
BEGIN;
UPDATE meta SET value = 5 WHERE key = 'schema';
COMMIT;
"""


def _to_version_6() -> str:
    """Every table gains its tenant ('' for what is there), in its key: SQLite cannot change a primary
    key, so each table is made again in its version 6 form (_TABLES) and its rows copied over, all in
    one transaction. The tables of a store older than 5 that _TABLES made already have the column:
    only the columns both forms share are named."""
    columns = {"sessions": "client_id, last_seen, expiry", "subscriptions": "client_id, filter, qos",
               "messages": "seq, client_id, packet_id, topic, payload, qos, retain, state, props, expiry",
               "incoming": "client_id, packet_id", "retained": "topic, payload, qos, props, expiry",
               "wills": "client_id, due, topic, payload, qos, retain, props, expiry"}
    steps = ["BEGIN;", "DROP INDEX message_ids;"]
    for table, names in columns.items():
        steps += [f"ALTER TABLE {table} RENAME TO {table}_5;", _create(table),
                  f"INSERT INTO {table} ({names}) SELECT {names} FROM {table}_5;", f"DROP TABLE {table}_5;"]
    steps += [_TABLES[_TABLES.index("CREATE UNIQUE INDEX"):].split(";")[0] + ";",
              "UPDATE meta SET value = 6 WHERE key = 'schema';", "COMMIT;"]
    return "\n".join(steps)


def _create(table: str) -> str:
    """The CREATE statement of `table` in _TABLES."""
    start = _TABLES.index(f"CREATE TABLE IF NOT EXISTS {table} (")
    return _TABLES[start:_TABLES.index(";", start) + 1]


_MIGRATIONS = {  # a version -> the script that takes a store from it to the next
    2: _TO_VERSION_3,  # before MQTT 5: messages and retained messages gain their properties and expiry
    3: _TO_VERSION_4,  # sessions gain their own expiry interval
    4: _TO_VERSION_5,  # the delayed wills of offline sessions are kept: the wills table, which _TABLES makes
    5: _to_version_6(),  # tenants: every row names its tenant
}

class StoreError(Exception):
    """One line naming the file and what is wrong with it."""


@dataclass
class Loaded:
    """What a restarted router starts from, per tenant (its name -> client id or topic -> ...)."""

    sessions: dict[str, dict[str, Session]] = field(default_factory=dict)
    retained: dict[str, dict[str, Message]] = field(default_factory=dict)
    next_seq: int = 1


class Store:
    """The open database: the journal appends a turn's changes to `ops`, `commit` writes them at its end."""

    def __init__(self, data_dir: str, sync: str) -> None:
        self.path = os.path.join(data_dir, FILE_NAME)
        self.ops: list[tuple[str, tuple]] = []  # this turn's changes, as router/journal.py writes them
        if os.path.exists(data_dir) and not os.path.isdir(data_dir):
            raise StoreError(f"{data_dir}: not a directory")
        try:
            private_dir(data_dir)
        except OSError as exc:
            raise StoreError(f"{data_dir}: cannot create the data dir: {exc.strerror}") from None
        try:
            private_file(self.path)
            self.db = sqlite3.connect(self.path, timeout=1.0, isolation_level=None)
            self.db.execute("PRAGMA journal_mode = WAL")
            self.db.execute(f"PRAGMA synchronous = {'FULL' if sync == 'full' else 'NORMAL'}")
            self.db.execute("PRAGMA locking_mode = EXCLUSIVE")  # one broker per data dir
            self.db.executescript(_TABLES)
            self._check_version()
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"{self.path}: {_reason(exc)}") from None

    def _check_version(self) -> None:
        """Upgrade an older store in place, one version at a time; refuse one this plexmq cannot read."""
        row = self.db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        if row is None:
            self.db.execute("INSERT INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
            return
        version = row[0]
        if version != SCHEMA_VERSION and version not in _MIGRATIONS:
            raise StoreError(f"{self.path}: store schema version {version}, this plexmq reads {SCHEMA_VERSION}")
        while version < SCHEMA_VERSION:
            self.db.executescript(_MIGRATIONS[version])
            version += 1

    def verify(self) -> None:
        """Check every page (startup): a damaged store must stop the broker, not start it empty."""
        try:
            problems = [row[0] for row in self.db.execute("PRAGMA quick_check")]
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: {_reason(exc)}") from None
        if problems != ["ok"]:
            raise StoreError(f"{self.path}: damaged database: {problems[0]}")

    def load(self) -> Loaded:
        loaded = Loaded()
        try:
            db = self.db
            sessions: dict[tuple[str, str], Session] = {}  # (tenant, client id) -> its session
            for tenant, client_id, last_seen, expiry in db.execute("SELECT tenant, client_id, last_seen, expiry "
                                                                   "FROM sessions"):
                session = sessions[(tenant, client_id)] = Session(client_id, True, tenant)
                session.seen = last_seen
                session.expiry = expiry
                loaded.sessions.setdefault(tenant, {})[client_id] = session
            for tenant, client_id, topic_filter, qos in db.execute("SELECT tenant, client_id, filter, qos "
                                                                   "FROM subscriptions"):
                if (found := sessions.get((tenant, client_id))) is not None:
                    found.subs[topic_filter] = qos
            rows = db.execute("SELECT tenant, client_id, packet_id, topic, payload, qos, retain, state, props, expiry "
                              "FROM messages ORDER BY seq")  # the rowid: read in order, nothing to sort
            for tenant, client_id, pid, topic, payload, qos, retain, state, props, expires_at in rows:
                if (found := sessions.get((tenant, client_id))) is not None:
                    restore(found, pid, Pending(topic, payload, qos, bool(retain), props, expires_at), state)
            rows = db.execute("SELECT tenant, client_id, due, topic, payload, qos, retain, props, expiry FROM wills")
            for tenant, client_id, due, topic, payload, qos, retain, props, expiry in rows:
                if (found := sessions.get((tenant, client_id))) is not None:  # a will waiting out its delay (MQTT 5)
                    found.will = Will(topic, payload, qos, bool(retain), props, expiry)
                    found.will_at = due
            for tenant, client_id, pid in db.execute("SELECT tenant, client_id, packet_id FROM incoming"):
                if (found := sessions.get((tenant, client_id))) is not None:
                    found.receive(pid)
            for tenant, topic, payload, qos, props, expires_at in db.execute("SELECT tenant, topic, payload, qos, props, "
                                                                             "expiry FROM retained"):
                message = Message(topic.encode(), payload, qos, True, props, expires_at)
                loaded.retained.setdefault(tenant, {})[topic] = message
            loaded.next_seq = (db.execute("SELECT max(seq) FROM messages").fetchone()[0] or 0) + 1
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: {_reason(exc)}") from None
        return loaded

    def commit(self) -> None:
        """Write the turn's changes in one transaction (a failure here stops the router: better a
        restart from the last commit than acknowledging what is not stored)."""
        ops = self.ops
        db = self.db
        db.execute("BEGIN")
        for statement, group in groupby(ops, key=lambda op: op[0]):
            db.executemany(statement, [args for _, args in group])
        db.execute("COMMIT")
        ops.clear()  # the list itself stays: the journal appends to it

    def close(self) -> None:
        if self.ops:
            self.commit()
        self.db.close()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc)
    if "file is not a database" in text or "malformed" in text:
        return f"not a plexmq store or damaged ({text})"
    if "locked" in text:
        return f"{text} (is another plexmq using this data dir?)"
    return text

