"""The PostgreSQL store (router/store/__init__.py says what a store is): the state a standby router takes over
(issue 24), in the same tables and columns as SQLite's (BYTEA for BLOB, BIGINT seq and expiry).

Why it is shaped this way: the router's loop is synchronous, so psycopg 3 in its synchronous mode; a
turn's statements go in one pipeline (one round trip for the whole commit: the fence, every
`executemany`, COMMIT). `fence` is `(sql, args)`, a statement that fails when this router no longer
holds the lease (router/ha/lease.py); every commit runs it first, in the same transaction, so an old
active router can write nothing, and a commit with no changes still runs it (the lease's renewal).
A dead or unreachable database fails a commit (StoreError: the router exits and is restarted) within
about `timeout` seconds, never hangs: connect_timeout, TCP keepalives and user timeout, statement_timeout.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

import psycopg
from psycopg.conninfo import conninfo_to_dict

from plexmq.router.store import SCHEMA_VERSION, Fence, Store, StoreError
from plexmq.router.store import journal as op

LOAD_BATCH = 5000  # rows converted at a time while a router loads the store
TIMEOUT = 5.0  # seconds a connect, a statement or an unanswered send may take

_TABLES = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    tenant TEXT NOT NULL DEFAULT '', client_id TEXT NOT NULL, last_seen DOUBLE PRECISION NOT NULL,
    expiry BIGINT NOT NULL DEFAULT -1, PRIMARY KEY (tenant, client_id)
);
CREATE TABLE IF NOT EXISTS subscriptions (
    tenant TEXT NOT NULL DEFAULT '', client_id TEXT NOT NULL, filter TEXT NOT NULL, qos INTEGER NOT NULL,
    PRIMARY KEY (tenant, client_id, filter)
);
CREATE TABLE IF NOT EXISTS messages (
    seq BIGINT PRIMARY KEY, tenant TEXT NOT NULL DEFAULT '', client_id TEXT NOT NULL, packet_id INTEGER NOT NULL,
    topic BYTEA NOT NULL, payload BYTEA NOT NULL, qos INTEGER NOT NULL, retain INTEGER NOT NULL, state INTEGER NOT NULL,
    props BYTEA NOT NULL DEFAULT '', expiry BIGINT NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX IF NOT EXISTS message_ids ON messages (tenant, client_id, packet_id);
CREATE TABLE IF NOT EXISTS incoming (
    tenant TEXT NOT NULL DEFAULT '', client_id TEXT NOT NULL, packet_id INTEGER NOT NULL,
    PRIMARY KEY (tenant, client_id, packet_id)
);
CREATE TABLE IF NOT EXISTS retained (
    tenant TEXT NOT NULL DEFAULT '', topic TEXT NOT NULL, payload BYTEA NOT NULL, qos INTEGER NOT NULL,
    props BYTEA NOT NULL DEFAULT '', expiry BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (tenant, topic)
);
CREATE TABLE IF NOT EXISTS wills (
    tenant TEXT NOT NULL DEFAULT '', client_id TEXT NOT NULL, due DOUBLE PRECISION NOT NULL, topic BYTEA NOT NULL,
    payload BYTEA NOT NULL, qos INTEGER NOT NULL, retain INTEGER NOT NULL, props BYTEA NOT NULL, expiry BIGINT NOT NULL,
    PRIMARY KEY (tenant, client_id)
);
CREATE TABLE IF NOT EXISTS live_wills (
    tenant TEXT NOT NULL, client_id TEXT NOT NULL, worker TEXT NOT NULL, conn_id BIGINT NOT NULL, topic BYTEA NOT NULL,
    payload BYTEA NOT NULL, qos INTEGER NOT NULL, retain INTEGER NOT NULL, props BYTEA NOT NULL, expiry BIGINT NOT NULL,
    delay BIGINT NOT NULL, PRIMARY KEY (tenant, client_id)
);
CREATE TABLE IF NOT EXISTS bans (
    tenant TEXT NOT NULL, kind TEXT NOT NULL, value TEXT NOT NULL, reason TEXT NOT NULL, expires DOUBLE PRECISION NOT NULL,
    made_by TEXT NOT NULL, created DOUBLE PRECISION NOT NULL, PRIMARY KEY (tenant, kind, value)
);
CREATE TABLE IF NOT EXISTS audit (
    seq BIGINT PRIMARY KEY, at DOUBLE PRECISION NOT NULL, admin TEXT NOT NULL, address TEXT NOT NULL,
    tenant TEXT NOT NULL, action TEXT NOT NULL, target TEXT NOT NULL, outcome TEXT NOT NULL
);
"""
_SCHEMA_LOCK = 0x706C65786D71  # "plexmq": routers that open the same new database make its tables one at a time

# router/store/journal.py's OPs; `retain` comes as a bool, the column is an integer as in SQLite (`%s::int`)
_SQL: dict[int, str] = {
    op.SESSION_SAVE: "INSERT INTO sessions (tenant, client_id, last_seen, expiry) VALUES (%s, %s, %s, %s) "
                     "ON CONFLICT (tenant, client_id) DO UPDATE SET last_seen = EXCLUDED.last_seen, expiry = EXCLUDED.expiry",
    op.SESSION_DELETE: "DELETE FROM sessions WHERE tenant = %s AND client_id = %s",
    op.SUBSCRIPTIONS_DELETE: "DELETE FROM subscriptions WHERE tenant = %s AND client_id = %s",
    op.MESSAGES_DELETE: "DELETE FROM messages WHERE tenant = %s AND client_id = %s",
    op.SUBSCRIPTION_SAVE: "INSERT INTO subscriptions (tenant, client_id, filter, qos) VALUES (%s, %s, %s, %s) "
                          "ON CONFLICT (tenant, client_id, filter) DO UPDATE SET qos = EXCLUDED.qos",
    op.SUBSCRIPTION_DELETE: "DELETE FROM subscriptions WHERE tenant = %s AND client_id = %s AND filter = %s",
    op.MESSAGE_SAVE: "INSERT INTO messages (tenant, client_id, packet_id, seq, topic, payload, qos, retain, state, props, "
                     "expiry) VALUES (%s, %s, %s, %s, %s, %s, %s, %s::int, %s, %s, %s) "
                     "ON CONFLICT (tenant, client_id, packet_id) DO UPDATE SET seq = EXCLUDED.seq, topic = EXCLUDED.topic, "
                     "payload = EXCLUDED.payload, qos = EXCLUDED.qos, retain = EXCLUDED.retain, state = EXCLUDED.state, "
                     "props = EXCLUDED.props, expiry = EXCLUDED.expiry",
    op.MESSAGE_STATE: "UPDATE messages SET state = %s WHERE tenant = %s AND client_id = %s AND packet_id = %s",
    op.MESSAGE_RECEIVED: "UPDATE messages SET state = %s, payload = ''::bytea "
                         "WHERE tenant = %s AND client_id = %s AND packet_id = %s",
    op.MESSAGE_DELETE: "DELETE FROM messages WHERE tenant = %s AND client_id = %s AND packet_id = %s",
    op.INCOMING_SAVE: "INSERT INTO incoming (tenant, client_id, packet_id) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
    op.INCOMING_DELETE_ONE: "DELETE FROM incoming WHERE tenant = %s AND client_id = %s AND packet_id = %s",
    op.INCOMING_DELETE: "DELETE FROM incoming WHERE tenant = %s AND client_id = %s",
    op.RETAINED_SAVE: "INSERT INTO retained (tenant, topic, payload, qos, props, expiry) VALUES (%s, %s, %s, %s, %s, %s) "
                      "ON CONFLICT (tenant, topic) DO UPDATE SET payload = EXCLUDED.payload, qos = EXCLUDED.qos, "
                      "props = EXCLUDED.props, expiry = EXCLUDED.expiry",
    op.RETAINED_DELETE: "DELETE FROM retained WHERE tenant = %s AND topic = %s",
    op.WILL_SAVE: "INSERT INTO wills (tenant, client_id, due, topic, payload, qos, retain, props, expiry) "
                  "VALUES (%s, %s, %s, %s, %s, %s, %s::int, %s, %s) ON CONFLICT (tenant, client_id) DO UPDATE SET "
                  "due = EXCLUDED.due, topic = EXCLUDED.topic, payload = EXCLUDED.payload, qos = EXCLUDED.qos, "
                  "retain = EXCLUDED.retain, props = EXCLUDED.props, expiry = EXCLUDED.expiry",
    op.WILL_DELETE: "DELETE FROM wills WHERE tenant = %s AND client_id = %s",
    op.LIVE_WILL_SAVE: "INSERT INTO live_wills (tenant, client_id, worker, conn_id, topic, payload, qos, retain, props, "
                       "expiry, delay) VALUES (%s, %s, %s, %s, %s, %s, %s, %s::int, %s, %s, %s) "
                       "ON CONFLICT (tenant, client_id) DO UPDATE SET worker = EXCLUDED.worker, conn_id = EXCLUDED.conn_id, "
                       "topic = EXCLUDED.topic, payload = EXCLUDED.payload, qos = EXCLUDED.qos, retain = EXCLUDED.retain, "
                       "props = EXCLUDED.props, expiry = EXCLUDED.expiry, delay = EXCLUDED.delay",
    op.LIVE_WILL_DELETE: "DELETE FROM live_wills WHERE tenant = %s AND client_id = %s",
    op.BAN_SAVE: "INSERT INTO bans (tenant, kind, value, reason, expires, made_by, created) "
                 "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (tenant, kind, value) DO UPDATE SET "
                 "reason = EXCLUDED.reason, expires = EXCLUDED.expires, made_by = EXCLUDED.made_by, created = EXCLUDED.created",
    op.BAN_DELETE: "DELETE FROM bans WHERE tenant = %s AND kind = %s AND value = %s",
    op.AUDIT_SAVE: "INSERT INTO audit (seq, at, admin, address, tenant, action, target, outcome) "
                   "VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (seq) DO UPDATE SET at = EXCLUDED.at, "
                   "admin = EXCLUDED.admin, address = EXCLUDED.address, tenant = EXCLUDED.tenant, "
                   "action = EXCLUDED.action, target = EXCLUDED.target, outcome = EXCLUDED.outcome",
    op.AUDIT_TRIM: "DELETE FROM audit WHERE seq <= %s OR at < %s",
}


def describe(dsn: str) -> str:
    """The DSN as log lines name it: host, port and database, never the user's password."""
    try:
        parts = conninfo_to_dict(dsn)
    except psycopg.Error:
        return "postgresql (an invalid DSN)"
    return f"postgresql://{parts.get('host', 'localhost')}:{parts.get('port', 5432)}/{parts.get('dbname', '')}"


# a URL's password as libpq reads it: after "user:" up to the '@' of the authority (which ends at '/'),
# or a `password` parameter
_PASSWORD = re.compile(r"^postgres(?:ql)?://[^:@/]*:([^@/]*)@|[?&]password=([^&]*)")


def masked(dsn: str) -> str:
    """The DSN with each character of its password shown as '*' (acceptor/serve.py hides it so on
    the command line: the same length, in place)."""
    chars = list(dsn)
    for found in _PASSWORD.finditer(dsn):
        start, end = found.span(1) if found.group(1) is not None else found.span(2)
        chars[start:end] = "*" * (end - start)
    return "".join(chars)


# a server that answered and refused us (a wrong user, password, database or pg_hba.conf): a config
# error to stop at; any other failure to connect is an outage the routers wait out
_REFUSED = re.compile(r"authentication|pg_hba\.conf|does not exist|permission denied|invalid", re.I)


def connect(dsn: str, timeout: float = TIMEOUT) -> psycopg.Connection:
    """A connection that fails instead of hanging when the database goes away (libpq's parameters);
    not in autocommit: the first statement begins a transaction. psycopg.Error when it cannot."""
    seconds = max(2, math.ceil(timeout))  # libpq's connect_timeout: whole seconds, at least 2
    return psycopg.connect(dsn, autocommit=False, connect_timeout=seconds, keepalives=1, keepalives_idle=1,
                           keepalives_interval=1, keepalives_count=seconds, tcp_user_timeout=int(timeout * 1000),
                           options=_server_side(timeout))


def _server_side(timeout: float) -> str:
    """The session settings that free what a client cut off mid-transaction holds (the lease row's lock
    above all, which would block every standby): a transaction left waiting for its next statement ends
    after `timeout`, and the server's own TCP keepalives find a client that is gone within about
    `timeout` even while a statement is half received (a link cut in the middle of a turn's pipeline),
    where the idle timeout does not apply."""
    ms, seconds = int(timeout * 1000), max(2, math.ceil(timeout))
    return (f"-c statement_timeout={ms} -c idle_in_transaction_session_timeout={ms} -c tcp_keepalives_idle=1 "
            f"-c tcp_keepalives_interval=1 -c tcp_keepalives_count={seconds} -c tcp_user_timeout={ms}")


class PgStore(Store):
    """The open connection; many routers may open the same database (one of them active: the lease)."""

    errors = (psycopg.Error,)
    shared = True

    def __init__(self, dsn: str, fence: Fence | None = None, timeout: float = TIMEOUT) -> None:
        super().__init__()
        self.name = describe(dsn)
        self.fence = fence
        try:
            self.db = connect(dsn, timeout)
        except psycopg.OperationalError as exc:
            raise self.failed(exc, unreachable=not _REFUSED.search(str(exc))) from None
        except psycopg.Error:  # a DSN libpq cannot parse: its text would repeat the DSN, password and all
            raise StoreError(f"{self.name}: not a valid PostgreSQL URL") from None
        try:
            with self.db.transaction():
                self.db.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                self.db.execute(_TABLES)
                self.db.execute("INSERT INTO meta VALUES ('schema', %s) ON CONFLICT DO NOTHING", (SCHEMA_VERSION,))
                # a version 6 store (before the wills of live connections) has all but live_wills and
                # bans, a version 7 store all but bans, which _TABLES has just made
                self.db.execute("UPDATE meta SET value = 8 WHERE key = 'schema' AND value IN (6, 7)")
        except psycopg.Error as exc:
            raise self.failed(exc) from None
        self.verify()

    def failed(self, exc: Exception, unreachable: bool | None = None) -> StoreError:
        """`unreachable` unless said: a connection that failed or broke (the server went away, or is
        restarting), as opposed to an error the server answered with."""
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        if unreachable is None:
            unreachable = isinstance(exc, psycopg.OperationalError) and not _REFUSED.search(str(exc))
        return StoreError(f"{self.name}: {'; '.join(lines) or type(exc).__name__}", unreachable)

    def verify(self) -> None:
        """The schema version only: the database keeps its pages itself. A newer plexmq's store is refused."""
        try:
            with self.db.transaction():
                row = self.db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        except psycopg.Error as exc:
            raise self.failed(exc) from None
        version = row[0] if row else None
        if version != SCHEMA_VERSION:
            raise StoreError(f"{self.name}: store schema version {version}, this plexmq reads {SCHEMA_VERSION}")

    def _rows(self, query: str) -> Iterator[tuple]:
        """The rows in batches of LOAD_BATCH from a server-side cursor: converting a million rows at once
        would hold the GIL for seconds, and the threads that renew and watch the lease meanwhile need it."""
        with self.db.transaction():
            self.db.execute("SET LOCAL statement_timeout = 0")  # a load takes what it takes (the lease is kept)
            with self.db.cursor(name="load") as cursor:
                cursor.itersize = LOAD_BATCH
                yield from cursor.execute(query)  # store.py's constant text

    def commit(self) -> None:
        ops = self.ops
        db = self.db
        try:
            with db.pipeline():
                cursor = db.cursor()
                if self.fence is not None:
                    cursor.execute(*self.fence)  # router/ha/lease.py's constant text
                for kind, args in op.runs(ops):
                    cursor.executemany(_SQL[kind], args)
                db.commit()
        except psycopg.Error as exc:
            raise self.failed(exc) from None
        ops.clear()  # the list itself stays: the journal appends to it

    def close(self) -> None:
        try:
            if self.ops:
                self.commit()
        finally:
            self.db.close()
