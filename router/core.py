"""The router's state machine: it takes the records of a worker and answers in per-worker batches.

It owns the tenants (router/tenants.py), each with its client-id registry, subscription trie,
retained messages and persistent sessions. It never touches a socket: `main.py` feeds it frames and sends the batches it fills.
This module holds the state, the frames in and out and the message path; the lives of sessions are
in `router/lifecycle.py` and subscriptions in `router/subscribing.py` (parts of `Router`), a session's
outbox (its QoS 1/2 queue, window and resend) in `router/outbox.py`, and every write to the store goes
through `router/store/journal.py`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from plexmq import grants, tenants, wire
from plexmq.grants import Matched
from plexmq.mqtt import framing
from plexmq.router.bans import Banning
from plexmq.router.claims import Claims
from plexmq.router.deadlines import Deadlines
from plexmq.router.lifecycle import Lifecycle
from plexmq.router.links import Links
from plexmq.router.listing import ClientListing
from plexmq.router.message import Message
from plexmq.router.ops.audit import Audit
from plexmq.router.outbox import Outbox, Pending, Share
from plexmq.router.routes import RouteTable
from plexmq.router.sessions import Session
from plexmq.router.shared import SharedGroup
from plexmq.router.store import Store
from plexmq.router.store.journal import Journal
from plexmq.router.subscribing import Subscribing
from plexmq.router.tenants import UNLIMITED, Tenant
from plexmq.router.topic_rates import TopicRates
from plexmq.router.trace import Traces
from plexmq.tenants import DEFAULT

log = logging.getLogger("plexmq.router")

_pack_sub = wire.pack_subscriber
_unpack_pub = wire.unpack_pub
_unpack_run = wire.unpack_pub0
_run_size = wire.PUB0_HEAD.size
_pub_head_size = wire.PUB_HEAD.size


class Dest:
    """A worker's share of one topic's subscribers, collecting raw QoS 0 packets during a turn."""

    __slots__ = ("worker", "subs", "pending", "counts", "tenant")

    def __init__(self, worker: bytes, subs: bytes, tenant: Tenant) -> None:
        self.worker = worker
        self.tenant = tenant  # whose subscribers: its deliveries are counted for it
        self.subs = subs  # every online subscriber on that worker, packed
        self.pending: tuple[list[bytes], list[bytes]] = ([], [])  # runs of packets: 3.1.1 and 5.0 form
        self.counts = [0, 0]  # packets in `pending`: of each form


class Targets:
    """One cached match of a topic."""

    __slots__ = ("raw", "online", "offline", "special", "groups", "matched")

    def __init__(self, raw: list[Dest], online: list[tuple[bytes, bytes, list[tuple[Session, int]]]],
                 offline: list[tuple[Session, Matched]], special: list[tuple[Session, Matched]],
                 groups: list[SharedGroup]) -> None:
        self.raw = raw  # for plain QoS 0 runs
        self.online = online  # per worker: (worker, packed clean subscribers, persistent (session, granted))
        self.offline = offline  # persistent sessions without a connection
        # online subscribers whose subscriptions are not plain (MQTT 5 options or identifiers):
        # each message is resolved for each of them (plexmq/grants.py)
        self.special = special
        self.groups = groups  # shared subscriptions: one member of each is chosen per message
        # whether any subscription matches (offline sessions and shared groups count; one of the
        # publisher's own with no local too): else a 5.0 publisher hears 0x10
        self.matched = bool(online or offline or special or groups)


MATCH_CACHE_SIZE = 100_000
CONFIRM_INTERVAL = 0.05  # seconds a worker may wait to hear that its QoS 0 records were routed


class Router(Lifecycle, Subscribing):
    """Routing and session logic; `out(worker)` gives the batch bound for that worker this turn."""
    def __init__(self, max_inflight: int, max_queued: int, max_queued_bytes: int = 0, store: Store | None = None,
                 expiration: float = 0.0, share_strategy: str = "round_robin", link_timeout: float = 5.0) -> None:
        self.default = Tenant(DEFAULT)  # the broker's $SYS is published here
        self.tenants: dict[str, Tenant] = {DEFAULT: self.default}  # the others: made when first named
        # the declared tenants' limits, taken by each `Tenant` when it is made: a tenant declared and
        # never used costs the router nothing more than this entry (thousands may be declared)
        self.declared: dict[str, tenants.Tenant] = {}
        self.dropped: set[str] = set()  # tenants a reload dropped (on_remove = "drop") and none has declared again
        # (worker, conn_id) -> the tenant of each live connection, from its CONNECT on (before any
        # takeover wait: a client may send PUBLISH right after CONNECT) until it ends
        self.conn_tenants: dict[tuple[bytes, int], Tenant] = {}
        self.deadlines = Deadlines()  # delayed wills and sessions with their own expiry interval
        self.share_strategy = share_strategy
        self.by_conn_id: dict[tuple[bytes, int], Session] = {}
        self.batches: dict[bytes, wire.ToWorker] = {}
        # worker -> [its QoS 1/2 PUBs, its PUB and PUB0 records, then the positions among those PUBs
        # of the ones that asked whether they matched and did not] not yet confirmed (ROUTED)
        self.routed: dict[bytes, list[int]] = {}
        self.confirmed_at: dict[bytes, float] = {}  # worker -> time.monotonic() of its last ROUTED
        self.routes = RouteTable()
        self.links = Links(link_timeout)
        self.raw_dirty: list[Dest] = []
        self.journal = Journal(store)
        self.outbox = Outbox(self.journal, max_inflight, max_queued, max_queued_bytes)
        self.expiration = expiration  # seconds an offline persistent session is kept (0: forever)
        self.reports: dict[str, dict] = {}  # worker label -> its last STATS (with "at": when it came)
        self.topic_rates = TopicRates(time.monotonic())  # the workers' sampled topics (the console's busiest)
        self.listings: dict[int, ClientListing] = {}  # `plexmq clients` requests waiting for workers
        self.traces = Traces()  # the console's live traces (router/trace.py)
        self.bans = Banning(self.journal)  # the banned clients, which every worker checks (router/bans.py)
        self.audit = Audit()  # the admins' actions (router/ops/audit.py)
        self.sys_figures = None  # a tenant's $SYS figures for its new subscribers (router/main.py: `Stats.figures`)
        # (old worker, conn_id) -> the CONNECT (worker, header, payload) that takes its session over from
        # another worker, waiting for that connection's last records (Lifecycle._take_over)
        self.takeovers: dict[tuple[bytes, int], tuple[bytes, int, bytes, bytes]] = {}
        self.claims = Claims()  # CONNECTs that resume a session, waiting for the host's other workers
        self.stopping = False  # the broker stops: its own workers' BYEs end no session (no wills)
        self.directory: dict[str, str] = {}  # the workers' direct endpoints, as last told (DIRECTORY)
        self.received = 0
        self.delivered = 0
        self.unknown = 0  # messages of connections the router does not know (no CONNECT, or ended): dropped
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
            wire.KICKED: self._on_kicked,
            wire.SESSION_EXPIRY: self._on_session_expiry,
            wire.STATS: self._on_stats,
            wire.CLIENTS: self._on_clients,
            wire.ROUTES_ACK: self._on_routes_ack,
            wire.BYE: self._on_bye,
            wire.TRACES_ACK: self.traces.on_ack,
            wire.TRACED: self.traces.on_traced,
            wire.BANS_ACK: self.bans.on_ack,
            wire.SYNCED: self._on_synced,
        }
        if store is not None:
            self._restore(store)

    def tenant(self, name: str) -> Tenant:
        """The tenant of that name, made (with its declared limits) when first named."""
        tenant = self.tenants.get(name)
        if tenant is None:
            tenant = self.tenants[name] = Tenant(name)
            limits = self.declared.get(name)
            if limits is not None:
                self._limit(tenant, limits)
        return tenant

    def apply_limits(self, name: str, limits: tenants.Tenant) -> None:
        """A declared tenant's limits (router/tenants.py), at start and at a reload; an undeclared
        one's are `UNLIMITED`. A tenant not made yet takes them when it is (`tenant`)."""
        if limits is UNLIMITED:
            self.declared.pop(name, None)
        else:
            self.declared[name] = limits
            self.dropped.discard(name)
        tenant = self.tenants.get(name)
        if tenant is not None:
            self._limit(tenant, limits)

    def _limit(self, tenant: Tenant, limits: tenants.Tenant) -> None:
        """A made tenant takes its limits, its sessions' queue cap with them."""
        name = tenant.name
        tenant.apply(limits)
        if limits.max_queued_messages:
            self.outbox.capped[name] = tenant
        else:
            self.outbox.capped.pop(name, None)

    def _restore(self, store: Store) -> None:
        """Start from what the store kept, per tenant: offline persistent sessions, their subscriptions
        and delayed wills, retained messages; on a shared store the connections with wills that the
        last active router held (`_carry`)."""
        loaded = store.load()
        for name, sessions in loaded.sessions.items():
            tenant = self.tenant(name)
            tenant.sessions = sessions
            for session in sessions.values():
                stored, session.subs = session.subs, {}
                for topic_filter, grant in stored.items():
                    self._subscribe(session, topic_filter, grant)
                if ends := session.ends_at():
                    self.deadlines.add(ends, session)
                if session.will_at:
                    self.deadlines.add(session.will_at, session)
        for carried in loaded.carried:
            self._carry(carried)
        for name, retained in loaded.retained.items():
            self.tenant(name).retained.load(retained)
        self.journal.seq = loaded.next_seq
        self.bans.restore(loaded.bans)
        self.audit.loaded(loaded.audit)
        kept = [s for by_id in loaded.sessions.values() for s in by_id.values()]
        log.info("store %s: %d persistent sessions, %d queued or unacknowledged messages, %d retained, "
                 "%d wills of live connections, %d bans", store.name, len(kept), sum(len(s.unacked) for s in kept),
                 sum(len(r) for r in loaded.retained.values()), len(loaded.carried), len(loaded.bans))

    # -- frames in, batches out ---------------------------------------------------------------

    def out(self, worker: bytes) -> wire.ToWorker:
        batch = self.batches.get(worker)
        if batch is None:
            batch = self.batches[worker] = wire.ToWorker()
        return batch

    def handle_frame(self, worker: bytes, frame: bytes) -> None:
        handlers = self._handlers
        try:
            for kind, header, payload in wire.records(frame):
                if kind != wire.PUB0 and kind != wire.PUB0_V5 and self.raw_dirty:
                    self._flush_raw()  # keep every worker's records in the order they were caused
                handlers[kind](worker, header, payload)
        except wire.ProtocolMismatch:
            pass  # refused (Lifecycle._on_hello): what follows its HELLO is not read

    def take_frames(self, split: bool) -> list[tuple[bytes, bytes, bytes]]:
        """This turn's frames, (worker, at_once, later), led by the route table's changes (ROUTES), with
        acknowledgements of routed PUBs last. With `split`, `later` holds what may leave only after
        the store's commit: acknowledgements (SESSION, SUBACK, UNSUBACK, ROUTED) and QoS 2
        deliveries, with whatever follows them; the rest leaves at once, so a persistent
        subscriber's window does not wait for the disk. A SUBACK that gave a filter a new place
        waits, with what follows it, for the other workers (router/routes.py)."""
        if self.raw_dirty:
            self._flush_raw()
        self.claims.turn_ended()
        now = time.monotonic()
        for worker, counts in list(self.routed.items()):
            out = self.out(worker)
            # records alone (QoS 0) only reopen the worker's local path: they ride on a frame that
            # goes anyway, or wait up to CONFIRM_INTERVAL, so that a worker whose messages all go
            # elsewhere is not woken for them every turn
            if counts[0] or out or now - self.confirmed_at.get(worker, 0.0) >= CONFIRM_INTERVAL:
                out.hold()
                out.routed(counts)
                self.confirmed_at[worker] = now
                del self.routed[worker]
        routes = self.routes
        leads = routes.leads(self.links.alive())
        batches = self.batches
        frames = []
        for worker in batches.keys() | leads.keys() | routes.deferred.keys():
            batch = batches.get(worker)
            at_once, later, gated = batch.take_split() if batch else (b"", b"", False)
            if not split and not gated:
                at_once, later = at_once + later, b""
            at_once, later = routes.order(worker, at_once, later, gated)
            lead = leads.get(worker)
            if lead is not None:
                at_once = lead + at_once  # ahead of what waits: another worker may be waiting for its answer
            if at_once or later:
                frames.append((worker, at_once, later))
        return frames

    # -- messages --------------------------------------------------------------------------------

    def _on_pub(self, worker: bytes, header: bytes, payload: bytes) -> None:
        conn_id, packet_id, flags = _unpack_pub(header)
        qos = flags & 3
        counts = self._routed_counts(worker)
        if qos:
            counts[0] += 1
        tenant = self.conn_tenants.get((worker, conn_id))
        if tenant is None:  # never into the default tenant: its tenant is not known
            self.unknown += 1
            return
        if flags & 4 and flags & wire.MATCH_ASKED and tenant.limits_retained:
            # a publisher that can be told (5.0, QoS 1/2) hears 0x97 and its message is not routed
            # either; any other's is routed and only not kept (`route`)
            props, _expires_at, start = wire.read_extra(header, _pub_head_size) if flags & wire.HAS_EXTRA else \
                (b"", 0, _pub_head_size)
            limit = tenant.retained_limit(header[start:], payload, props)
            if limit is not None:
                tenant.hit(limit)
                counts.append((counts[0] - 1) | wire.REFUSED_AT)
                return
        if qos == 2:
            session = self.by_conn_id.get((worker, conn_id))
            if session is not None:
                if not session.receive(packet_id):
                    return  # a resend before PUBREL: received exactly once
                self.journal.incoming_added(session, packet_id)
        if flags & wire.HAS_EXTRA:
            props, expires_at, start = wire.read_extra(header, _pub_head_size)
            targets = self.publish(tenant, header[start:], payload, qos, bool(flags & 4), props, expires_at,
                                   (worker, conn_id))
        else:
            targets = self.publish(tenant, header[_pub_head_size:], payload, qos, bool(flags & 4),
                                   source=(worker, conn_id))
        if flags & wire.MATCH_ASKED and not targets.matched:
            counts.append(counts[0] - 1)  # its position among the QoS 1/2 PUBs of the next ROUTED

    def _on_pub0(self, worker: bytes, header: bytes, packets: bytes, form: int = 0) -> None:
        """A run of plain QoS 0 PUBLISH packets to one topic: matched once, queued as they are for its
        workers; `form` 1: 5.0 packets."""
        self._routed_counts(worker)
        count, conn_id = _unpack_run(header)
        tenant = self.conn_tenants.get((worker, conn_id))
        if tenant is None:  # never into the default tenant: its tenant is not known
            self.unknown += count
            return
        topic = header[_run_size:]
        targets = tenant.cache.get(topic)
        if targets is None:
            targets = self._match(tenant, topic)
        for dest in targets.raw:
            counts = dest.counts
            if not (counts[0] or counts[1]):
                self.raw_dirty.append(dest)
            dest.pending[form].append(packets)
            counts[form] += count
        self.received += count
        tenant.received += count
        if targets.special or targets.groups:  # each packet resolved for each of them
            for payload in framing.run_payloads(packets, len(topic), bool(form)):
                for session, matched in targets.special:
                    self._deliver_special(session, matched, topic, payload, 0, False, b"", 0, (worker, conn_id))
                for group in targets.groups:
                    self._share(group, topic, payload, 0, False, b"", 0)

    def _on_pub0_v5(self, worker: bytes, header: bytes, packets: bytes) -> None:
        """A run of a 5.0 client: kept in its own form, so that 5.0 subscribers get it as it is."""
        self._on_pub0(worker, header, packets, 1)

    def _flush_raw(self) -> None:
        for dest in self.raw_dirty:
            out = self.out(dest.worker)
            counts = dest.counts
            for form, pending in enumerate(dest.pending):
                if pending:
                    out.deliver_raw(dest.subs, b"".join(pending), form, counts[form])
                    pending.clear()
            copies = (counts[0] + counts[1]) * (len(dest.subs) // wire.SUBSCRIBER.size)
            self.delivered += copies
            dest.tenant.delivered += copies
            counts[0] = counts[1] = 0
        self.raw_dirty.clear()

    def _routed_counts(self, worker: bytes) -> list[int]:
        """The worker's counts for its next ROUTED, with one more PUB or PUB0 record."""
        counts = self.routed.get(worker)
        if counts is None:
            counts = self.routed[worker] = [0, 0]
        counts[1] += 1
        return counts

    def _on_routes_ack(self, worker: bytes, header: bytes, payload: bytes) -> None:
        self.routes.acknowledged(worker, wire.RoutesAck.decode(header).gen)

    def _on_rel(self, worker: bytes, header: bytes, payload: bytes) -> None:
        conn_id, packet_id = wire.Rel.decode(header)
        session = self.by_conn_id.get((worker, conn_id))
        if session is not None and session.released(packet_id):
            self.journal.incoming_released(session, packet_id)

    def _on_ack(self, worker: bytes, header: bytes, payload: bytes) -> None:
        conn_id, packet_id, stage = wire.unpack_ack(header)
        session = self.by_conn_id.get((worker, conn_id))
        if session is None:
            return
        outbox = self.outbox
        if stage == wire.ACK_DONE:
            outbox.done(session, packet_id)
            if session.queued:  # the window has room for what waited
                outbox.send_ready(session, self.out(worker))
        else:
            outbox.received(session, packet_id)

    def publish(self, tenant: Tenant, topic: bytes, payload: bytes, qos: int, retain: bool, props: bytes = b"",
                expires_at: int = 0, source: tuple[bytes, int] | None = None) -> Targets:
        """A message from a client (or its will): counted, kept if retained (within the tenant's limits),
        then routed; its subscribers."""
        self.received += 1
        tenant.received += 1
        if retain:
            limit = tenant.retained_limit(topic, payload, props) if tenant.limits_retained else None
            if limit is None:
                self.retain(tenant, topic.decode(), Message(topic, payload, qos, True, props, expires_at))
            else:  # routed live, not kept
                tenant.hit(limit)
        return self.route(tenant, topic, payload, qos, retain, props, expires_at, source)

    def route(self, tenant: Tenant, topic: bytes, payload: bytes, qos: int, retain: bool, props: bytes = b"",
              expires_at: int = 0, source: tuple[bytes, int] | None = None) -> Targets:
        """Route one message to every matching subscriber of `tenant` (returned): matched once, one record per worker.
        The fields of a `Message`, in its order, not one: most messages are only passed on.
        `retain`: its flag as published (`publish` keeps a client's; the broker's `$SYS` is never kept);
        `props` and `expires_at`: what an MQTT 5 message carries to its subscribers (plexmq/wire.py);
        `source`: the publishing connection (worker, conn_id), for no local."""
        targets = tenant.cache.get(topic)
        if targets is None:
            targets = self._match(tenant, topic)
        online = targets.online
        offline = targets.offline
        head = wire.deliver_head(topic, qos, False, False, props, expires_at)
        keep = self.outbox.keep
        for worker, clean_subs, persistent in online:
            subs = clean_subs
            if persistent:
                parts = [clean_subs]
                for session, granted in persistent:
                    eff = granted if granted < qos else qos
                    if eff:
                        pid = keep(session, Pending(topic, payload, eff, False, props, expires_at))
                        if pid > 0:
                            parts.append(_pack_sub(session.conn_id, eff, pid))
                    else:
                        parts.append(_pack_sub(session.conn_id, 0, 0))
                subs = b"".join(parts)
            if subs:
                out = self.out(worker)
                if qos == 2:  # delivered only once its PUBREC could be sent: the publisher will not send it again
                    out.hold()
                out.deliver(head, subs, payload)
                copies = len(subs) // 7
                self.delivered += copies
                tenant.delivered += copies
        for session, matched in targets.special:
            self._deliver_special(session, matched, topic, payload, qos, retain, props, expires_at, source)
        for group in targets.groups:
            self._share(group, topic, payload, qos, retain, props, expires_at)
        for session, matched in offline:
            if matched.__class__ is int and matched < 4:
                eff = matched if matched < qos else qos
                if eff:
                    keep(session, Pending(topic, payload, eff, False, props, expires_at))
                continue
            resolved = grants.resolve(matched, qos, retain, False)
            if resolved is not None and resolved[0]:
                keep(session, Pending(topic, payload, resolved[0], resolved[1], props + resolved[2], expires_at))
        return targets

    def retain(self, tenant: Tenant, topic: str, message: Message) -> None:
        """The topic's retained message replaced, or cleared by an empty payload (MQTT-3.3.1-10), in
        memory and in the store: for a retained PUBLISH (`route`) and for the console's delete
        (router/console/retained.py), which delivers nothing."""
        tenant.retained.put(topic, message)
        self.journal.retained_set(tenant.name, topic, message)

    def _match(self, tenant: Tenant, topic: bytes) -> Targets:
        by_worker: dict[bytes, tuple[list[bytes], list[tuple[Session, int]], list[bytes]]] = {}
        offline: list[tuple[Session, Matched]] = []
        special: list[tuple[Session, Matched]] = []
        groups: list[SharedGroup] = []
        # the trie's keys: Sessions and SharedGroups (told apart by their class below)
        matches: dict[Session, Matched] = tenant.trie.match(topic.decode())  # type: ignore[assignment]  # Hashable keys, as above
        for session, granted in matches.items():
            if session.__class__ is SharedGroup:
                groups.append(session)
                continue
            worker = session.worker
            if worker is None:
                offline.append((session, granted))
                continue
            if granted.__class__ is not int or granted >= 4:
                special.append((session, granted))
                continue
            entry = by_worker.get(worker)
            if entry is None:
                entry = by_worker[worker] = ([], [], [])
            packed = _pack_sub(session.conn_id, granted, 0)
            entry[2].append(packed)
            if session.persistent:
                entry[1].append((session, granted))
            else:
                entry[0].append(packed)
        targets = Targets([Dest(w, b"".join(a), tenant) for w, (_, _, a) in by_worker.items()],
                          [(w, b"".join(c), p) for w, (c, p, _) in by_worker.items()], offline, special, groups)
        cache = tenant.cache
        if len(cache) >= MATCH_CACHE_SIZE:
            cache.clear()
        cache[topic] = targets
        return targets

    def _deliver_special(self, session: Session, matched: Matched, topic: bytes, payload: bytes, qos: int,
                         retain: bool, props: bytes, expires_at: int, source: tuple[bytes, int] | None) -> None:
        """A message to an online subscriber with MQTT 5 subscription options or identifiers: its own
        record, with its QoS, retain flag and identifiers (none when no local leaves it out)."""
        resolved = grants.resolve(matched, qos, retain, source == (session.worker, session.conn_id))
        if resolved is None:
            return
        out = self.out(session.worker)  # type: ignore[arg-type]  # an online session: its worker is set
        if qos == 2:  # as in route: only once the publisher's PUBREC could be sent
            out.hold()
        self._deliver_one(session, out, topic, payload, resolved[0], resolved[1], props + resolved[2], expires_at)
        self.delivered += 1
        self.tenants[session.tenant].delivered += 1

    def _share(self, group: SharedGroup, topic: bytes, payload: bytes, qos: int, retain: bool, props: bytes,
               expires_at: int, exclude: Session | None = None, online_only: bool = False) -> bool:
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
                self.outbox.keep(session, Pending(topic, payload, eff, keep_retain, own_props, expires_at, share))
            return True
        out = self.out(session.worker)
        if qos == 2:  # as in route: only once the publisher's PUBREC could be sent
            out.hold()
        if self._deliver_one(session, out, topic, payload, eff, keep_retain, own_props, expires_at, share):
            self.delivered += 1
            self.tenants[session.tenant].delivered += 1
        return True

    def _deliver_one(self, session: Session, out: wire.ToWorker, topic: bytes, payload: bytes, qos: int, retain: bool,
                     props: bytes, expires_at: int, share: Share | None = None) -> bool:
        """One message to one online session in a record of its own; a QoS 1/2 copy is kept and
        numbered by the router for a persistent session, and for any session when a shared
        subscription gave it (`share`). Whether it was written now (not queued, not dropped)."""
        pid = 0
        if qos and (session.persistent or share is not None):
            pid = self.outbox.keep(session, Pending(topic, payload, qos, retain, props, expires_at, share))
            if pid <= 0:
                return False  # dropped, or queued until the client's window has room
        out.deliver(wire.deliver_head(topic, qos, retain, False, props, expires_at), _pack_sub(session.conn_id, qos, pid),
                    payload)
        return True
