"""What the router writes to its store, as named operations: the one place that knows the SQL of a
change and which changes are kept at all.

Only persistent sessions are written (a clean session's state ends with its connection), and retained
messages other than `$SYS` (fresh after a restart). Every row names its tenant (router/tenants.py).
Each operation appends its statement to the store's list for this turn (`Store.ops`), which
`Store.commit` writes in one transaction, in order, at the end of the turn (router/main.py: before the
turn's acknowledgements). Another backend, or a standby router that follows the changes, needs only
this interface.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plexmq.router.outbox import RELEASING, SENT

if TYPE_CHECKING:
    from plexmq.router.message import Message
    from plexmq.router.outbox import Pending
    from plexmq.router.sessions import Session, Will
    from plexmq.router.store import Store

_SESSION_SAVE = "INSERT OR REPLACE INTO sessions (tenant, client_id, last_seen, expiry) VALUES (?, ?, ?, ?)"
_SESSION_DELETES = tuple(f"DELETE FROM {table} WHERE tenant = ? AND client_id = ?"
                         for table in ("sessions", "subscriptions", "messages", "incoming", "wills"))
_SUB_SAVE = "INSERT OR REPLACE INTO subscriptions (tenant, client_id, filter, qos) VALUES (?, ?, ?, ?)"
_SUB_DELETE = "DELETE FROM subscriptions WHERE tenant = ? AND client_id = ? AND filter = ?"
# `expiry` columns hold the absolute deadline (`expires_at`)
_MESSAGE_SAVE = "INSERT OR REPLACE INTO messages (tenant, client_id, packet_id, seq, topic, payload, qos, retain, state, " \
                "props, expiry) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_MESSAGE_STATE = "UPDATE messages SET state = ? WHERE tenant = ? AND client_id = ? AND packet_id = ?"
_MESSAGE_RECEIVED = "UPDATE messages SET state = ?, payload = x'' WHERE tenant = ? AND client_id = ? AND packet_id = ?"
_MESSAGE_DELETE = "DELETE FROM messages WHERE tenant = ? AND client_id = ? AND packet_id = ?"
_INCOMING_SAVE = "INSERT OR IGNORE INTO incoming (tenant, client_id, packet_id) VALUES (?, ?, ?)"
_INCOMING_DELETE_ONE = "DELETE FROM incoming WHERE tenant = ? AND client_id = ? AND packet_id = ?"
_INCOMING_DELETE = "DELETE FROM incoming WHERE tenant = ? AND client_id = ?"
_RETAINED_SAVE = "INSERT OR REPLACE INTO retained (tenant, topic, payload, qos, props, expiry) VALUES (?, ?, ?, ?, ?, ?)"
_RETAINED_DELETE = "DELETE FROM retained WHERE tenant = ? AND topic = ?"
_WILL_SAVE = "INSERT OR REPLACE INTO wills (tenant, client_id, due, topic, payload, qos, retain, props, expiry) " \
             "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
_WILL_DELETE = "DELETE FROM wills WHERE tenant = ? AND client_id = ?"


class Journal:
    """The store's changes by name; without a store (persistence off) every operation does nothing.
    Each operation checks for itself whether it applies (`_ops`, `session.persistent`), inline: the
    QoS 1/2 path of a persistent session calls one of them where it appended a statement before."""

    __slots__ = ("_ops", "seq")

    def __init__(self, store: Store | None) -> None:
        self._ops = store.ops if store is not None else None
        self.seq = 1  # orders the stored messages (a restarted router goes on past the last: `Loaded.next_seq`)

    # -- sessions ---------------------------------------------------------------------------------

    def session_saved(self, session: Session, last_seen: float) -> None:
        """A persistent session connected or went offline: it outlives its connection, by `session.expiry`."""
        if self._ops is not None and session.persistent:
            self._ops.append((_SESSION_SAVE, (session.tenant, session.client_id, last_seen, session.expiry)))

    def session_dropped(self, session: Session) -> None:
        """A persistent session ends (expired, discarded, or its expiry set to 0): all it kept goes."""
        if self._ops is not None and session.persistent:
            client = (session.tenant, session.client_id)
            self._ops.extend((statement, client) for statement in _SESSION_DELETES)

    def subscription_added(self, session: Session, topic_filter: str, grant: int) -> None:
        if self._ops is not None and session.persistent:
            self._ops.append((_SUB_SAVE, (session.tenant, session.client_id, topic_filter, grant)))

    def subscription_removed(self, session: Session, topic_filter: str) -> None:
        if self._ops is not None and session.persistent:
            self._ops.append((_SUB_DELETE, (session.tenant, session.client_id, topic_filter)))

    def will_saved(self, session: Session, will: Will) -> None:
        """An offline session's will waits out its delay: a restarted router sends it when due (`will_at`)."""
        if self._ops is not None and session.persistent:
            self._ops.append((_WILL_SAVE, (session.tenant, session.client_id, session.will_at, will.topic, will.payload, will.qos,
                                           will.retain, will.props, will.expiry)))

    def will_dropped(self, session: Session) -> None:
        """A will that waited out its delay was sent, or its client came back. Whatever the session is
        now: one that became clean at its reconnect still has the will stored."""
        if self._ops is not None:
            self._ops.append((_WILL_DELETE, (session.tenant, session.client_id)))

    # -- a session's outbox (router/outbox.py) -------------------------------------------------------

    def message_kept(self, session: Session, pid: int, message: Pending) -> None:
        """A QoS 1/2 message joined the session's outbox under packet id `pid`, in its state."""
        if self._ops is not None and session.persistent:
            self.seq += 1
            self._ops.append((_MESSAGE_SAVE, (session.tenant, session.client_id, pid, self.seq, message.topic, message.payload,
                                              message.qos, message.retain, message.state, message.props,
                                              message.expires_at)))

    def message_sent(self, session: Session, pid: int) -> None:
        """A queued message went out, now that the client's window had room."""
        if self._ops is not None and session.persistent:
            self._ops.append((_MESSAGE_STATE, (SENT, session.tenant, session.client_id, pid)))

    def message_received(self, session: Session, pid: int) -> None:
        """QoS 2: the client has the message (PUBREC); only its PUBREL remains, the payload goes."""
        if self._ops is not None and session.persistent:
            self._ops.append((_MESSAGE_RECEIVED, (RELEASING, session.tenant, session.client_id, pid)))

    def message_done(self, session: Session, pid: int) -> None:
        """The message left the outbox: acknowledged, expired while queued, or given to another member."""
        if self._ops is not None and session.persistent:
            self._ops.append((_MESSAGE_DELETE, (session.tenant, session.client_id, pid)))

    # -- QoS 2 from the session's client ---------------------------------------------------------------

    def incoming_added(self, session: Session, pid: int) -> None:
        """A QoS 2 PUBLISH was received: a resend of its id before PUBREL is dropped, after a restart too."""
        if self._ops is not None and session.persistent:
            self._ops.append((_INCOMING_SAVE, (session.tenant, session.client_id, pid)))

    def incoming_released(self, session: Session, pid: int) -> None:
        if self._ops is not None and session.persistent:
            self._ops.append((_INCOMING_DELETE_ONE, (session.tenant, session.client_id, pid)))

    def incoming_cleared(self, session: Session) -> None:
        """No id waits for a release any more (a connection registered again)."""
        if self._ops is not None and session.persistent:
            self._ops.append((_INCOMING_DELETE, (session.tenant, session.client_id)))

    # -- retained messages --------------------------------------------------------------------------

    def retained_set(self, tenant: str, topic: str, message: Message) -> None:
        """A topic's retained message in `tenant` replaced, or cleared by an empty payload; `$SYS` is not kept."""
        if self._ops is not None and not topic.startswith("$SYS/"):
            if message.payload:
                self._ops.append((_RETAINED_SAVE, (tenant, topic, message.payload, message.qos, message.props,
                                                   message.expires_at)))
            else:
                self._ops.append((_RETAINED_DELETE, (tenant, topic)))

    def retained_cleared(self, tenant: str, topic: str) -> None:
        """A retained message of `tenant` expired."""
        if self._ops is not None:
            self._ops.append((_RETAINED_DELETE, (tenant, topic)))
