"""The lives of sessions in the router: a connection claims a client id (taking it over from another
connection), ends (its will, now or after its delay), and an offline persistent session ends when its
expiry interval has passed; also what the workers report and what an operator asks about clients.
All of it within the connection's tenant (router/tenants.py): a client id names a session only there.

A part of `Router` (router/core.py), which holds the state named below; it never touches a socket.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

from plexmq import wire
from plexmq.router.bans import Banning
from plexmq.router.claims import Claims, Waiting
from plexmq.router.deadlines import Deadlines
from plexmq.router.links import Links
from plexmq.router.listing import ClientDisconnect, ClientListing
from plexmq.router.outbox import Outbox
from plexmq.router.routes import RouteTable
from plexmq.router.sessions import Session, Will
from plexmq.router.store.journal import Journal
from plexmq.router.tenants import Tenant
from plexmq.router.topic_rates import TopicRates
from plexmq.router.trace import Traces

if TYPE_CHECKING:
    from plexmq.router.console.sessions import SessionRemoval
    from plexmq.router.core import Targets
    from plexmq.router.shared import SharedGroup
    from plexmq.router.store import Carried

log = logging.getLogger("plexmq.router")


class Lifecycle:
    """Connections, takeover, disconnects, wills and session expiry."""

    tenants: dict[str, Tenant]
    dropped: set[str]
    conn_tenants: dict[tuple[bytes, int], Tenant]
    by_conn_id: dict[tuple[bytes, int], Session]
    deadlines: Deadlines
    journal: Journal
    outbox: Outbox
    expiration: float
    reports: dict[str, dict]
    topic_rates: TopicRates
    listings: dict[int, ClientListing]
    routes: RouteTable
    traces: Traces
    bans: Banning
    routed: dict[bytes, list[int]]
    batches: dict[bytes, wire.ToWorker]
    links: Links
    takeovers: dict[tuple[bytes, int], tuple[bytes, int, bytes, bytes]]
    claims: Claims
    stopping: bool
    directory: dict[str, str]

    if TYPE_CHECKING:  # Router's (router/core.py) and Subscribing's (router/subscribing.py)
        def out(self, worker: bytes) -> wire.ToWorker: ...

        def tenant(self, name: str) -> Tenant: ...

        def publish(self, tenant: Tenant, topic: bytes, payload: bytes, qos: int, retain: bool, props: bytes = b"",
                    expires_at: int = 0, source: tuple[bytes, int] | None = None) -> Targets: ...

        def _share(self, group: SharedGroup, topic: bytes, payload: bytes, qos: int, retain: bool, props: bytes,
                   expires_at: int, exclude: Session | None = None, online_only: bool = False) -> bool: ...

        def _unsubscribe(self, session: Session, topic_filter: str) -> bool: ...

    def _on_hello(self, worker: bytes, header: bytes, payload: bytes) -> None:
        """A worker opens a join (new, restarted, or after its link lost frames): its sessions that
        are not live any more end with their wills; the live ones end quietly here and are registered
        again by the records that follow (the same path as after a router restart)."""
        hello = wire.Hello.decode(header)
        link = self.links.links[worker]
        if hello.protocol != wire.PROTOCOL:
            self._refuse_link(worker, hello)
        if link.pid and link.pid != hello.pid:
            log.warning("worker %s restarted (pid %s -> %s)", worker.decode(), link.pid, hello.pid)
        if hello.node and (link.node, link.pid) != (hello.node, hello.pid) and not any(
                other.join and other.node == hello.node for w, other in self.links.links.items() if w != worker):
            log.info("node %s joined from %s", hello.node, hello.address)  # its first worker (not one rejoining)
        link.worker_id, link.node, link.address, link.pid = hello.worker, hello.node, hello.address, hello.pid
        link.direct = hello.direct
        self.routes.hello(worker)
        self.traces.hello(worker, self.out)
        self.bans.hello(worker, self.out)
        self.routed.pop(worker, None)  # the counts of the last join: the worker sends again what they confirmed
        live = set(hello.live)
        sessions = self._sessions_on(worker)
        ended = [session for session in sessions if session.conn_id not in live]
        if ended:
            log.warning("worker %s joined again without %d connections: their wills follow", worker.decode(), len(ended))
        self._forget_takeovers(worker, lambda conn_id: conn_id not in live)
        self._forget_tenants(worker, lambda conn_id: conn_id not in live)
        for session in sessions:
            self._disconnect(session, publish_will=session.conn_id not in live)
        self._tell_directory(worker)

    def _tell_directory(self, joined: bytes | None = None) -> None:
        """Every joined worker learns the direct endpoints of the others (DIRECTORY) when they change;
        one that joins (`joined`) learns them at once: nodes' workers send each other QoS 0 messages
        themselves where both have one (workers/peers.py)."""
        now = self.links.directory()
        if now != self.directory:
            self.directory = now
            for worker in self.links.joined():
                self.out(worker).directory(now)
        elif joined is not None and now:
            self.out(joined).directory(now)

    def _refuse_link(self, worker: bytes, hello: wire.Hello) -> NoReturn:
        """A worker (a node's, on another host) that speaks another protocol version: none of its
        records is read, it is told this router's version (REFUSED: it stops), and whatever an earlier
        join of its left here ends as if it had died (one log line, with both versions)."""
        link = self.links.links[worker]
        link.worker_id, link.node = hello.worker, hello.node
        self.links.drop(worker)
        self.worker_lost(worker, f"speaks link protocol {hello.protocol}, this router {wire.PROTOCOL} (run the same "
                                 "plexmq version on both), refused")
        self.out(worker).refused()
        raise wire.ProtocolMismatch

    def _sessions_on(self, worker: bytes) -> list[Session]:
        return [session for (w, _conn_id), session in self.by_conn_id.items() if w == worker]

    def _forget_tenants(self, worker: bytes, gone: Callable[[int], bool]) -> None:
        """Connections of `worker` that are `gone`: their records are not routed any more."""
        for key in [key for key in self.conn_tenants if key[0] == worker and gone(key[1])]:
            self._connection_ended(key)

    def _carry(self, carried: Carried) -> None:
        """A connection with a will that the last active router held (a shared store, router/store/__init__.py):
        connected again on its worker, as its CONNECT made it, and that worker alive but not joined.
        If the worker joins, its HELLO ends the connections it no longer holds with their wills and
        the live ones quietly (their CONNECT registers them again, with the will); if it does not,
        it is taken for dead after link_timeout (`worker_lost`) and the wills go out. Once each: a
        will's row goes in the commit of the turn that publishes it (`_disconnect`)."""
        tenant = self.tenant(carried.tenant)
        session = tenant.sessions.get(carried.client_id)
        if session is None:  # a clean session: never stored otherwise
            session = tenant.sessions[carried.client_id] = Session(carried.client_id, False, tenant.name)
        session.worker, session.conn_id, session.will = carried.worker, carried.conn_id, carried.will
        key = (carried.worker, carried.conn_id)
        self.by_conn_id[key] = session
        self.conn_tenants[key] = tenant
        tenant.connections += 1
        if session.subs:
            tenant.cache.clear()
        self.links.expect(carried.worker)

    def _connection_ended(self, key: tuple[bytes, int]) -> None:
        """A connection the router knew ends: its tenant has one live connection less."""
        tenant = self.conn_tenants.pop(key, None)
        if tenant is not None:
            tenant.connections -= 1

    def link_broken(self, worker: bytes) -> None:
        """Frames of `worker` went missing: until it joins again (or is taken for dead) nobody waits
        for its ROUTES_ACK, TRACES_ACK, BANS_ACK or SYNCED, and the counts of its old join are void."""
        self.routes.forget(worker)
        self.traces.forget(worker)
        self.bans.forget(worker)
        self.routed.pop(worker, None)
        self._go_on(self.claims.gone(worker))

    def _on_synced(self, worker: bytes, header: bytes, payload: bytes) -> None:
        self._go_on(self.claims.synced(worker, wire.Sync.decode(header).number))

    def _go_on(self, ready: list[Waiting]) -> None:
        """CONNECTs that waited for the other workers' SYNCED (router/claims.py) are taken now."""
        for waiting in ready:
            self._on_connect(waiting.key[0], waiting.header, waiting.payload)

    def _on_bye(self, worker: bytes, header: bytes, payload: bytes) -> None:
        """A worker stops: a node's, while the router lives on, takes its clients with it (wills
        out); one of this host's, while the whole broker stops, leaves its sessions as they are."""
        local = not self.links.links[worker].node
        self.links.drop(worker)
        self._go_on(self.claims.gone(worker))
        if not (self.stopping and local):
            self.worker_lost(worker, "stopped")

    def worker_lost(self, worker: bytes, why: str = "") -> None:
        """A worker silent past the link timeout (a dead node, a cut link), or a node's worker that
        said it stops: its clients are gone as far as the router knows: wills out, persistent sessions
        kept. If it comes back it is told to join again (router/links.py) and registers the
        connections it still holds."""
        sessions = self._sessions_on(worker)
        log.warning("worker %s %s: taken for dead, %d sessions disconnected", worker.decode(),
                    why or f"silent past link_timeout ({self.links.timeout:g} s)", len(sessions))
        self._forget_takeovers(worker, lambda conn_id: True)
        self._forget_tenants(worker, lambda conn_id: True)
        for session in sessions:
            self._disconnect(session, publish_will=True)
        link = self.links.links[worker]
        label = wire.label(link.node, link.worker_id)
        self.reports.pop(label, None)  # it holds no clients as far as anyone knows
        for listing in self.listings.values():  # `plexmq clients` need not wait for its answer
            listing.answer(label, [], 0)
        self.batches.pop(worker, None)
        self.link_broken(worker)
        self._tell_directory()

    def _on_clients(self, worker: bytes, header: bytes, payload: bytes) -> None:
        answer = wire.Clients.decode(header)
        listing = self.listings.get(answer.id)
        if listing is not None:
            listing.answer(answer.worker, answer.clients, answer.matched)

    def list_clients(self, listing: ClientListing) -> None:
        """Ask every worker for its clients; `listing` completes when all have answered."""
        self.listings[listing.id] = listing
        workers = self.links.alive()
        listing.expect(len(workers))
        for worker in workers:
            self.out(worker).list_clients(listing.asked)

    def disconnect_client(self, request: ClientDisconnect) -> None:
        """An administrator closes a client's connection (the worker tells a 5.0 client 0x98)."""
        tenant = self.tenants.get(request.tenant)
        session = tenant.sessions.get(request.client_id) if tenant is not None else None
        if session is not None and session.worker is not None:
            self.out(session.worker).close(session.conn_id)
            request.found = True
        request.done.set()

    def _on_stats(self, worker: bytes, header: bytes, payload: bytes) -> None:
        report: dict = wire.Stats.decode(header)._asdict()
        report["at"] = time.monotonic()
        self.topic_rates.add(report.pop("topics"), report["at"])
        self.traces.skipped(report.pop("traced"))
        self.reports[report["id"]] = report

    def _on_connect(self, worker: bytes, header: bytes, payload: bytes) -> None:
        (conn_id, client_id, persistent, _username, will_topic, will_qos, will_retain, connack_sent, fresh, expiry,
         will_extra, tenant_name, window, claimed) = wire.Connect.decode(header)  # the fields are said there
        if tenant_name in self.dropped:  # its worker has not applied the reload yet: nothing of it is made again
            self.out(worker).close(conn_id)
            return
        tenant = self.tenant(tenant_name)
        sessions = tenant.sessions
        old = sessions.get(client_id)
        if old is not None and old.worker is None:  # what fell due and was not yet seen to [MQTT-4.1.0-2]
            self._settle(old, time.time())
            old = sessions.get(client_id)
        key = (worker, conn_id)
        if key not in self.conn_tenants:  # else a takeover that waited, going on (judged when it came)
            if not connack_sent and tenant.limits_connects:
                limit = self._connect_limit(tenant, old, persistent)
                if limit is not None:  # refused: the router forgets the connection (no session, no will)
                    tenant.hit(limit)
                    self.out(worker).session(conn_id, False, [], limit)
                    return
            self.conn_tenants[key] = tenant
            tenant.connections += 1
            if not connack_sent and not fresh and self._hold_claim(worker, conn_id, header, payload):
                return
        if old is not None and old.worker is not None and self._claimed_before(old, worker, claimed):
            # its claim came before the live connection's (or one's waiting to take it over) on the same host: that
            # one took it over already, this record only arrived late (a clean session's comes after its CONNACK)
            self.out(worker).kick(conn_id)
            return
        if connack_sent and not fresh and old is not None and old.worker is not None and old.worker != worker:
            # a connection registered again (its worker joined again) whose session another connection
            # has claimed meanwhile (after its worker was taken for dead): the newer one keeps it
            self.out(worker).kick(conn_id)
            return
        if old is not None and old.worker is not None:
            self.out(old.worker).kick(old.conn_id)
            self._refuse_waiting((old.worker, old.conn_id))
            if old.worker != worker and not fresh:
                return self._take_over(old, worker, conn_id, header, payload)
            self._disconnect(old, publish_will=True)
            old = sessions.get(client_id)
        present = old is not None and not fresh
        if old is not None and not present:
            self._discard(old)
        session = old if present and old is not None else Session(client_id, persistent, tenant.name)
        if connack_sent and not present:  # a store that did not keep it: do not reuse ids the client still holds
            session.next_pid = (connack_sent - 1) % 65535 + 1  # the first id past the worker's in flight
        if present and not persistent and session.persistent:  # resumed with session expiry 0: it ends with this connection
            self.journal.session_dropped(session)
        session.persistent = persistent
        session.expiry = expiry
        session.window = window
        sessions[client_id] = session
        self.journal.session_saved(session, time.time())
        session.worker = worker
        session.conn_id = conn_id
        session.claimed = claimed
        self._take_will(session)  # back in time: a delayed will of the last connection is not sent [MQTT-3.1.3-9]
        if will_topic is not None:
            delay, props, will_expiry = will_extra or (0, "", 0)
            session.will = Will(will_topic.encode(), payload, will_qos, will_retain, bytes.fromhex(props), will_expiry,
                                delay)
            self.journal.live_will_saved(session, worker, conn_id, session.will)  # for a router that takes over
        self.by_conn_id[(worker, conn_id)] = session
        if session.subs:
            tenant.cache.clear()
        out = self.out(worker)
        if not connack_sent:  # else the client has had its CONNACK
            out.hold()
            out.session(conn_id, present, list(session.subs.items()) if present else [])
        if present:
            if connack_sent and session.incoming:
                # registered again: QoS 2 releases (REL) its worker sent while the router refused its
                # frames are lost, and a live connection never sends a PUBLISH again after its PUBREC,
                # so no id is left waiting for a release (else the next message with it is dropped)
                session.incoming = ()
                self.journal.incoming_cleared(session)
            self.outbox.resend(session, out)

    def _hold_claim(self, worker: bytes, conn_id: int, header: bytes, payload: bytes) -> bool:
        """A CONNECT that resumes a session waits for the SYNCED of its host's other workers (router/claims.py),
        if there are any; whether it does."""
        links = self.links.links
        host = links[worker].node
        others = {other for other, link in links.items() if other != worker and link.join and link.alive and link.node == host}
        if not others:
            return False
        for other in self.claims.hold((worker, conn_id), header, payload, others):
            self.out(other).sync(self.claims.asked)
        return True

    def _claimed_before(self, old: Session, worker: bytes, claimed: int) -> bool:
        """Whether a connection on `worker` claimed its client id before the connection that holds `old`,
        or one waiting to take it over, did on the same host (one clock: the records of two workers
        reach the router in no order; nodes on two hosts are taken in the order their records come)."""
        if not claimed:
            return False
        links = self.links.links
        host = links[worker].node
        newest = old.claimed if links[old.worker].node == host else 0  # type: ignore[index]  # a live session
        waiting = self.takeovers.get((old.worker, old.conn_id))  # type: ignore[arg-type]
        if waiting is not None and links[waiting[0]].node == host:
            newest = max(newest, wire.Connect.decode(waiting[2]).claimed)
        return claimed < newest

    def _connect_limit(self, tenant: Tenant, old: Session | None, persistent: bool) -> str | None:
        """The limit of `tenant` a new connection (of a `persistent` session) would pass, or None:
        max_connections (taking a live connection's session over adds none), max_sessions (a
        persistent session that is not kept yet), then max_connection_rate, whose token only an
        accepted CONNECT takes."""
        limits = tenant.limits
        if limits.max_connections and tenant.connections >= limits.max_connections and (old is None or old.worker is None):
            return "max_connections"
        if limits.max_sessions and persistent and (old is None or not old.persistent) and \
                sum(session.persistent for session in tenant.sessions.values()) >= limits.max_sessions:
            return "max_sessions"
        if not tenant.take_token():
            return "max_connection_rate"
        return None

    def _take_over(self, old: Session, worker: bytes, conn_id: int, header: bytes, payload: bytes) -> None:
        """A connection on `worker` resumes a session that is live on another worker, which has been
        told to close it (KICK). Records of two workers are not ordered, so that connection's last
        acknowledgements may still be on their way: the session is resumed once its worker has said
        the connection is closed (KICKED, or GONE), or has been taken for dead (`_disconnect`), and
        not before (else a PUBREC in flight would be lost and the PUBLISH sent again, not PUBREL)."""
        self.takeovers[(old.worker, old.conn_id)] = (worker, conn_id, header, payload)  # type: ignore[index]  # a live session: its worker is set

    def _refuse_waiting(self, key: tuple[bytes, int]) -> None:
        """A connection that waited to take over the session of `key` loses it to a newer one."""
        waiting = self.takeovers.pop(key, None)
        if waiting is not None:
            self.out(waiting[0]).kick(waiting[1])

    def _forget_takeovers(self, worker: bytes, gone: Callable[[int], bool]) -> None:
        """Connections of `worker` that waited to take a session over and are `gone`: they will not."""
        for key, (new_worker, new_conn_id, _header, _payload) in list(self.takeovers.items()):
            if new_worker == worker and gone(new_conn_id):
                del self.takeovers[key]

    def _on_gone(self, worker: bytes, header: bytes, payload: bytes) -> None:
        conn_id, publish_will = wire.Gone.decode(header)
        self._connection_ended((worker, conn_id))
        self.claims.forget((worker, conn_id))
        session = self.by_conn_id.get((worker, conn_id))
        if session is not None:
            self._disconnect(session, publish_will)
        elif self.takeovers:
            self._forget_takeovers(worker, lambda waiting: waiting == conn_id)

    def _on_kicked(self, worker: bytes, header: bytes, payload: bytes) -> None:
        """A connection the router kicked is closed: a takeover may go on (its will goes out, as at
        any takeover)."""
        key = (worker, wire.Kicked.decode(header).conn_id)
        self._connection_ended(key)
        session = self.by_conn_id.get(key)
        if session is not None:
            self._disconnect(session, publish_will=True)

    def _on_session_expiry(self, worker: bytes, header: bytes, payload: bytes) -> None:
        """A 5.0 client set its session expiry at DISCONNECT (GONE follows): 0 ends its persistent
        session with the connection, another value is how long it outlives it."""
        conn_id, expiry = wire.SessionExpiry.decode(header)
        session = self.by_conn_id.get((worker, conn_id))
        if session is None or not session.persistent:
            return
        if expiry:
            session.expiry = expiry
        else:
            self.journal.session_dropped(session)
            session.persistent = False

    def _disconnect(self, session: Session, publish_will: bool) -> None:
        """The session's connection ended: publish its will if asked, keep it only if persistent, and
        let a connection that waited to take it over (`_take_over`) have it."""
        if session.unacked:
            self.outbox.reshare(session, self._share)
        key = (session.worker, session.conn_id)
        del self.by_conn_id[key]  # type: ignore[arg-type]  # a session with a connection has its worker
        tenant = self.tenants[session.tenant]
        self.journal.live_will_dropped(session)
        will = session.will
        session.will = None
        if not session.persistent:
            self._discard(session)
        else:
            session.worker = None
            session.conn_id = 0
            session.seen = time.time()
            self.journal.session_saved(session, session.seen)
            if session.subs:
                tenant.cache.clear()
            if ends := session.ends_at():
                self.deadlines.add(ends, session)
        if publish_will and will is not None:
            if will.delay and session.persistent:  # MQTT 5: published when the delay or the session ends
                session.will = will
                session.will_at = session.seen + will.delay
                self.deadlines.add(session.will_at, session)
                self.journal.will_saved(session, will)  # a restarted router sends it when due
            else:
                self._publish_will(tenant, will)
        waiting = self.takeovers.pop(key, None)  # type: ignore[arg-type]  # the key of a live session, as above
        if waiting is not None:  # the connection that takes the session over may have it now
            self._on_connect(waiting[0], waiting[2], waiting[3])

    def _take_will(self, session: Session) -> Will | None:
        """Take the will away from the session (to publish it, or because its client came back), and
        out of the store when it was waiting out its delay there."""
        will = session.will
        if session.will_at:
            self.journal.will_dropped(session)
        session.will, session.will_at = None, 0.0
        return will

    def _will_due(self, session: Session) -> None:
        """An offline session's waiting will goes out now: its delay has passed or the session ends."""
        will = self._take_will(session)
        if will is not None:
            self._publish_will(self.tenants[session.tenant], will)

    def _publish_will(self, tenant: Tenant, will: Will) -> None:
        """A will goes out in its session's tenant."""
        self.publish(tenant, will.topic, will.payload, will.qos, will.retain, will.props,
                     int(time.time()) + will.expiry if will.expiry else 0)

    def _discard(self, session: Session) -> None:
        self.journal.session_dropped(session)
        tenant = self.tenants[session.tenant]
        if session.subs:
            tenant.cache.clear()
        for topic_filter in list(session.subs):
            self._unsubscribe(session, topic_filter)
        if tenant.sessions.get(session.client_id) is session:
            del tenant.sessions[session.client_id]

    def expire(self, now: float) -> int:
        """Remove retained messages past their expiry, and persistent sessions without an expiry
        interval of their own (3.1.1, and 5.0's "never") offline longer than `expiration`, in every
        tenant; how many sessions went."""
        tenants = list(self.tenants.values())
        for tenant in tenants:
            for topic in tenant.retained.expire(now):
                self.journal.retained_cleared(tenant.name, topic)
        if not self.expiration:
            return 0
        stale = [s for tenant in tenants for s in tenant.sessions.values() if s.worker is None and self._over(s, now)]
        for session in stale:
            self._end(session, now)
        return len(stale)

    def drop_tenant(self, name: str) -> None:
        """A reload removed tenant `name` with `on_remove = "drop"`: its sessions (their queued messages,
        subscriptions and wills) and its retained messages go, from memory and the store; its live
        connections are closed (5.0: 0x98), whichever of the router and their worker hears of it first.
        A tenant of that name declared again starts empty."""
        tenant = self.tenants.get(name)
        if tenant is None:
            return
        sessions = list(tenant.sessions.values())
        for session in sessions:
            if session.worker is not None:
                key = (session.worker, session.conn_id)
                self.out(session.worker).close(session.conn_id)
                del self.by_conn_id[key]
                self.journal.live_will_dropped(session)
                self._refuse_waiting(key)
            self._take_will(session)
            self._discard(session)
        for topic in tenant.retained.messages:
            self.journal.retained_cleared(name, topic)
        for key in [key for key, of in self.conn_tenants.items() if of is tenant]:
            del self.conn_tenants[key]
        del self.tenants[name]
        self.dropped.add(name)
        log.info("tenant %s removed: its %d sessions and %d retained messages dropped", name, len(sessions),
                 len(tenant.retained))

    def due(self, now: float) -> None:
        """After every turn (router/main.py): publish the delayed wills that are due, and end the
        sessions whose own expiry interval has passed (not those of a dropped tenant)."""
        for session in self.deadlines.due(now):
            tenant = self.tenants.get(session.tenant)
            if session.worker is None and tenant is not None and tenant.sessions.get(session.client_id) is session:
                self._settle(session, now)  # else back online, or gone: the reminder is stale

    def _settle(self, session: Session, now: float) -> None:
        """An offline session at `now`: its delayed will if due, then its end if its time is up."""
        if session.will_at and session.will_at <= now:
            self._will_due(session)
        if self._over(session, now):
            self._end(session, now)

    def _over(self, session: Session, now: float) -> bool:
        """Whether an offline session's time is up."""
        ends = self.ends_at(session)
        return bool(ends) and ends <= now

    def ends_at(self, session: Session) -> float:
        """The time.time() an offline session ends: its own expiry interval, or for one without (3.1.1,
        and 5.0's "never") persistent_client_expiration; 0: never."""
        if ends := session.ends_at():
            return ends
        return session.seen + self.expiration if self.expiration else 0.0

    def _end(self, session: Session, now: float, why: str = "expired") -> None:
        """An offline session's time is up (or an operator ended it): its delayed will goes out now,
        then the session, from memory and the store."""
        log.info("client %s: persistent session %s after %.0f s offline", session.client_id, why, now - session.seen)
        self._will_due(session)
        self._discard(session)

    def remove_session(self, request: SessionRemoval) -> None:
        """An operator removes an offline persistent session as if it had expired (`_end`); a
        connected one is left alone."""
        tenant = self.tenants.get(request.tenant)
        session = tenant.sessions.get(request.client_id) if tenant is not None else None
        if session is None or not session.persistent:
            request.outcome = "missing"
        elif session.worker is not None:
            request.outcome = "connected"
        else:
            self._end(session, time.time(), "removed by an operator")
            request.outcome = "removed"
        request.done.set()
