"""What the router writes to its store, as named operations: the one place that knows which changes
are kept at all, and what each one is (an OP and its args; each store backend knows its SQL).

Only persistent sessions are written (a clean session's state ends with its connection), and retained
messages other than `$SYS` (fresh after a restart); on a shared store (PostgreSQL, which a standby
router takes over: issue 24) also every live connection's will, clean sessions' too (`live_will_saved`).
Every row names its tenant (router/tenants.py). Beside them, the audit log of the admins' actions
(`audited`, router/ops/audit.py), whichever session they touch.
Each operation appends `(OP, args)` to the store's list for this turn (`Store.ops`), which
`Store.commit` writes in one transaction, in order, at the end of the turn (router/main.py: before the
turn's acknowledgements). A backend (SQLite, PostgreSQL) needs only this interface.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from plexmq.router.outbox import RELEASING, SENT

if TYPE_CHECKING:
    from plexmq.bans import Ban, Key
    from plexmq.router.message import Message
    from plexmq.router.outbox import Pending
    from plexmq.router.sessions import Session, Will
    from plexmq.router.store import Store

# The changes, one small int each (`Store.ops` holds (OP, args)); each backend maps them to its SQL
# (router/store/sqlite.py, router/store/postgres.py), with the args in the order given here.
SESSION_SAVE = 1  # tenant, client_id, last_seen, expiry
SESSION_DELETE = 2  # tenant, client_id
SUBSCRIPTIONS_DELETE = 3  # tenant, client_id: all of the session's
MESSAGES_DELETE = 4  # tenant, client_id: all of the session's
SUBSCRIPTION_SAVE = 5  # tenant, client_id, filter, qos
SUBSCRIPTION_DELETE = 6  # tenant, client_id, filter
# `expiry` columns hold the absolute deadline (`expires_at`)
MESSAGE_SAVE = 7  # tenant, client_id, packet_id, seq, topic, payload, qos, retain, state, props, expiry
MESSAGE_STATE = 8  # state, tenant, client_id, packet_id
MESSAGE_RECEIVED = 9  # state, tenant, client_id, packet_id: the payload goes
MESSAGE_DELETE = 10  # tenant, client_id, packet_id
INCOMING_SAVE = 11  # tenant, client_id, packet_id (kept if there already)
INCOMING_DELETE_ONE = 12  # tenant, client_id, packet_id
INCOMING_DELETE = 13  # tenant, client_id: all of the session's
RETAINED_SAVE = 14  # tenant, topic, payload, qos, props, expiry
RETAINED_DELETE = 15  # tenant, topic
WILL_SAVE = 16  # tenant, client_id, due, topic, payload, qos, retain, props, expiry
WILL_DELETE = 17  # tenant, client_id
LIVE_WILL_SAVE = 18  # tenant, client_id, worker, conn_id, topic, payload, qos, retain, props, expiry, delay
LIVE_WILL_DELETE = 19  # tenant, client_id
BAN_SAVE = 20  # tenant, kind, value, reason, expires, made_by, created (plexmq/bans.py: Ban)
BAN_DELETE = 21  # tenant, kind, value
AUDIT_SAVE = 22  # seq, at, admin, address, tenant, action, target, outcome (router/ops/audit.py `Entry`)
AUDIT_TRIM = 23  # seq, at: the entries up to that seq, and those older than that time, go
OPS = tuple(range(SESSION_SAVE, AUDIT_TRIM + 1))  # every backend maps each of them

_SESSION_DELETES = (SESSION_DELETE, SUBSCRIPTIONS_DELETE, MESSAGES_DELETE, INCOMING_DELETE, WILL_DELETE)

# One stored message's changes, in the order of its life (a pid taken again comes back to MESSAGE_SAVE),
# and where each names the message in its args (tenant, client_id, packet_id): `runs` gathers them.
_MESSAGE_OPS = {MESSAGE_SAVE: (0, slice(0, 3)), MESSAGE_STATE: (1, slice(1, 4)),
                MESSAGE_RECEIVED: (2, slice(1, 4)), MESSAGE_DELETE: (3, slice(0, 3))}


def runs(ops: Iterable[tuple[int, tuple]]) -> Iterator[tuple[int, list[tuple]]]:
    """A turn's changes as runs of one OP each (a backend's `executemany`), with the same effect as in
    turn order but fewer runs: a QoS 1 flow alternates MESSAGE_SAVE (a new message) and MESSAGE_DELETE
    (an acknowledged one), ~28 runs a turn in turn order. Changes to different messages touch different
    rows, so each message OP's changes are gathered into one run, the runs in the order of a message's
    life; a change that would go before an earlier one of the same message (a pid taken again), and any
    other OP (which may touch every message of a session), first ends the gathering."""
    gathered: dict[int, list[tuple]] = {}  # message OP -> its changes, in turn order
    stages: dict[tuple, int] = {}  # a message (tenant, client_id, pid) -> the stage of its last gathered change
    other: tuple[int, list[tuple]] | None = None  # a run of another OP, growing
    for kind, args in ops:
        found = _MESSAGE_OPS.get(kind)
        if found is None:
            if gathered:
                yield from _in_life_order(gathered)
                gathered, stages = {}, {}
            if other is not None and other[0] == kind:
                other[1].append(args)
                continue
            if other is not None:
                yield other
            other = (kind, [args])
            continue
        if other is not None:
            yield other
            other = None
        stage, key = found
        message = args[key]
        if stages.get(message, stage) > stage:
            yield from _in_life_order(gathered)
            gathered, stages = {}, {}
        stages[message] = stage
        gathered.setdefault(kind, []).append(args)
    if other is not None:
        yield other
    yield from _in_life_order(gathered)


def _in_life_order(gathered: dict[int, list[tuple]]) -> Iterator[tuple[int, list[tuple]]]:
    for kind in _MESSAGE_OPS:
        if kind in gathered:
            yield kind, gathered[kind]


class Journal:
    """The store's changes by name; without a store (persistence off) every operation does nothing.
    Each operation checks for itself whether it applies (`_ops`, `session.persistent`), inline: the
    QoS 1/2 path of a persistent session calls one of them where it appended a change before."""

    __slots__ = ("_ops", "_shared", "seq")

    def __init__(self, store: Store | None) -> None:
        self._ops = store.ops if store is not None else None
        self._shared = store.ops if store is not None and store.shared else None  # `live_will_saved` writes there
        self.seq = 1  # orders the stored messages (a restarted router goes on past the last: `Loaded.next_seq`)

    # -- sessions ---------------------------------------------------------------------------------

    def session_saved(self, session: Session, last_seen: float) -> None:
        """A persistent session connected or went offline: it outlives its connection, by `session.expiry`."""
        if self._ops is not None and session.persistent:
            self._ops.append((SESSION_SAVE, (session.tenant, session.client_id, last_seen, session.expiry)))

    def session_dropped(self, session: Session) -> None:
        """A persistent session ends (expired, discarded, or its expiry set to 0): all it kept goes."""
        if self._ops is not None and session.persistent:
            client = (session.tenant, session.client_id)
            self._ops.extend((op, client) for op in _SESSION_DELETES)

    def subscription_added(self, session: Session, topic_filter: str, grant: int) -> None:
        if self._ops is not None and session.persistent:
            self._ops.append((SUBSCRIPTION_SAVE, (session.tenant, session.client_id, topic_filter, grant)))

    def subscription_removed(self, session: Session, topic_filter: str) -> None:
        if self._ops is not None and session.persistent:
            self._ops.append((SUBSCRIPTION_DELETE, (session.tenant, session.client_id, topic_filter)))

    def will_saved(self, session: Session, will: Will) -> None:
        """An offline session's will waits out its delay: a restarted router sends it when due (`will_at`)."""
        if self._ops is not None and session.persistent:
            self._ops.append((WILL_SAVE, (session.tenant, session.client_id, session.will_at, will.topic, will.payload, will.qos,
                                           will.retain, will.props, will.expiry)))

    def will_dropped(self, session: Session) -> None:
        """A will that waited out its delay was sent, or its client came back. Whatever the session is
        now: one that became clean at its reconnect still has the will stored."""
        if self._ops is not None:
            self._ops.append((WILL_DELETE, (session.tenant, session.client_id)))

    def live_will_saved(self, session: Session, worker: bytes, conn_id: int, will: Will) -> None:
        """A connection with a will registered (on a shared store only): if this router dies, the
        router that takes over holds the connection as live on `worker` until that worker joins or is
        taken for dead, and then sends the will (router/core.py `_restore`)."""
        if self._shared is not None:
            self._shared.append((LIVE_WILL_SAVE, (session.tenant, session.client_id, worker.decode(), conn_id, will.topic,
                                                  will.payload, will.qos, will.retain, will.props, will.expiry,
                                                  will.delay)))

    def live_will_dropped(self, session: Session) -> None:
        """A live connection's will is no longer its (the connection ended, whatever became of the
        will, or the will was taken away); called while `session.will` still holds it: a connection
        without one has no row."""
        if self._shared is not None and session.will is not None:
            self._shared.append((LIVE_WILL_DELETE, (session.tenant, session.client_id)))

    # -- a session's outbox (router/outbox.py) -------------------------------------------------------

    def message_kept(self, session: Session, pid: int, message: Pending) -> None:
        """A QoS 1/2 message joined the session's outbox under packet id `pid`, in its state."""
        if self._ops is not None and session.persistent:
            self.seq += 1
            self._ops.append((MESSAGE_SAVE, (session.tenant, session.client_id, pid, self.seq, message.topic, message.payload,
                                              message.qos, message.retain, message.state, message.props,
                                              message.expires_at)))

    def message_sent(self, session: Session, pid: int) -> None:
        """A queued message went out, now that the client's window had room."""
        if self._ops is not None and session.persistent:
            self._ops.append((MESSAGE_STATE, (SENT, session.tenant, session.client_id, pid)))

    def message_received(self, session: Session, pid: int) -> None:
        """QoS 2: the client has the message (PUBREC); only its PUBREL remains, the payload goes."""
        if self._ops is not None and session.persistent:
            self._ops.append((MESSAGE_RECEIVED, (RELEASING, session.tenant, session.client_id, pid)))

    def message_done(self, session: Session, pid: int) -> None:
        """The message left the outbox: acknowledged, expired while queued, or given to another member."""
        if self._ops is not None and session.persistent:
            self._ops.append((MESSAGE_DELETE, (session.tenant, session.client_id, pid)))

    # -- QoS 2 from the session's client ---------------------------------------------------------------

    def incoming_added(self, session: Session, pid: int) -> None:
        """A QoS 2 PUBLISH was received: a resend of its id before PUBREL is dropped, after a restart too."""
        if self._ops is not None and session.persistent:
            self._ops.append((INCOMING_SAVE, (session.tenant, session.client_id, pid)))

    def incoming_released(self, session: Session, pid: int) -> None:
        if self._ops is not None and session.persistent:
            self._ops.append((INCOMING_DELETE_ONE, (session.tenant, session.client_id, pid)))

    def incoming_cleared(self, session: Session) -> None:
        """No id waits for a release any more (a connection registered again)."""
        if self._ops is not None and session.persistent:
            self._ops.append((INCOMING_DELETE, (session.tenant, session.client_id)))

    # -- the audit log (router/ops/audit.py) --------------------------------------------------------

    def audited(self, entry: tuple, up_to: int, before: float) -> None:
        """An admin's action; the entries up to seq `up_to` and those older than `before` go (the store
        keeps a bounded log)."""
        if self._ops is not None:
            self._ops.append((AUDIT_SAVE, entry))
            self._ops.append((AUDIT_TRIM, (up_to, before)))

    # -- retained messages --------------------------------------------------------------------------

    def retained_set(self, tenant: str, topic: str, message: Message) -> None:
        """A topic's retained message in `tenant` replaced, or cleared by an empty payload; `$SYS` is not kept."""
        if self._ops is not None and not topic.startswith("$SYS/"):
            if message.payload:
                self._ops.append((RETAINED_SAVE, (tenant, topic, message.payload, message.qos, message.props,
                                                   message.expires_at)))
            else:
                self._ops.append((RETAINED_DELETE, (tenant, topic)))

    def retained_cleared(self, tenant: str, topic: str) -> None:
        """A retained message of `tenant` expired."""
        if self._ops is not None:
            self._ops.append((RETAINED_DELETE, (tenant, topic)))

    # -- banned clients (router/bans.py) ---------------------------------------------------------------

    def ban_saved(self, ban: Ban) -> None:
        """A ban made, or made again (its reason, expiry and maker replaced)."""
        if self._ops is not None:
            self._ops.append((BAN_SAVE, tuple(ban)))

    def ban_dropped(self, key: Key) -> None:
        """A ban lifted, or expired."""
        if self._ops is not None:
            self._ops.append((BAN_DELETE, key))
