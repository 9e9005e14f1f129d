"""The SQLite store (router/store/__init__.py says what a store is): WAL mode, one file under the data dir.

`sync = "normal"` survives any crash of the broker's processes; `"full"` also survives a power loss (one
fsync per commit). SQLite cannot change a primary key, so migrations make a table again (schema 6).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Iterator

from plexmq.files import private_dir, private_file
from plexmq.router.store import SCHEMA_VERSION, Store, StoreError
from plexmq.router.store import journal as op

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
CREATE TABLE IF NOT EXISTS live_wills (
    tenant TEXT NOT NULL, client_id TEXT NOT NULL, worker TEXT NOT NULL, conn_id INTEGER NOT NULL, topic BLOB NOT NULL,
    payload BLOB NOT NULL, qos INTEGER NOT NULL, retain INTEGER NOT NULL, props BLOB NOT NULL, expiry INTEGER NOT NULL,
    delay INTEGER NOT NULL, PRIMARY KEY (tenant, client_id)
);
CREATE TABLE IF NOT EXISTS bans (
    tenant TEXT NOT NULL, kind TEXT NOT NULL, value TEXT NOT NULL, reason TEXT NOT NULL, expires REAL NOT NULL,
    made_by TEXT NOT NULL, created REAL NOT NULL, PRIMARY KEY (tenant, kind, value)
);
CREATE TABLE IF NOT EXISTS audit (
    seq INTEGER PRIMARY KEY, at REAL NOT NULL, admin TEXT NOT NULL, address TEXT NOT NULL, tenant TEXT NOT NULL,
    action TEXT NOT NULL, target TEXT NOT NULL, outcome TEXT NOT NULL
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
    # the wills of live connections, which only a shared store writes (router/store/journal.py): the table only
    6: f"BEGIN;\n{_create('live_wills')}\nUPDATE meta SET value = 7 WHERE key = 'schema';\nCOMMIT;",
    7: f"BEGIN;\n{_create('bans')}\nUPDATE meta SET value = 8 WHERE key = 'schema';\nCOMMIT;",  # the banned clients
}

_SQL = {  # router/store/journal.py's OPs
    op.SESSION_SAVE: "INSERT OR REPLACE INTO sessions (tenant, client_id, last_seen, expiry) VALUES (?, ?, ?, ?)",
    op.SESSION_DELETE: "DELETE FROM sessions WHERE tenant = ? AND client_id = ?",
    op.SUBSCRIPTIONS_DELETE: "DELETE FROM subscriptions WHERE tenant = ? AND client_id = ?",
    op.MESSAGES_DELETE: "DELETE FROM messages WHERE tenant = ? AND client_id = ?",
    op.SUBSCRIPTION_SAVE: "INSERT OR REPLACE INTO subscriptions (tenant, client_id, filter, qos) VALUES (?, ?, ?, ?)",
    op.SUBSCRIPTION_DELETE: "DELETE FROM subscriptions WHERE tenant = ? AND client_id = ? AND filter = ?",
    op.MESSAGE_SAVE: "INSERT OR REPLACE INTO messages (tenant, client_id, packet_id, seq, topic, payload, qos, retain, "
                     "state, props, expiry) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    op.MESSAGE_STATE: "UPDATE messages SET state = ? WHERE tenant = ? AND client_id = ? AND packet_id = ?",
    op.MESSAGE_RECEIVED: "UPDATE messages SET state = ?, payload = x'' WHERE tenant = ? AND client_id = ? AND packet_id = ?",
    op.MESSAGE_DELETE: "DELETE FROM messages WHERE tenant = ? AND client_id = ? AND packet_id = ?",
    op.INCOMING_SAVE: "INSERT OR IGNORE INTO incoming (tenant, client_id, packet_id) VALUES (?, ?, ?)",
    op.INCOMING_DELETE_ONE: "DELETE FROM incoming WHERE tenant = ? AND client_id = ? AND packet_id = ?",
    op.INCOMING_DELETE: "DELETE FROM incoming WHERE tenant = ? AND client_id = ?",
    op.RETAINED_SAVE: "INSERT OR REPLACE INTO retained (tenant, topic, payload, qos, props, expiry) VALUES (?, ?, ?, ?, ?, ?)",
    op.RETAINED_DELETE: "DELETE FROM retained WHERE tenant = ? AND topic = ?",
    op.WILL_SAVE: "INSERT OR REPLACE INTO wills (tenant, client_id, due, topic, payload, qos, retain, props, expiry) "
                  "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    op.WILL_DELETE: "DELETE FROM wills WHERE tenant = ? AND client_id = ?",
    op.LIVE_WILL_SAVE: "INSERT OR REPLACE INTO live_wills (tenant, client_id, worker, conn_id, topic, payload, qos, retain, "
                       "props, expiry, delay) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    op.LIVE_WILL_DELETE: "DELETE FROM live_wills WHERE tenant = ? AND client_id = ?",
    op.BAN_SAVE: "INSERT OR REPLACE INTO bans (tenant, kind, value, reason, expires, made_by, created) "
                 "VALUES (?, ?, ?, ?, ?, ?, ?)",
    op.BAN_DELETE: "DELETE FROM bans WHERE tenant = ? AND kind = ? AND value = ?",
    op.AUDIT_SAVE: "INSERT OR REPLACE INTO audit (seq, at, admin, address, tenant, action, target, outcome) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    op.AUDIT_TRIM: "DELETE FROM audit WHERE seq <= ? OR at < ?",
}


# Python's sqlite3 binds str, int, float and bytearray as they are but looks for an adapter for bytes and
# bool first (~0.3 us each, mostly a failed attribute lookup): a kept message's row has four, a quarter
# of its insert. Its blobs go as bytearray, a copy, which a large payload is spared.
_COPIED = 4096


def _message_rows(rows: list[tuple]) -> Iterator[tuple]:
    """MESSAGE_SAVE's args as sqlite3 binds them fastest, the same values stored."""
    for tenant, client_id, pid, seq, topic, payload, qos, retain, state, props, expiry in rows:
        yield (tenant, client_id, pid, seq, bytearray(topic), bytearray(payload) if len(payload) <= _COPIED else payload,
               qos, 1 if retain else 0, state, bytearray(props), expiry)


class SqliteStore(Store):
    """The open database file; one broker per data dir (an exclusive lock)."""

    errors = (sqlite3.Error,)

    def __init__(self, data_dir: str, sync: str) -> None:
        super().__init__()
        self.path = self.name = os.path.join(data_dir, FILE_NAME)
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
        """Check every page."""
        try:
            problems = [row[0] for row in self.db.execute("PRAGMA quick_check")]
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: {_reason(exc)}") from None
        if problems != ["ok"]:
            raise StoreError(f"{self.path}: damaged database: {problems[0]}")

    def _rows(self, query: str) -> Iterable[tuple]:
        return self.db.execute(query)

    def failed(self, exc: Exception) -> StoreError:
        return StoreError(f"{self.path}: {_reason(exc)}")

    def commit(self) -> None:
        ops = self.ops
        db = self.db
        try:
            db.execute("BEGIN")
            for kind, args in op.runs(ops):
                db.executemany(_SQL[kind], _message_rows(args) if kind == op.MESSAGE_SAVE else args)
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise self.failed(exc) from None
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

