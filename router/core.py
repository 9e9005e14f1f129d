"""The router's state machine: it takes the records of a worker and answers in per-worker batches.

It owns the client-id registry, the subscription trie, retained messages and the persistent
sessions. It never touches a socket: `main.py` feeds it frames and sends the batches it fills.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import orjson

from router import grants
from router import store as db
from router import wire
from router.grants import Matched
from router.retain import Retained, RetainedStore
from router.deadlines import Deadlines
from router.sessions import DEFAULT_EXPIRY, NEVER, QUEUED, RELEASING, SENT, Pending, Session, Share, Will
from router.shared import SharedGroup
from router.listing import ClientDisconnect, ClientListing
from router.store import Store
from router.trie import SubscriptionTrie
from workers.mqtt import framing
from workers.mqtt.topics import shared

log = logging.getLogger("plexmq.router")

_pack_sub = wire.SUBSCRIBER.pack
_pack_deliver = wire.DELIVER_HEAD.pack
_unpack_pub = wire.PUB_HEAD.unpack_from
_unpack_count = wire.COUNT.unpack_from
_count_size = wire.COUNT.size
_pub_head_size = wire.PUB_HEAD.size


def _deliver_head(topic: bytes, qos: int, retain: bool, dup: bool, props: bytes, expiry: int) -> bytes:
    """A DELIVER record's header up to its subscribers."""
    flags = wire.pub_flags(qos, retain, dup)
    if props or expiry:
        return _pack_deliver(flags | wire.HAS_EXTRA, len(topic)) + topic + wire.extra(props, expiry)
    return _pack_deliver(flags, len(topic)) + topic


class Dest:
    """A worker's share of one topic's subscribers, collecting raw QoS 0 packets during a turn."""

    __slots__ = ("worker", "subs", "pending", "count")

    def __init__(self, worker: bytes, subs: bytes) -> None:
        self.worker = worker
        self.subs = subs  # every online subscriber on that worker, packed
        self.pending: tuple[list[bytes], list[bytes]] = ([], [])  # runs of packets: 3.1.1 and 5.0 form
        self.count = 0  # packets in `pending`


class Targets:
    """One cached match of a topic."""

    __slots__ = ("raw", "online", "offline", "special", "groups")

    def __init__(self, raw: list[Dest], online: list[tuple[bytes, bytes, list[tuple[Session, int]]]],
                 offline: list[tuple[Session, Matched]], special: list[tuple[Session, Matched]],
                 groups: list[SharedGroup]) -> None:
        self.raw = raw  # for plain QoS 0 runs
        self.online = online  # per worker: (worker, packed clean subscribers, persistent (session, granted))
        self.offline = offline  # persistent sessions without a connection
        # online subscribers whose subscriptions are not plain (MQTT 5 options or identifiers):
        # each message is resolved for each of them (router/grants.py)
        self.special = special
        self.groups = groups  # shared subscriptions: one member of each is chosen per message


MATCH_CACHE_SIZE = 100_000


class Router:
    """Routing and session logic; `out(worker)` gives the batch bound for that worker this turn."""

    def __init__(self, max_inflight: int, max_queued: int, max_queued_bytes: int = 0, store: Store | None = None,
                 expiration: float = 0.0, share_strategy: str = "round_robin") -> None:
        self.sessions: dict[str, Session] = {}
        self.groups: dict[str, SharedGroup] = {}  # "$share/{name}/{filter}" -> its group
        self.deadlines = Deadlines()  # delayed wills and sessions with their own expiry interval
        self.share_strategy = share_strategy
        self.by_conn: dict[tuple[bytes, int], Session] = {}
        self.trie = SubscriptionTrie()
        self.retained = RetainedStore()
        self.worker_pids: dict[bytes, int] = {}
        self.batches: dict[bytes, wire.Batch] = {}
        self.routed: dict[bytes, int] = {}
        self.cache: dict[bytes, Targets] = {}
        self.raw_dirty: list[Dest] = []
        self.pending_limit = max_inflight + max_queued
        self.max_bytes = max_queued_bytes
        self.window = max_inflight
        self.store = store
        self.expiration = expiration  # seconds an offline persistent session is kept (0: forever)
        self.seq = 1  # orders the stored messages
        self.reports: dict[int, dict] = {}  # worker id -> its last STATS (with "at": when it came)
        self.listings: dict[int, ClientListing] = {}  # `plexmq clients` requests waiting for workers
        self.received = 0
        self.delivered = 0
        self.dropped = 0
        self._handlers: dict[int, Callable[[bytes, bytes, bytes], None]] = {
            wire.HELLO: self._on_hello,
            wire.CONNECT: self._on_connect,
            wire.SUBSCRIBE: self._on_subscribe,
            wire.UNSUBSCRIBE: self._on_unsubscribe,
            wire.PUB: self._on_pub,
            wire.PUB0: self._on_pub0,
            wire.PUB0_V5: self._on_pub0_v5,
            wire.ACK: self._on_ack,
            wire.REL: self._on_rel,
            wire.GONE: self._on_gone,
            wire.SESSION_EXPIRY: self._on_session_expiry,
            wire.STATS: self._on_stats,
            wire.CLIENTS: self._on_clients,
        }
        if store is not None:
            self._restore(store)

    def _restore(self, store: Store) -> None:
        """Start from what the store kept: offline persistent sessions, their subscriptions, retained."""
        loaded = store.load()
        self.sessions = loaded.sessions
        for session in loaded.sessions.values():
            for topic_filter, grant in list(session.subs.items()):
                self._subscribe(session, topic_filter, grant)
            if session.ends_at():
                self.deadlines.add(session.ends_at(), session)
        self.retained.messages = loaded.retained
        self.seq = loaded.next_seq
        log.info("store %s: %d persistent sessions, %d queued or unacknowledged messages, %d retained",
                 store.path, len(loaded.sessions), sum(len(s.unacked) for s in loaded.sessions.values()),
                 len(loaded.retained))

    # -- frames in, batches out ---------------------------------------------------------------

    def out(self, worker: bytes) -> wire.Batch:
        batch = self.batches.get(worker)
        if batch is None:
            batch = self.batches[worker] = wire.Batch()
        return batch

    def handle_frame(self, worker: bytes, frame: bytes) -> None:
        handlers = self._handlers
        for kind, header, payload in wire.records(frame):
            if kind != wire.PUB0 and kind != wire.PUB0_V5 and self.raw_dirty:
                self._flush_raw()  # keep every worker's records in the order they were caused
            handlers[kind](worker, header, payload)

    def take_frames(self, split: bool) -> list[tuple[bytes, bytes, bytes]]:
        """This turn's frames, (worker, now, later), acknowledgements of routed PUBs last. With
        `split`, `later` holds what may leave only after the store's commit: acknowledgements (SESSION,
        SUBACK, UNSUBACK, ROUTED) and QoS 2 deliveries, with whatever follows them; the rest leaves
        at once, so a persistent subscriber's window does not wait for the disk."""
        if self.raw_dirty:
            self._flush_raw()
        for worker, count in self.routed.items():
            out = self.out(worker)
            out.hold()
            out.add(wire.ROUTED, wire.COUNT.pack(count))
        self.routed.clear()
        if split:
            return [(worker, *batch.take_split()) for worker, batch in self.batches.items() if batch]
        return [(worker, batch.take(), b"") for worker, batch in self.batches.items() if batch]

    # -- connections -----------------------------------------------------------------------------

    def _on_hello(self, worker: bytes, header: bytes, payload: bytes) -> None:
        worker_id, pid = orjson.loads(header)
        previous = self.worker_pids.get(worker)
        self.worker_pids[worker] = pid
        if previous is not None and previous != pid:
            lost = [key for key in self.by_conn if key[0] == worker]
            log.warning("worker %s restarted (pid %s -> %s): %d sessions lost their connection", worker_id, previous, pid, len(lost))
            for key in lost:
                self._disconnect(self.by_conn[key], publish_will=True)

    def _on_clients(self, worker: bytes, header: bytes, payload: bytes) -> None:
        answer = orjson.loads(header)
        listing = self.listings.get(answer["id"])
        if listing is not None:
            listing.answer(answer["worker"], answer["clients"])

    def list_clients(self, listing: ClientListing) -> None:
        """Ask every worker for its clients; `listing` completes when all have answered."""
        self.listings[listing.id] = listing
        listing.expect(len(self.worker_pids))
        for worker in self.worker_pids:
            self.out(worker).add_json(wire.LIST_CLIENTS, {"id": listing.id, "filter": listing.filter})

    def disconnect_client(self, request: ClientDisconnect) -> None:
        """An administrator closes a client's connection (the worker tells a 5.0 client 0x98)."""
        session = self.sessions.get(request.client_id)
        if session is not None and session.worker is not None:
            self.out(session.worker).add(wire.CLOSE, wire.CONN.pack(session.conn))
            request.found = True
        request.done.set()

    def _on_stats(self, worker: bytes, header: bytes, payload: bytes) -> None:
        report = orjson.loads(header)
        report["at"] = time.monotonic()
        self.reports[report["id"]] = report

    def _on_connect(self, worker: bytes, header: bytes, payload: bytes) -> None:
        (conn, client_id, clean, _username, will_topic, will_qos, will_retain, resume, fresh, expiry,
         will_extra) = orjson.loads(header)
        # clean: the session ends with the connection; fresh: an earlier session is discarded (3.1.1:
        # both are clean session; 5.0: session expiry 0, and clean start).
        # resume: the connection registers again after a router restart; the number is the first packet id
        # past those its worker still has in flight (0 for a new connection). expiry: seconds the session
        # outlives the connection (5.0; -1: the broker's persistent_client_expiration); will_extra: the
        # 5.0 will's [delay, properties as hex, message expiry interval]
        old = self.sessions.get(client_id)
        if old is not None and old.worker is not None:
            self.out(old.worker).add(wire.KICK, wire.CONN.pack(old.conn))
            self._disconnect(old, publish_will=True)
            old = self.sessions.get(client_id)
        present = old is not None and not fresh
        if old is not None and not present:
            self._discard(old)
        session = old if present else Session(client_id, clean)
        if resume and not present:  # a store that did not keep it: do not reuse ids the client still holds
            session.next_pid = (resume - 1) % 65535 + 1
        session.clean = clean
        session.expiry = expiry
        self.sessions[client_id] = session
        if not clean and self.store is not None:
            self.store.record(db.SESSION_SAVE, (client_id, time.time(), expiry))
        session.worker = worker
        session.conn = conn
        session.will_at = 0.0  # back in time: a delayed will of the last connection is not sent [MQTT-3.1.3-9]
        session.will = None
        if will_topic is not None:
            delay, props, will_expiry = will_extra or (0, "", 0)
            session.will = Will(will_topic.encode(), payload, will_qos, will_retain, bytes.fromhex(props), will_expiry,
                                delay)
        self.by_conn[(worker, conn)] = session
        if session.subs:
            self.cache.clear()
        out = self.out(worker)
        if not resume:  # a resumed connection (after a router restart) has had its CONNACK
            out.hold()
            out.add_json(wire.SESSION, [conn, present])
        if present:
            self._resend(session, out)

    def _resend(self, session: Session, out: wire.Batch) -> None:
        """Send again what a persistent session has not acknowledged, in order, with original ids,
        then what waited for it, as far as its window allows."""
        for pid, pending in session.in_flight():
            if pending.state == RELEASING:
                out.add(wire.RESEND_REL, wire.CONN_PID.pack(session.conn, pid))
            else:
                self._send_pending(session, out, pid, pending, dup=True)
        self._send_ready(session, out)

    def _send_ready(self, session: Session, out: wire.Batch) -> None:
        """Send what waited for room in the session's window; what expired while it waited goes
        (a message whose onward delivery has not started is deleted at its expiry, MQTT 5)."""
        store = self.store if not session.clean else None
        now = time.time()
        while True:
            expired = []
            for pid, pending in session.ready(self.window):
                if pending.expiry and pending.expiry <= now:
                    expired.append(pid)
                    continue
                if store is not None:
                    store.record(db.MESSAGE_STATE, (SENT, session.client_id, pid))
                self._send_pending(session, out, pid, pending, dup=False)
            if not expired:
                return
            for pid in expired:  # each took a place in the window: give it back, then look again
                session.release(pid)
                if store is not None:
                    store.record(db.MESSAGE_DELETE, (session.client_id, pid))

    def _keep(self, session: Session, topic: bytes, payload: bytes, qos: int, retain: bool, props: bytes = b"",
              expiry: int = 0, share: Share | None = None) -> int:
        """Session.keep, stored (persistent sessions): the packet id to send it with now, 0 when it
        waits, -1 when dropped."""
        pid = session.keep(topic, payload, qos, retain, self.pending_limit, self.max_bytes, self.window, props, expiry,
                           share)
        if pid < 0:
            self.dropped += 1
            self._log_drops(session)
        elif self.store is not None and not session.clean:
            self.seq += 1
            stored = next(reversed(session.unacked))  # the packet id it was kept under
            self.store.record(db.MESSAGE_SAVE, (session.client_id, stored, self.seq, topic, payload, qos, retain,
                                                SENT if pid else QUEUED, props, expiry))
        return pid

    @staticmethod
    def _log_drops(session: Session) -> None:
        now = time.monotonic()
        if now - session.dropped_logged >= 60.0:
            session.dropped_logged = now
            log.warning("client %s: queue full, dropping messages (%d so far)", session.client_id, session.dropped)

    @staticmethod
    def _send_pending(session: Session, out: wire.Batch, pid: int, pending: Pending, dup: bool) -> None:
        out.add(wire.DELIVER, _deliver_head(pending.topic, pending.qos, pending.retain, dup, pending.props,
                                            pending.expiry) + _pack_sub(session.conn, pending.qos, pid), pending.payload)

    def _on_gone(self, worker: bytes, header: bytes, payload: bytes) -> None:
        conn, publish_will = wire.GONE_HEAD.unpack(header)
        session = self.by_conn.get((worker, conn))
        if session is not None:
            self._disconnect(session, bool(publish_will))

    def _on_session_expiry(self, worker: bytes, header: bytes, payload: bytes) -> None:
        """A 5.0 client set its session expiry at DISCONNECT (GONE follows): 0 ends its persistent
        session with the connection, another value is how long it outlives it."""
        conn, expiry = wire.SESSION_EXPIRY_HEAD.unpack(header)
        session = self.by_conn.get((worker, conn))
        if session is None or session.clean:
            return
        if expiry:
            session.expiry = expiry
        else:
            self._forget_stored(session)
            session.clean = True

    def _disconnect(self, session: Session, publish_will: bool) -> None:
        """The session's connection ended: publish its will if asked, keep it only if persistent."""
        if session.unacked:
            self._reshare(session)
        del self.by_conn[(session.worker, session.conn)]  # type: ignore[index]
        will = session.will
        session.will = None
        if session.clean:
            self._discard(session)
        else:
            session.worker = None
            session.conn = 0
            session.seen = time.time()
            if self.store is not None:
                self.store.record(db.SESSION_SAVE, (session.client_id, session.seen, session.expiry))
            if session.subs:
                self.cache.clear()
            if session.ends_at():
                self.deadlines.add(session.ends_at(), session)
        if publish_will and will is not None:
            if will.delay and not session.clean:  # MQTT 5: published when the delay or the session ends
                session.will = will
                session.will_at = session.seen + will.delay
                self.deadlines.add(session.will_at, session)
            else:
                self._publish_will(will)

    def _publish_will(self, will: Will) -> None:
        self.publish(will.topic, will.payload, will.qos, will.retain, will.props,
                     int(time.time()) + will.expiry if will.expiry else 0)

    def _discard(self, session: Session) -> None:
        if not session.clean:
            self._forget_stored(session)
        if session.subs:
            self.cache.clear()
        for topic_filter in list(session.subs):
            self._unsubscribe(session, topic_filter)
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]

    def _forget_stored(self, session: Session) -> None:
        if self.store is not None:
            client = (session.client_id,)
            for statement in (db.SESSION_DELETE, db.SUBS_DELETE, db.MESSAGES_DELETE, db.INCOMING_DELETE):
                self.store.record(statement, client)

    # -- subscriptions ---------------------------------------------------------------------------

    def _on_subscribe(self, worker: bytes, header: bytes, payload: bytes) -> None:
        conn, packet_id, filters = orjson.loads(header)
        session = self.by_conn.get((worker, conn))
        if session is None:
            return
        out = self.out(worker)
        now = time.time()
        codes = []
        retained: list[tuple[str, Retained, int, bytes]] = []
        for topic_filter, grant in filters:
            codes.append(grants.suback_code(grant))
            if grants.refused(grant):  # by the worker: the reason code goes back as it is
                continue
            new = self._subscribe(session, topic_filter, grant)
            if not session.clean and self.store is not None:
                self.store.record(db.SUB_SAVE, (session.client_id, topic_filter, grant))
            # retained messages are never sent to a shared subscription [MQTT-3.8.4-3 note]
            if packet_id and grants.sends_retained(grant, new) and topic_filter not in self.groups:
                identifier = grant >> grants.ID_SHIFT
                ids = grants.identifier_property(identifier) if identifier else b""
                for topic, message in self.retained.matching(topic_filter, now):
                    retained.append((topic, message, min(grant & 3, message[1]), ids))
        self.cache.clear()
        if not packet_id:
            return  # subscriptions registered again after a router restart: no SUBACK, no retained
        out.hold()
        out.add_json(wire.SUBACK, [conn, packet_id, codes])
        for topic, (body, _stored_qos, props, expiry), qos, ids in retained:
            self._deliver_one(session, out, topic.encode(), body, qos, True, props + ids, expiry)

    def _on_unsubscribe(self, worker: bytes, header: bytes, payload: bytes) -> None:
        conn, packet_id, filters = orjson.loads(header)
        session = self.by_conn.get((worker, conn))
        if session is None:
            return
        codes = bytearray()
        for topic_filter in filters:
            if self._unsubscribe(session, topic_filter):
                codes.append(0x00)
                if not session.clean and self.store is not None:
                    self.store.record(db.SUB_DELETE, (session.client_id, topic_filter))
            else:
                codes.append(0x11)  # no subscription existed (MQTT 5 tells the client)
        self.cache.clear()
        out = self.out(worker)
        out.hold()
        out.add(wire.UNSUBACK, wire.CONN_PID.pack(conn, packet_id) + codes)

    def _subscribe(self, session: Session, topic_filter: str, grant: int) -> bool:
        """Index one subscription (a shared one joins its group); True when the session did not have it."""
        new = topic_filter not in session.subs
        session.subs[topic_filter] = grant
        share = shared(topic_filter)
        if share is None:
            self.trie.add(topic_filter, session, grants.routing(grant))
            return new
        group = self.groups.get(topic_filter)
        if group is None:
            group = self.groups[topic_filter] = SharedGroup(share[0], share[1], self.share_strategy)
            self.trie.add(group.filter, group, 0)
        group.join(session, grant)
        return new

    def _unsubscribe(self, session: Session, topic_filter: str) -> bool:
        """Remove one subscription of the session (a group left without members goes); whether it had it."""
        if session.subs.pop(topic_filter, None) is None:
            return False
        group = self.groups.get(topic_filter)
        if group is None:
            self.trie.remove(topic_filter, session)
        else:
            group.leave(session)
            if not group.members:
                del self.groups[topic_filter]
                self.trie.remove(group.filter, group)
        return True

    # -- messages --------------------------------------------------------------------------------

    def _on_pub(self, worker: bytes, header: bytes, payload: bytes) -> None:
        conn, packet_id, flags = _unpack_pub(header)
        qos = flags & 3
        if qos:
            self.routed[worker] = self.routed.get(worker, 0) + 1
            if qos == 2:
                session = self.by_conn.get((worker, conn))
                if session is not None:
                    if not session.receive(packet_id):
                        return  # a resend before PUBREL: received exactly once
                    if not session.clean and self.store is not None:
                        self.store.record(db.INCOMING_SAVE, (session.client_id, packet_id))
        if flags & wire.HAS_EXTRA:
            props, expiry, start = wire.read_extra(header, _pub_head_size)
            self.publish(header[start:], payload, qos, bool(flags & 4), props, expiry, (worker, conn))
        else:
            self.publish(header[_pub_head_size:], payload, qos, bool(flags & 4), source=(worker, conn))

    def _on_pub0(self, worker: bytes, header: bytes, packets: bytes, form: int = 0) -> None:
        """A run of plain QoS 0 PUBLISH packets to one topic: matched once, queued as they are for its
        workers; `form` 1: 5.0 packets."""
        topic = header[_count_size:]
        targets = self.cache.get(topic)
        if targets is None:
            targets = self._match(topic)
        count = _unpack_count(header)[0]
        for dest in targets.raw:
            if not dest.count:
                self.raw_dirty.append(dest)
            dest.pending[form].append(packets)
            dest.count += count
        self.received += count
        if targets.special or targets.groups:  # each packet resolved for each of them
            pos = 0
            body_at = 2 + len(topic) + form  # 5.0: after the empty property block
            while pos < len(packets):
                _first, start, stop = framing.frame(packets, pos, 1 << 28)  # type: ignore[misc]
                payload = packets[start + body_at:stop]
                for session, matched in targets.special:
                    self._deliver_special(session, matched, topic, payload, 0, False, b"", 0, None)
                for group in targets.groups:
                    self._share(group, topic, payload, 0, False, b"", 0)
                pos = stop

    def _on_pub0_v5(self, worker: bytes, header: bytes, packets: bytes) -> None:
        """A run of a 5.0 client: kept in its own form, so that 5.0 subscribers get it as it is."""
        self._on_pub0(worker, header, packets, 1)

    def _flush_raw(self) -> None:
        for dest in self.raw_dirty:
            out = self.out(dest.worker)
            for kind, pending in zip((wire.DELIVER_RAW, wire.DELIVER_RAW_V5), dest.pending):
                if pending:
                    out.add(kind, dest.subs, b"".join(pending))
                    pending.clear()
            self.delivered += dest.count * (len(dest.subs) // wire.SUBSCRIBER.size)
            dest.count = 0
        self.raw_dirty.clear()

    def _on_rel(self, worker: bytes, header: bytes, payload: bytes) -> None:
        conn, packet_id = wire.CONN_PID.unpack(header)
        session = self.by_conn.get((worker, conn))
        if session is not None and session.released(packet_id):
            if not session.clean and self.store is not None:
                self.store.record(db.INCOMING_DELETE_ONE, (session.client_id, packet_id))

    def _on_ack(self, worker: bytes, header: bytes, payload: bytes) -> None:
        conn, packet_id, stage = wire.ACK_HEAD.unpack(header)
        session = self.by_conn.get((worker, conn))
        if session is None:
            return
        store = self.store if not session.clean else None
        if stage == wire.ACK_DONE:
            session.release(packet_id)
            if store is not None:
                store.record(db.MESSAGE_DELETE, (session.client_id, packet_id))
            if session.queued:
                self._send_ready(session, self.out(worker))
        elif session.releasing(packet_id) and store is not None:
            store.record(db.MESSAGE_RELEASING, (RELEASING, session.client_id, packet_id))

    def publish(self, topic: bytes, payload: bytes, qos: int, retain: bool, props: bytes = b"", expiry: int = 0,
                source: tuple[bytes, int] | None = None) -> None:
        """A message from a client (or its will): counted, then routed."""
        self.received += 1
        self.route(topic, payload, qos, retain, props, expiry, source)

    def route(self, topic: bytes, payload: bytes, qos: int, retain: bool, props: bytes = b"", expiry: int = 0,
              source: tuple[bytes, int] | None = None) -> None:
        """Route one message to every matching subscriber: matched once, one record per worker.
        `props` and `expiry`: what an MQTT 5 message carries to its subscribers (router/wire.py);
        `source`: the publishing connection (worker, conn), for no local."""
        if retain:
            name = topic.decode()
            self.retained.put(name, payload, qos, props, expiry)
            if self.store is not None and not topic.startswith(b"$SYS/"):  # $SYS is fresh after a restart
                if payload:
                    self.store.record(db.RETAINED_SAVE, (name, payload, qos, props, expiry))
                else:
                    self.store.record(db.RETAINED_DELETE, (name,))
        targets = self.cache.get(topic)
        if targets is None:
            targets = self._match(topic)
        online = targets.online
        offline = targets.offline
        if props or expiry:
            head = _pack_deliver(qos | wire.HAS_EXTRA, len(topic)) + topic + wire.extra(props, expiry)
        else:
            head = _pack_deliver(qos, len(topic)) + topic
        keep = self._keep
        for worker, clean_subs, persistent in online:
            subs = clean_subs
            if persistent:
                parts = [clean_subs]
                for session, granted in persistent:
                    eff = granted if granted < qos else qos
                    if eff:
                        pid = keep(session, topic, payload, eff, False, props, expiry)
                        if pid > 0:
                            parts.append(_pack_sub(session.conn, eff, pid))
                    else:
                        parts.append(_pack_sub(session.conn, 0, 0))
                subs = b"".join(parts)
            if subs:
                out = self.out(worker)
                if qos == 2:  # delivered only once its PUBREC could be sent: the publisher will not send it again
                    out.hold()
                out.add(wire.DELIVER, head + subs, payload)
                self.delivered += len(subs) // 7
        for session, matched in targets.special:
            self._deliver_special(session, matched, topic, payload, qos, retain, props, expiry, source)
        for group in targets.groups:
            self._share(group, topic, payload, qos, retain, props, expiry)
        for session, matched in offline:
            if matched.__class__ is int and matched < 4:  # type: ignore[operator]
                eff = matched if matched < qos else qos  # type: ignore[operator]
                if eff:
                    keep(session, topic, payload, eff, False, props, expiry)
                continue
            resolved = grants.resolve(matched, qos, retain, False)
            if resolved is not None and resolved[0]:
                keep(session, topic, payload, resolved[0], resolved[1], props + resolved[2], expiry)

    def _match(self, topic: bytes) -> Targets:
        by_worker: dict[bytes, tuple[list[bytes], list[tuple[Session, int]], list[bytes]]] = {}
        offline: list[tuple[Session, Matched]] = []
        special: list[tuple[Session, Matched]] = []
        groups: list[SharedGroup] = []
        for session, granted in self.trie.match(topic.decode()).items():
            if session.__class__ is SharedGroup:
                groups.append(session)  # type: ignore[arg-type]
                continue
            worker = session.worker
            if worker is None:
                offline.append((session, granted))
                continue
            if granted.__class__ is not int or granted >= 4:  # type: ignore[operator]
                special.append((session, granted))
                continue
            entry = by_worker.get(worker)
            if entry is None:
                entry = by_worker[worker] = ([], [], [])
            packed = _pack_sub(session.conn, granted, 0)
            entry[2].append(packed)
            if session.clean:
                entry[0].append(packed)
            else:
                entry[1].append((session, granted))
        targets = Targets([Dest(w, b"".join(a)) for w, (_, _, a) in by_worker.items()],
                          [(w, b"".join(c), p) for w, (c, p, _) in by_worker.items()], offline, special, groups)
        if len(self.cache) >= MATCH_CACHE_SIZE:
            self.cache.clear()
        self.cache[topic] = targets
        return targets

    def _deliver_special(self, session: Session, matched: Matched, topic: bytes, payload: bytes, qos: int,
                         retain: bool, props: bytes, expiry: int, source: tuple[bytes, int] | None) -> None:
        """A message to an online subscriber with MQTT 5 subscription options or identifiers: its own
        record, with its QoS, retain flag and identifiers (none when no local leaves it out)."""
        resolved = grants.resolve(matched, qos, retain, source == (session.worker, session.conn))
        if resolved is None:
            return
        out = self.out(session.worker)  # type: ignore[arg-type]
        if qos == 2:  # as in route: only once the publisher's PUBREC could be sent
            out.hold()
        self._deliver_one(session, out, topic, payload, resolved[0], resolved[1], props + resolved[2], expiry)
        self.delivered += 1

    def _share(self, group: SharedGroup, topic: bytes, payload: bytes, qos: int, retain: bool, props: bytes,
               expiry: int, exclude: Session | None = None, online_only: bool = False) -> bool:
        """A message to one member of a shared subscription (`SharedGroup.pick`); its QoS 1/2 copy is
        numbered and kept by the router whatever the member's session, so that it can go to another
        member if this one disconnects before acknowledging it. False when no member could take it."""
        picked = group.pick(exclude, online_only)
        if picked is None:
            return False
        session, grant = picked
        identifier = grant >> grants.ID_SHIFT
        own_props = props + grants.identifier_property(identifier) if identifier else props
        eff = grant & 3 if grant & 3 < qos else qos
        keep_retain = retain and bool(grant & grants.RETAIN_AS_PUBLISHED)
        share: Share = (group, len(props))
        if session.worker is None:  # every member is offline: a persistent one keeps it
            if eff:
                self._keep(session, topic, payload, eff, keep_retain, own_props, expiry, share)
            return True
        out = self.out(session.worker)
        if qos == 2:  # as in route: only once the publisher's PUBREC could be sent
            out.hold()
        pid = 0
        if eff:
            pid = self._keep(session, topic, payload, eff, keep_retain, own_props, expiry, share)
            if pid <= 0:
                return True  # waits for room in the member's window, or dropped (its queue is full)
        out.add(wire.DELIVER, _deliver_head(topic, eff, keep_retain, False, own_props, expiry)
                + _pack_sub(session.conn, eff, pid), payload)
        self.delivered += 1
        return True

    def _reshare(self, session: Session) -> None:
        """The session's connection ended: what shared subscriptions gave it and it has not yet
        acknowledged (PUBREC counts: the client has it) goes to another member, an online one
        unless the session is clean (its copy would be lost); what no member takes stays."""
        store = self.store if not session.clean else None
        moving = [(pid, pending) for pid, pending in session.unacked.items()
                  if pending.share is not None and pending.state != RELEASING]
        for pid, pending in moving:
            group, own = pending.share  # type: ignore[misc]
            if self._share(group, pending.topic, pending.payload, pending.qos, pending.retain, pending.props[:own],
                           pending.expiry, exclude=session, online_only=not session.clean):
                session.release(pid)
                if store is not None:
                    store.record(db.MESSAGE_DELETE, (session.client_id, pid))

    def _deliver_one(self, session: Session, out: wire.Batch, topic: bytes, payload: bytes, qos: int, retain: bool,
                     props: bytes, expiry: int) -> None:
        pid = 0
        if qos and not session.clean:
            pid = self._keep(session, topic, payload, qos, retain, props, expiry)
            if pid <= 0:
                return  # dropped, or queued until the client's window has room
        out.add(wire.DELIVER, _deliver_head(topic, qos, retain, False, props, expiry) + _pack_sub(session.conn, qos, pid),
                payload)

    # -- housekeeping ------------------------------------------------------------------------------

    def expire(self, now: float) -> int:
        """Remove retained messages past their expiry, and persistent sessions without an expiry
        interval of their own (3.1.1, and 5.0's "never") offline longer than `expiration`; how many
        sessions went."""
        for topic in self.retained.expire(now):
            if self.store is not None:
                self.store.record(db.RETAINED_DELETE, (topic,))
        if not self.expiration:
            return 0
        stale = [s for s in self.sessions.values() if s.worker is None and now - s.seen > self.expiration
                 and (s.expiry == DEFAULT_EXPIRY or s.expiry == NEVER)]
        for session in stale:
            self._end(session, now)
        return len(stale)

    def due(self, now: float) -> None:
        """Once a second: publish the delayed wills that are due, and end the sessions whose own
        expiry interval has passed."""
        for session in self.deadlines.due(now):
            if session.worker is not None or self.sessions.get(session.client_id) is not session:
                continue  # back online, or gone: the reminder is stale
            if session.will is not None and session.will_at and session.will_at <= now:
                will, session.will, session.will_at = session.will, None, 0.0
                self._publish_will(will)
            ends = session.ends_at()
            if ends and ends <= now:
                self._end(session, now)

    def _end(self, session: Session, now: float) -> None:
        """An offline session's time is up: its delayed will goes out now, then the session."""
        log.info("client %s: persistent session expired after %.0f s offline", session.client_id, now - session.seen)
        if session.will is not None:
            will, session.will, session.will_at = session.will, None, 0.0
            self._publish_will(will)
        self._discard(session)
