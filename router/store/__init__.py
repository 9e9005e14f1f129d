"""The router's durable store: persistent sessions, their subscriptions and messages, retained messages,
delayed wills, the banned clients (plexmq/bans.py), on a shared store the wills of live connections
(`Carried`), and the admins' audit log (router/ops/audit.py: its table needs no migration, as _TABLES
makes it in any store, and an older plexmq leaves it alone). What every backend shares lives here: the
interface the router uses, the loader that builds a restarted router's state from the rows, and the
choice of backend (`open_store`).

Why it is shaped this way: the router records each change as it happens (router/store/journal.py: a named
operation appends `(OP, args)` to `Store.ops`) and `commit` writes one turn's changes in one
transaction, with the effect of the order they were made in, one `executemany` per run of the same OP
(`journal.runs`: one stored message's changes in order, different messages' gathered by OP). The router
commits before it sends the turn's acknowledgements, so a publisher's PUBACK/PUBREC and a SUBACK leave
only once what they acknowledge is stored; deliveries of QoS 0/1 go out before the commit, so a
persistent subscriber's window does not wait for the store (after a crash a copy may come again, which
QoS 1 allows). Clean sessions are never recorded (the journal decides; on a shared store only their
connection's will is).

Backends: SQLite under the data dir (router/store/sqlite.py, the default) and PostgreSQL
(router/store/postgres.py, `store = "postgresql://..."`), with the same tables and columns.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from plexmq.bans import Ban
from plexmq.router.message import Message
from plexmq.router.ops import audit
from plexmq.router.outbox import Pending, restore
from plexmq.router.sessions import Session, Will

SCHEMA_VERSION = 8

Fence = tuple[str, tuple]  # a statement every PostgreSQL commit runs first (the router lease's epoch)


class StoreError(Exception):
    """One line naming the store (file, or host/port/database) and what is wrong with it. `unreachable`:
    a shared store's server did not answer (it may come back: the routers wait for it), as opposed to
    one that refused us or holds what this plexmq cannot read."""

    def __init__(self, line: str, unreachable: bool = False) -> None:
        super().__init__(line)
        self.unreachable = unreachable


class Carried(NamedTuple):
    """The will of a connection the last active router held on `worker` (a shared store only,
    router/store/journal.py `live_will_saved`): the new active router holds it as connected there until
    the worker joins or is taken for dead, so that the will goes out if the connection died too."""

    tenant: str
    client_id: str
    worker: bytes
    conn_id: int
    will: Will


@dataclass
class Loaded:
    """What a restarted router starts from, per tenant (its name -> client id or topic -> ...)."""

    sessions: dict[str, dict[str, Session]] = field(default_factory=dict)
    retained: dict[str, dict[str, Message]] = field(default_factory=dict)
    next_seq: int = 1
    carried: list[Carried] = field(default_factory=list)
    bans: list[Ban] = field(default_factory=list)  # expired ones too: the router lifts them (router/bans.py)
    audit: list[tuple] = field(default_factory=list)  # the audit log's rows, oldest first (router/ops/audit.py)


class Store:
    """The open store: the journal appends a turn's changes to `ops`, `commit` writes them at its end.
    A backend gives `name` (for log lines; never a password), `_rows`, `commit`, `verify`, `close`."""

    name: str
    errors: tuple[type[Exception], ...] = ()  # the driver's errors, which `load` turns into StoreError
    # whether another router may take this store over (PostgreSQL, issue 24): only then are the wills
    # of live connections written (router/store/journal.py), which a router's own restart does not need
    shared = False

    def __init__(self) -> None:
        self.ops: list[tuple[int, tuple]] = []  # this turn's changes, as router/store/journal.py writes them

    def _rows(self, query: str) -> Iterable[tuple]:
        raise NotImplementedError

    def commit(self) -> None:
        """Write the turn's changes in one transaction; StoreError if it fails (the router stops:
        better a restart from the last commit than acknowledging what is not stored)."""
        raise NotImplementedError

    def verify(self) -> None:
        """A startup check: a damaged store must stop the broker, not start it empty (StoreError)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def load(self) -> Loaded:
        loaded = Loaded()
        try:
            rows = self._rows
            sessions: dict[tuple[str, str], Session] = {}  # (tenant, client id) -> its session
            for tenant, client_id, last_seen, expiry in rows("SELECT tenant, client_id, last_seen, expiry FROM sessions"):
                session = sessions[(tenant, client_id)] = Session(client_id, True, tenant)
                session.seen = last_seen
                session.expiry = expiry
                loaded.sessions.setdefault(tenant, {})[client_id] = session
            for tenant, client_id, topic_filter, qos in rows("SELECT tenant, client_id, filter, qos FROM subscriptions"):
                if (found := sessions.get((tenant, client_id))) is not None:
                    found.subs[topic_filter] = qos
            for tenant, client_id, pid, topic, payload, qos, retain, state, props, expires_at in rows(
                    "SELECT tenant, client_id, packet_id, topic, payload, qos, retain, state, props, expiry "
                    "FROM messages ORDER BY seq"):  # SQLite: the rowid, read in order, nothing to sort
                if (found := sessions.get((tenant, client_id))) is not None:
                    restore(found, pid, Pending(topic, payload, qos, bool(retain), props, expires_at), state)
            for tenant, client_id, due, topic, payload, qos, retain, props, expiry in rows(
                    "SELECT tenant, client_id, due, topic, payload, qos, retain, props, expiry FROM wills"):
                if (found := sessions.get((tenant, client_id))) is not None:  # a will waiting out its delay (MQTT 5)
                    found.will = Will(topic, payload, qos, bool(retain), props, expiry)
                    found.will_at = due
            for tenant, client_id, pid in rows("SELECT tenant, client_id, packet_id FROM incoming"):
                if (found := sessions.get((tenant, client_id))) is not None:
                    found.receive(pid)
            for tenant, topic, payload, qos, props, expires_at in rows("SELECT tenant, topic, payload, qos, props, expiry "
                                                                       "FROM retained"):
                message = Message(topic.encode(), payload, qos, True, props, expires_at)
                loaded.retained.setdefault(tenant, {})[topic] = message
            for tenant, client_id, worker, conn_id, topic, payload, qos, retain, props, expiry, delay in rows(
                    "SELECT tenant, client_id, worker, conn_id, topic, payload, qos, retain, props, expiry, delay "
                    "FROM live_wills"):
                will = Will(topic, payload, qos, bool(retain), props, expiry, delay)
                loaded.carried.append(Carried(tenant, client_id, worker.encode(), conn_id, will))
            loaded.bans = [Ban(*row) for row in rows("SELECT tenant, kind, value, reason, expires, made_by, created FROM bans")]
            loaded.next_seq = (list(rows("SELECT max(seq) FROM messages"))[0][0] or 0) + 1
            loaded.audit = list(rows(f"SELECT seq, at, admin, address, tenant, action, target, outcome FROM audit "
                                     f"ORDER BY seq DESC LIMIT {audit.KEEP}"))[::-1]
        except self.errors as exc:
            raise self.failed(exc) from None
        return loaded

    def failed(self, exc: Exception) -> StoreError:
        """The one line for a driver's error."""
        return StoreError(f"{self.name}: {exc}")


def open_store(config: dict, fence: Fence | None = None) -> Store | None:
    """The store the config names (`store`: a PostgreSQL DSN, or empty for SQLite in `data_dir`); None
    when persistence is off. `fence`: see router/store/postgres.py (SQLite has none: one router per file)."""
    if not config["persistence"]:
        return None
    if config["store"]:
        from plexmq.router.store.postgres import TIMEOUT, PgStore  # psycopg is imported only where PostgreSQL is used

        # with a lease, nothing may wait longer than the lease: its holder steps down at 0.75 of it anyway
        return PgStore(config["store"], fence, min(config["router_lease"], TIMEOUT) if fence else TIMEOUT)
    from plexmq.router.store.sqlite import SqliteStore

    return SqliteStore(config["data_dir"], config["sync"])
