"""The router's store file (router/store.py) on its own: an older schema is upgraded in place and
nothing it held is lost."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from plexmq.router.store import SCHEMA_VERSION
from plexmq.router.store_sqlite import SqliteStore

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
    assert store.db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() == (SCHEMA_VERSION,) == (6,)
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
