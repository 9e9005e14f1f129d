"""A connection worker process: adopts sockets from the acceptor, speaks MQTT, batches to the router.

Everything one loop turn produces is flushed once at its end (`flush`): one write per client socket
and one ZeroMQ frame to the router. Keepalive and CONNECT deadlines share one wheel swept ten times a second.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import os
import signal
import socket
import ssl
import time
from collections import deque
from collections.abc import Iterable
from functools import partial
from typing import NoReturn

import orjson
import psutil
import uvloop

from plexmq import grants, wire
from plexmq.archive_format import archived_publish, sender
from plexmq.bans import BanSet
from plexmq.files import Access
from plexmq.mqtt import PROTOCOLS, reasons, v5
from plexmq.mqtt import properties as props
from plexmq.mqtt.framing import packets_in, run_payloads
from plexmq.process import (
    become_child,
    child_config,
    connections_per_worker,
    leave_parent,
    missed_reload,
    process_usage,
    settle_heap,
)
from plexmq.workers import from_peers, from_router, handoff, tls, trace_watch
from plexmq.workers.archive import ArchiveWriter
from plexmq.workers.auth.acl import Checker
from plexmq.workers.auth.logins import Auth
from plexmq.workers.connection import Connection, peer_name
from plexmq.workers.counters import Counters
from plexmq.workers.follow import Follower
from plexmq.workers.handlers import connect
from plexmq.workers.keepalive import TimerWheel
from plexmq.workers.link import RouterLink, local_address
from plexmq.workers.negotiated import Negotiated
from plexmq.workers.outbound import Extra, Forms, Outbound
from plexmq.workers.peers import Marks, Peers, delivered, direct_endpoint
from plexmq.workers.routes import RouteTables, Special, Subscriber
from plexmq.workers.settings import Settings
from plexmq.workers.sockets import Poller
from plexmq.workers.states import CLOSED, CONNECTED, CONNECTING
from plexmq.workers.tenant_limits import Limits, limited
from plexmq.workers.topic_sample import SAMPLE, TopicSample
from plexmq.workers.websocket import WebSocket

log = logging.getLogger("plexmq.worker")

KNOWN_TOPICS_MAX = 100_000  # topic names already validated, so a plain QoS 0 PUBLISH is checked by one lookup
LOAD_REPORT_INTERVAL = 0.005  # seconds between two load reports to the acceptor, at least
# handoff messages (up to 64 sockets each) taken per loop turn: after a restart the channel may hold
# thousands of sockets, and the turn's end writes the CONNACKs; the rest waits for the next turn
ADOPT_MESSAGES = 8
BYE_LINGER_MS = 1000  # how long a stopping worker waits for its last frame (BYE) to leave
UNANSWERED_WARNING = 5.0  # seconds a join may go unanswered before the worker says why it may be
# what a 5.0 CONNACK says the broker supports: all of it, said although saying nothing means the same
SUPPORTED: props.Properties = {props.RETAIN_AVAILABLE: 1, props.WILDCARD_SUBSCRIPTION_AVAILABLE: 1,
                               props.SUBSCRIPTION_IDENTIFIER_AVAILABLE: 1, props.SHARED_SUBSCRIPTION_AVAILABLE: 1}


# conn, packet id, qos, retain, topic, payload, MQTT 5 properties, expiry; topic None: not for the router
# (denied by the ACL, or a QoS 2 resend delivered here), acknowledged in its turn with the reason code
# in expiry's place
Awaiting = tuple["Connection", int, int, bool, bytes | None, bytes, bytes, int]
# a QoS 1 or 2 PUBLISH sent to peers: its connection, packet id, QoS, reason code, and each peer with the
# number of the last frame sent to it before the one that carried it (an answer past it: delivered); an
# ACL-denied, local or resent one behind it waits its turn with no peer
PeerAck = tuple["Connection", int, int, int, Marks]


class Worker:
    def __init__(self, worker_id: int, config: dict, loop: asyncio.AbstractEventLoop,
                 channel: socket.socket, fd_limit: int) -> None:
        self.worker_id = worker_id
        self.loop = loop
        self.channel = channel
        self.config_path: str = config["config_path"]
        self.settings = Settings.from_config(config)  # swapped whole by `reload`
        self.counters = Counters()
        self.limits: dict[str, Limits] = {}  # tenant -> its limits on this worker, for the tenants that set some
        self.shedding = False  # above memory_limit: QoS 0 deliveries are dropped
        self.shed = 0  # deliveries dropped while shedding
        self.topics = TopicSample()  # the busiest topics, sampled (workers/topic_sample.py)
        self.sample_in = SAMPLE  # PUBLISHes until the next sample
        self.watching: trace_watch.Watching = {}  # the console's live traces, by tenant (workers/trace_watch.py)
        # the banned clients, as the router says them (BANS): None until it first has, kept across joins
        # until it says them again
        self.bans: BanSet | None = None
        self.identity_as_username = False
        self.tenant_field = ""  # tenant_certificate_field, as getpeercert() names it ("": none)
        # per listener byte (handoff.py): its TLS context, whether it speaks WebSocket, its tenant ("": none)
        self.listeners: list[tuple[ssl.SSLContext | None, bool, str]] = []
        self._set_tls(config)
        self.max_conns = connections_per_worker(fd_limit)
        self.conns: dict[int, Connection] = {}
        self.ending: list[tuple[float, int, Connection]] = []  # heap: connections whose token expires
        self.next_conn = 1
        self.dirty: list[Outbound] = []
        # kept as they change, so that the once-a-second report does not walk every connection
        self.connected = dict.fromkeys(PROTOCOLS, 0)  # CONNECT level -> connections past their CONNACK
        self.queuing: set[Outbound] = set()  # connections with messages waiting in their queue
        self.flush_pending = False
        self.awaiting: deque[Awaiting] = deque()  # QoS>0 PUBs the router has not routed yet
        self.node: str = config["node_name"]
        self.identity = wire.identity(self.node, worker_id)
        self.address = local_address(config["router_endpoint"])
        self.label = wire.label(self.node, worker_id)
        self.routes = RouteTables(self.identity, config["direct_delivery"])
        self.unanswered = 0  # SUBSCRIBE and UNSUBSCRIBE records of live connections the router has not answered
        self.wheel = TimerWheel(loop.time())
        self.poller = Poller(loop)  # plain TCP and WebSocket sockets; TLS ones get uvloop's transport
        self.link = RouterLink(loop, config["router_endpoints"], self.identity, self.on_frame,
                               lambda: self.rejoin("frames from the router were lost"), config.get("router_curve"))
        # where other nodes' workers send it QoS 0 messages (workers/peers.py), as HELLO tells the router
        direct = config["direct_bind"] and config["direct_delivery"]
        self.direct = direct_endpoint(config["direct_bind"], worker_id) if direct else ""
        self.link.open(self._hello([]))
        self.follower = Follower(self)
        # the other workers, which it delivers messages to itself (workers/peers.py)
        self.peers = Peers(loop, os.path.dirname(self.config_path), self.identity, partial(from_peers.deliver, self),
                           self.answered, self.routes.reach, self.direct, config.get("router_curve")) \
            if config["direct_delivery"] else None
        self.peer_acks: deque[PeerAck] = deque()  # PUBACKs and PUBRECs of messages sent to peers, in order
        # ROUTES_ACKs waiting for the peers to deliver what they were sent before: (generation, marks)
        self.routes_acks: deque[tuple[int, Marks]] = deque()
        self.auth = Auth(config, loop)
        self.process = psutil.Process()
        self.known_topics: dict[bytes, bool] = {}  # valid topic name -> whether it is archived
        self.turn_us = 0  # receive time of this loop turn's archived reads, taken at the first
        archive = config["archive"]
        self.archive = ArchiveWriter(archive["dir"], worker_id, archive["topics"], archive["roll_bytes"],
                                     archive["roll_seconds"], Access(archive["group"])) if archive["enabled"] else None
        self.refused_logged_at = 0.0
        self.received = 0  # sockets the acceptor has passed us, refused ones included
        self.reported_load = (-1, -1)
        self.reported_at = -LOAD_REPORT_INTERVAL
        self.report_pending = False
        self.stopped = False
        self.exit_status = 0  # the process's: LINK_REFUSED when the router speaks another link protocol
        loop.add_reader(channel.fileno(), self._channel_readable)
        loop.call_at(math.floor(loop.time()) + 1.0, self._tick)
        loop.call_at(self.wheel.next_sweep(loop.time()), self._sweep)
        self.flush_soon()

    def now(self) -> float:
        return self.loop.time()

    # -- the end of every loop turn ----------------------------------------------------------------

    def flush_soon(self) -> None:
        if not self.flush_pending:
            self.flush_pending = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.flush_pending = False
        self.turn_us = 0
        dirty = self.dirty
        self.dirty = []
        for conn in dirty:
            conn.flush()
        peers = self.peers
        if peers is None:
            self.link.send()
        else:
            # this turn's frames to the peers first; a message for the router then waits until they have
            # delivered all they were sent, so that it cannot overtake one of them through the router
            # (with it waiting, nothing goes to a peer: `local_path`, `RouterLink.unrouted`)
            peers.send()
            if not (self.link.batched and peers.unconfirmed):
                self.link.send()
        self._report_load()  # the acceptor balances and caps on it: tell it soon after it changes
        if self.archive is not None:
            self.archive.flush()

    # -- connections -------------------------------------------------------------------------------

    def adopt(self, fd: int, family: int, listener: int) -> None:
        """Serve a TCP socket of address `family` passed by the acceptor as its listener (an index in
        `listeners`) says, or refuse it when out of descriptors."""
        if len(self.conns) >= self.max_conns:
            os.close(fd)
            self._refuse(1)
            return
        if listener >= len(self.listeners):  # a listener a reload added: its SIGHUP is still on its way
            self.reload()
        sock = socket.socket(family, socket.SOCK_STREAM, 0, fd)  # told: no getsockname and getsockopt to find them
        sock.setblocking(False)
        conn_id = self.next_conn
        self.next_conn += 1
        conn = Connection(self, conn_id, self.loop.time() + self.settings.connect_timeout)
        self.conns[conn_id] = conn
        self.wheel.add(conn)
        context, websocket, conn.tenant = self.listeners[listener]
        protocol = WebSocket(conn) if websocket else conn
        if context is None:
            self.poller.serve(sock, protocol)
            return
        try:
            conn.peer = peer_name(sock.getpeername())  # for the log line of a failed handshake
        except OSError:
            pass  # the client is gone already: the handshake fails and says so
        serving = self.loop.connect_accepted_socket(lambda: protocol, sock, ssl=context,
                                                    ssl_handshake_timeout=self.settings.connect_timeout)
        asyncio.ensure_future(serving).add_done_callback(lambda task: self._served(conn, task))

    def _served(self, conn: Connection, task: asyncio.Future[tuple[asyncio.Transport, WebSocket | Connection]]) -> None:
        """The TLS handshake may fail, or end after the CONNECT deadline has closed `conn`."""
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            conn.close(f"TLS handshake failed: {exc}" if isinstance(exc, ssl.SSLError) else f"cannot serve socket: {exc}")
        elif conn.state == CLOSED:
            task.result()[0].close()

    def _refuse(self, count: int) -> None:
        counters = self.counters
        counters.refused += count
        now = time.monotonic()
        if now - self.refused_logged_at >= 1.0:
            self.refused_logged_at = now
            log.warning("out of file descriptors (%d connections): refused %d sockets so far", len(self.conns),
                        counters.refused)

    def forget(self, conn: Connection, tell_router: bool, publish_will: bool) -> None:
        self.conns.pop(conn.conn_id, None)
        conn.routes.forget(conn.conn_id, conn.subs or ())
        self.unanswered -= conn.waiting  # their answers find no connection
        conn.waiting = 0
        self.flush_soon()  # which reports the new load (and sends GONE)
        if tell_router:
            self.link.gone(conn.conn_id, publish_will)

    def remember_topic(self, topic: bytes) -> bool:
        """Note a validated topic name; whether its PUBLISHes are archived."""
        known = self.known_topics
        if len(known) >= KNOWN_TOPICS_MAX:
            known.clear()
        archived = known[topic] = self.archive is not None and self.archive.wants(topic)
        return archived

    def archive_packets(self, conn: Connection, packets: bytes) -> None:
        """Archive PUBLISH packets of `conn` that one read brought, as they are, in its tenant's tree."""
        if conn.sender is None:
            conn.sender = sender(conn.client_id, conn.username, conn.level)
        if not self.turn_us:
            self.turn_us = time.time_ns() // 1000  # the reads of one loop turn arrived together
        self.archive.append(conn.tenant, (self.turn_us, conn.sender, packets))  # type: ignore[union-attr]  # called only with an archive

    def publish(self, conn: Connection, topic: str, packet_id: int, qos: int, retain: bool, payload: bytes,
                props: bytes = b"", expiry: int = 0) -> None:
        """A PUBLISH of `conn`, delivered here when only workers' own subscribers want it (`_deliver_here`),
        else to the router; `props` and `expiry` as plexmq/wire.py carries them. A QoS 2 PUBLISH of a
        session that ends with its connection is kept in `conn.incoming` with its path until PUBREL, so
        that a resend before it takes the same path (here: only its PUBREC again; the router drops it).
        Each counts down `sample_in`: one in SAMPLE is tallied for the busiest topics (workers/topic_sample.py);
        while a console trace is live, it is watched (workers/trace_watch.py)."""
        name = topic.encode()
        self.sample_in -= 1
        if self.sample_in <= 0:
            self.sample_in = self.topics.take(conn.tenant, name, self.sample_in)
        if self.watching:
            trace_watch.see(self, conn, name, payload, qos, retain)
        if self.archive is not None:
            to_archive = self.known_topics.get(name)
            if to_archive is None:
                to_archive = self.remember_topic(name)
            if to_archive:
                self.archive_packets(conn, archived_publish(conn.level, name, payload, qos, retain, packet_id, props))
        if qos == 2 and not conn.persistent:  # a persistent session's ids outlive the connection: the router keeps them
            incoming = conn.incoming
            if incoming is None:
                incoming = conn.incoming = {}
            took = incoming.get(packet_id)
            if took is False:  # a resend of one delivered here
                return self._acknowledge_in_turn(conn, packet_id, qos, 0)
            if took is None:
                delivered_here = self._deliver_here(conn, name, packet_id, qos, retain, payload, props, expiry)
                incoming[packet_id] = not delivered_here
                if delivered_here:
                    return
        elif qos < 2 and self._deliver_here(conn, name, packet_id, qos, retain, payload, props, expiry):
            return
        self.link.pub(conn.conn_id, packet_id, qos, retain, name, payload, props, expiry, qos > 0 and conn.v5 is not None)
        if qos:
            self.awaiting.append((conn, packet_id, qos, retain, name, payload, props, expiry))

    def _deliver_here(self, conn: Connection, name: bytes, packet_id: int, qos: int, retain: bool, payload: bytes,
                      props: bytes, expiry: int) -> bool:
        """Deliver a message that is not retained, when the router may be skipped (`local_path`) and only
        workers' own subscribers want it: to this one's, and to the peers' (QoS 1 and 2 only to those of
        this host: `LocalRoutes.targets`); its PUBACK or PUBREC goes once the peers have answered. False:
        the router must route it."""
        if retain or not self.local_path(conn):
            return False
        found = conn.routes.targets(name)
        if found is None:
            return False
        subs, peers, special = found[0], found[2] if qos else found[1], found[3]
        if peers is None:
            return False
        extra = (props, expiry) if props or expiry else None
        copies = len(subs)
        if subs:
            self.deliver_message(name, payload, qos, False, False, extra, subs)
        if special:
            copies += self.deliver_special(special, name, payload, qos, extra, conn.conn_id)
        self._count_local(conn, 1, copies)
        marks = self.peers.message(peers, conn.tenant, name, payload, extra, qos) if peers else ()  # type: ignore[union-attr]  # peers found: it has them
        if qos:
            code = 0 if subs or peers or special else reasons.NO_MATCHING_SUBSCRIBERS  # (no local counts as matched)
            if marks or self.peer_acks:  # after the peers' answers, and in the order of its PUBLISH
                self.peer_acks.append((conn, packet_id, qos, code, marks))
            else:
                conn.acknowledge(packet_id, qos, code)
        return True

    def _count_local(self, conn: Connection, count: int, copies: int) -> None:
        """Messages of `conn` delivered without the router (here, or by the peers it sent them to, which
        count their copies), and this worker's copies: per tenant (the router counts the others)."""
        tally = conn.tally
        tally.received += count
        tally.sent += copies

    def publish_run(self, conn: Connection, topic: bytes, count: int, packets: bytes, as_v5: bool) -> None:
        """A run of `count` plain QoS 0 PUBLISH packets to `topic` of `conn`, as they are: written here
        to the local subscribers and sent to the other workers of this host when only they want it (as
        `publish`), else to the router."""
        self.sample_in -= count
        if self.sample_in <= 0:
            self.sample_in = self.topics.take(conn.tenant, topic, self.sample_in)
        if self.watching:
            trace_watch.see_run(self, conn, topic, count, packets, as_v5)
        found = conn.routes.targets(topic) if self.local_path(conn) else None
        if found is None or found[1] is None:
            self.link.pub0(conn.conn_id, topic, count, packets, as_v5)
            return
        subs, peers, special = found[0], found[1], found[3]
        if self.shedding:
            self._count_local(conn, count, 0)
            self.shed += count * (len(subs) + len(special))
        else:
            copies = count * len(subs)
            if subs:
                self.deliver_raw(subs, packets, count, as_v5)
            if special:
                copies += self.deliver_special_run(special, topic, packets, as_v5, conn.conn_id)
            self._count_local(conn, count, copies)
        for place in peers:
            self.peers.raw(place, conn.tenant, topic, packets, count, as_v5)  # type: ignore[union-attr]  # peers found: it has them

    def answered(self) -> None:
        """A peer answered: the PUBACKs and ROUTES_ACKs whose peers have all delivered go, in order; and
        the frame to the router, if it waited (`flush`)."""
        acks = self.peer_acks
        while acks and delivered(acks[0][4]):
            conn, packet_id, qos, code, _marks = acks.popleft()
            if conn.state != CLOSED:
                conn.acknowledge(packet_id, qos, code)
        tables = self.routes_acks
        while tables and delivered(tables[0][1]):
            self.link.routes_ack(tables.popleft()[0])
        self.flush_soon()

    def local_path(self, conn: Connection) -> bool:
        """Whether a PUBLISH of `conn` may skip the router, if its topic allows: not while anything of
        this worker is on its way through the router (a topic that stops needing the router must
        not overtake its own messages; PUBACKs keep their order), nor before the client's CONNACK,
        nor while a SUBSCRIBE or UNSUBSCRIBE of this worker waits for its answer (a client may
        publish to what it has just subscribed to; a subscription that moves from the router's
        place to this worker's is served here only from its SUBACK on)."""
        return not self.link.unrouted and not self.unanswered and conn.state == CONNECTED

    def tenant_limits(self, tenant: str) -> Limits | None:
        """The limits of `tenant` on this worker, for a connection at CONNECT (None: it sets none): one
        `Limits` per tenant, shared by its connections here (they draw from its rate buckets)."""
        declared = self.settings.tenants.declared.get(tenant)
        if declared is None or not limited(declared):
            return None
        held = self.limits.get(tenant)
        if held is None:
            held = self.limits[tenant] = Limits(declared, self.settings)
        return held

    def connack_properties(self, negotiated: Negotiated, limits: Limits | None) -> props.Properties:
        """What a 5.0 client is told in its CONNACK: the broker's limits (its tenant's, `limits`) and
        what it supports, and what it asked for or was told to do at CONNECT (keep alive, response
        information, the end of its enhanced authentication)."""
        settings = self.settings
        told: props.Properties = {props.RECEIVE_MAXIMUM: settings.receive_maximum,
                                  props.MAXIMUM_PACKET_SIZE: settings.max_packet_size, **SUPPORTED}
        if limits is not None:
            told[props.MAXIMUM_PACKET_SIZE] = limits.max_packet_size
            if limits.max_qos < 2:
                told[props.MAXIMUM_QOS] = limits.max_qos
            if limits.max_session_expiry:  # the interval it has, which may be less than it asked for
                told[props.SESSION_EXPIRY_INTERVAL] = negotiated.session_expiry
        if settings.topic_alias_maximum:
            told[props.TOPIC_ALIAS_MAXIMUM] = settings.topic_alias_maximum
        if negotiated.assigned_id:
            told[props.ASSIGNED_CLIENT_IDENTIFIER] = negotiated.assigned_id
        if negotiated.server_keepalive:
            told[props.SERVER_KEEP_ALIVE] = negotiated.server_keepalive
        if negotiated.response_info and settings.response_information:
            told[props.RESPONSE_INFORMATION] = settings.response_information
        if negotiated.auth_method:
            told[props.AUTHENTICATION_METHOD] = negotiated.auth_method
            told[props.AUTHENTICATION_DATA] = negotiated.auth_data
        return told

    # -- records from the router ---------------------------------------------------------------------

    def on_frame(self, frame: bytes) -> None:
        """Each record of a frame from the router, handled by workers/from_router.py."""
        handlers = from_router.HANDLERS
        for kind, header, payload in wire.records(frame):
            handlers[kind](self, header, payload)
        self.flush_soon()

    # -- deliveries to local subscribers (from the router, or this worker's own) ----------------------

    def deliver_raw(self, subs: Iterable[Subscriber], payload: bytes, count: int, as_sent_by_v5: bool) -> None:
        """A raw run of `count` packets for local subscribers, written as it is to those of its version; the other
        version's form is made once, for the first subscriber that needs it."""
        conns = self.conns
        v4_form = None if as_sent_by_v5 else payload
        v5_form = payload if as_sent_by_v5 else None
        run_topic = b""
        forms: Forms = {}
        for conn_id, _granted, _packet_id in subs:
            conn = conns.get(conn_id)
            if conn is None or conn.state == CLOSED:
                continue
            if conn.screened:
                if not run_topic:
                    run_topic = v5.first_topic(payload)
                if not conn.checker.can_read(run_topic):  # type: ignore[union-attr]  # screened: it has a checker
                    self._withhold(conn, 0, packets_in(payload))
                    continue
            if conn.v5 is None:
                if v4_form is None:
                    v4_form = v5.publishes_to_v4(payload)
                conn.deliver_raw(v4_form, count)
            else:
                if v5_form is None:
                    v5_form = v5.publishes_from_v4(payload)
                if not run_topic:
                    run_topic = v5.first_topic(payload)
                conn.deliver_raw5(run_topic, v5_form, count, forms)

    def deliver_message(self, topic: bytes, payload: bytes, qos: int, retain: bool, dup: bool, extra: Extra | None,
                         subs: Iterable[Subscriber]) -> None:
        """One message to local subscribers (conn, granted QoS, packet id or 0)."""
        conns = self.conns
        qos0_packets: list[bytes | None] = [None, None]  # 3.1.1 and 5.0, each encoded once and shared
        forms: Forms = {}  # the 5.0 one with each topic alias, made once too
        for conn_id, granted, packet_id in subs:
            conn = conns.get(conn_id)
            if conn is None or conn.state == CLOSED:
                continue
            if conn.screened and not conn.checker.can_read(topic):  # type: ignore[union-attr]  # screened: it has a checker
                self._withhold(conn, packet_id, 1)
                continue
            eff = granted if granted < qos else qos
            packet = None
            if eff == 0:
                if self.shedding:
                    self.shed += 1
                    continue
                version = conn.v5 is not None
                packet = qos0_packets[version]
                if packet is None:
                    head = conn.publish_header(topic, len(payload), 0, retain, False, 0, extra)
                    if head is None:
                        continue  # expired
                    packet = qos0_packets[version] = head + payload
            conn.deliver(topic, payload, eff, retain, dup, packet_id, packet, extra, forms)

    def deliver_special(self, special: Iterable[Special], topic: bytes, payload: bytes, qos: int, extra: Extra | None,
                        publisher: int = 0) -> int:
        """One message that is not retained to local subscribers whose subscriptions have MQTT 5 options or
        identifiers, each resolved for its own (plexmq/grants.py: its QoS, its identifiers; none for no
        local when it is the `publisher`'s connection); how many it went to."""
        copies = 0
        for conn_id, matched in special:
            resolved = grants.resolve(matched, qos, False, conn_id == publisher)
            if resolved is None:
                continue
            eff, _retain, ids = resolved
            own = extra
            if ids:
                own = (extra[0] + ids, extra[1]) if extra is not None else (ids, 0)
            self.deliver_message(topic, payload, eff, False, False, own, ((conn_id, eff, 0),))
            copies += 1
        return copies

    def deliver_special_run(self, special: Iterable[Special], topic: bytes, packets: bytes, as_v5: bool,
                            publisher: int = 0) -> int:
        """A raw run of plain QoS 0 packets (`deliver_raw`) to subscribers with MQTT 5 options or identifiers:
        each packet resolved for each (`deliver_special`); how many copies went."""
        copies = 0
        for payload in run_payloads(packets, len(topic), as_v5):
            copies += self.deliver_special(special, topic, payload, 0, None, publisher)
        return copies

    def _withhold(self, conn: Connection, packet_id: int, count: int) -> None:
        """Messages the client may not read (its rules changed since it subscribed, or it resumed a
        session another user made): dropped and counted; a persistent session's copy (the router's
        `packet_id`) is finished with the router as if it had been sent, so it is not sent again."""
        counters = self.counters
        counters.withheld += count
        counters.denied += count
        conn.tally.denied += count
        if packet_id:
            self.link.ack(conn.conn_id, packet_id, wire.ACK_DONE)

    def judge_access(self) -> None:
        """The ACL changed (a reload, the database's table): every live connection takes its rules
        anew, so rights taken away stop its next delivery and its next PUBLISH."""
        for conn in self.conns.values():
            if conn.state == CONNECTING or conn.state == CONNECTED:
                conn.take_rules(self.rules(conn))

    def rules(self, conn: Connection) -> Checker | None:
        """The ACL's answers for `conn`: its tenant's ACL (whose %u is the tenant-local name) or the broker's."""
        if conn.client_id in self.settings.bridges:  # only the bridge's token logs in so: its rules are the config's
            return None
        auth = self.auth.of(conn.tenant)
        return auth.checker(conn.local_name if auth.local_acl else conn.username, conn.client_id)

    def deny(self, conn: Connection, packet_id: int, qos: int) -> None:
        """A PUBLISH the ACL refuses: dropped and counted, but acknowledged as 3.1.1 requires (5.0: with 0x87)."""
        self.counters.denied += 1
        conn.tally.denied += 1
        if qos:
            self._acknowledge_in_turn(conn, packet_id, qos, reasons.NOT_AUTHORIZED)

    def _acknowledge_in_turn(self, conn: Connection, packet_id: int, qos: int, code: int) -> None:
        """PUBACK or PUBREC with `code` for a PUBLISH that goes nowhere (denied, or a QoS 2 resend
        delivered already), after those of the PUBLISHes before it (`awaiting`, `peer_acks`)."""
        if self.awaiting:
            self.awaiting.append((conn, packet_id, qos, False, None, b"", b"", code))
        elif self.peer_acks:
            self.peer_acks.append((conn, packet_id, qos, code, ()))
        else:
            conn.acknowledge(packet_id, qos, code)

    # -- the acceptor channel and housekeeping ----------------------------------------------------

    def _channel_readable(self) -> None:
        for _ in range(ADOPT_MESSAGES):  # the channel is read again on the next turn if more waits
            try:
                msg, fds, lost = handoff.recv_message(self.channel)
            except BlockingIOError:
                break
            if not msg:
                log.warning("acceptor channel closed: stopping")
                self.stop()
                return
            if msg[0] == handoff.FDS:
                self.received += len(fds) + lost
                for fd, listener in zip(fds, msg[2:]):  # the kernel drops the last fds when we run out
                    self.adopt(fd, msg[1], listener)
                if lost:
                    self._refuse(lost)
        self._report_load()

    def _hello(self, live: list[int]) -> wire.Hello:
        return wire.Hello(wire.PROTOCOL, self.worker_id, self.node, self.address, os.getpid(), live, self.direct)

    def rejoin(self, why: str, level: int = logging.WARNING) -> None:
        """The router does not take this join any more (it restarted, frames were lost on the link,
        or it took this worker for dead), or the link moved to another router (workers/follow.py,
        which says at what `level` to log it): register every live session with it again, then send again
        the QoS 1/2 PUBLISHes it had not confirmed (at least once: never lost). A connection still
        waiting for an answer is closed: the answer may never come."""
        live = []
        for conn in list(self.conns.values()):
            if conn.state == CONNECTED and not conn.waiting:
                live.append(conn)
            elif conn.state == CONNECTING or conn.state == CONNECTED:
                conn.kicked = True  # nothing to tell the router: its HELLO leaves it out
                conn.close("the link to the router was renewed while it was answering this client")
        self.link.open(self._hello([conn.conn_id for conn in live]))
        self.routes_acks.clear()  # the old router's generations: the new one sends its whole table
        for conn in live:
            conn.register(connack_sent=True)
        self.routes.forget_table()
        self.watching = {}  # the router says the live traces again (TRACES)
        awaiting = deque(a for a in self.awaiting if a[0].state != CLOSED)
        for conn, packet_id, qos, retain, topic, payload, carried, expiry in awaiting:
            if topic is not None:
                self.link.pub(conn.conn_id, packet_id, qos, retain, topic, payload, carried, expiry, conn.v5 is not None)
        self.awaiting = awaiting
        log.log(level, "joined the router again (%s): %d sessions registered again, %d publishes sent again",
                why, len(live), len(awaiting))
        self.flush_soon()

    def _report_load(self) -> None:
        """Tell the acceptor a changed load, at most once per LOAD_REPORT_INTERVAL: in a connect storm
        it changes every turn, and each report wakes the acceptor. Meanwhile the acceptor counts the
        sockets it handed that the worker has not yet seen, so it never admits too many."""
        if self.report_pending or (len(self.conns), self.received) == self.reported_load:
            return
        wait = self.reported_at + LOAD_REPORT_INTERVAL - self.loop.time()
        if wait > 0:
            self.report_pending = True
            self.loop.call_later(wait, self._send_load)
        else:
            self._send_load()

    def _send_load(self) -> None:
        self.report_pending = False
        load = (len(self.conns), self.received)
        if load == self.reported_load:
            return
        self.reported_load = load
        self.reported_at = self.loop.time()
        try:
            self.channel.send(b"L" + handoff.LOAD_REPORT.pack(*load))
        except BlockingIOError:
            self.reported_load = (-1, -1)  # try again on the next tick
        except OSError:
            pass  # the acceptor is gone: the channel's EOF stops this worker

    def end_at(self, when: float, conn: Connection) -> None:
        """Close `conn` at `when` (time.time(): its token expires), checked by the once-a-second sweep."""
        heapq.heappush(self.ending, (when, conn.conn_id, conn))

    def _sweep(self) -> None:
        """Just after each slot of the wheel: close the connections past their CONNECT or keepalive
        deadline [MQTT-3.1.2-24]."""
        loop = self.loop
        for conn in self.wheel.expire(loop.time()):
            if conn.state < CONNECTING:  # type: ignore[attr-defined]  # the wheel holds Connections
                conn.close(f"no CONNECT within {self.settings.connect_timeout:g} s")  # type: ignore[attr-defined]  # as above
            else:
                conn.close("keepalive timeout", code=reasons.KEEP_ALIVE_TIMEOUT)  # type: ignore[attr-defined]  # as above
        loop.call_at(self.wheel.next_sweep(loop.time()), self._sweep)

    def _tick(self) -> None:
        now = self.loop.time()
        ending, wall = self.ending, time.time()
        while ending and ending[0][0] <= wall:
            heapq.heappop(ending)[2].close("token expired", code=reasons.NOT_AUTHORIZED)  # a closed one ignores it
        self._report_load()
        self._report_stats()
        if self.auth.rules_changed():
            self.judge_access()
            log.info("worker %d: the ACL table changed: its %d connections take the new rules", self.worker_id,
                     len(self.conns))
        link = self.link
        if self.node:
            connect.refuse_unserved(self, now)
        if not link.answered and now - link.opened_at >= UNANSWERED_WARNING and not link.warned:
            link.warned = True  # once per join: the operator has the reason
            log.warning("no answer from the router at %s for %.0f s: is it up and reachable, are this node's keys "
                        "(router_curve_dir) the router's, and is its node_name (%s) unique among the router's nodes?",
                        link.endpoint, now - link.opened_at, self.node or "-")
        if self.archive is not None:
            self.archive.flush()  # seals a segment that has grown old while idle
        if self.peers is not None and (self.peers.unconfirmed or self.peers.shunned):
            self.peers.expire(now)
        self.loop.call_at(math.floor(self.loop.time()) + 1.0, self._tick)  # just after the next whole second

    def _report_stats(self) -> None:
        """Once a second, the counters the router publishes as $SYS and serves to Prometheus."""
        cpu, rss = process_usage(self.process)
        limit = self.settings.memory_limit
        shedding = bool(limit) and rss > (limit * 0.9 if self.shedding else limit)
        if shedding != self.shedding:
            self.shedding = shedding
            log.warning("worker %d %s QoS 0 deliveries (RSS %d MB, memory_limit %d MB)", self.worker_id,
                        "sheds" if shedding else "no longer sheds", rss >> 20, limit >> 20)
        queued = sum(len(conn.queue) for conn in self.queuing)
        protocols = {PROTOCOLS[level]: count for level, count in self.connected.items()}
        counters = self.counters
        tallies = counters.tenants.values()
        self.link.stats(wire.Stats(
            self.label, self.node, os.getpid(), len(self.conns), counters.dropped, counters.denied, counters.withheld,
            counters.refused, self.auth.refused, queued, protocols, self.shed, cpu, rss, sum(t.received for t in tallies),
            sum(t.sent for t in tallies), counters.by_tenant() if self.settings.metrics_tenants else {},
            self.topics.report(), trace_watch.skipped(self.watching)))
        self.flush_soon()

    def reload(self) -> None:
        """SIGHUP (from the acceptor, which has written the new config): apply what can change live,
        the ACL included: live connections take the new rules at once."""
        try:
            with open(self.config_path, "rb") as f:
                config = orjson.loads(f.read())
        except (OSError, orjson.JSONDecodeError) as exc:
            log.error("worker %d cannot reload its settings: %s", self.worker_id, exc)
            return
        logging.getLogger().setLevel(config["log_level"].upper())
        before = self.settings.tenants.declared
        try:
            self.settings = Settings.from_config(config)
        except (KeyError, TypeError, ValueError) as exc:  # the acceptor checked it: the file changed since
            log.error("worker %d keeps its settings: %s %s", self.worker_id, type(exc).__name__, exc)
        if self.settings.tenants.declared != before:
            self._close_ended_tenants()
        for name, held in list(self.limits.items()):  # live connections take their tenant's new limits
            declared = self.settings.tenants.declared.get(name)
            if declared is None:
                del self.limits[name]  # a removed tenant's connections keep the last ones
            else:
                held.apply(declared, self.settings)
        try:
            self._set_tls(config)
        except ValueError as exc:  # the acceptor checked it: the file changed since
            log.error("worker %d keeps its TLS settings: %s", self.worker_id, exc)
        self.auth.configure(config)
        self.judge_access()
        if self.archive is not None:
            self.archive.set_filters(config["archive"]["topics"])
            self.known_topics.clear()
        log.info("worker %d reloaded its settings", self.worker_id)

    def _close_ended_tenants(self) -> None:
        """A reload removed or disabled tenants: their clients go at once (connected 5.0 ones hear
        DISCONNECT 0x98 with the reason; those still connecting, e.g. waiting for the router's SESSION,
        are closed too), as new ones are refused; their sessions are the router's to keep or drop."""
        declared = self.settings.tenants.declared
        for conn in list(self.conns.values()):
            if conn.tenant and conn.state != CLOSED:
                tenant = declared.get(conn.tenant)
                if tenant is None or not tenant.enabled:
                    conn.close("tenant removed" if tenant is None else "tenant disabled",
                               code=reasons.ADMINISTRATIVE_ACTION)

    def _set_tls(self, config: dict) -> None:
        """The TLS context of the listeners, built again at a reload, so that the CRL (and the certificate
        files) are read again: new handshakes use it; live connections stay as they were accepted."""
        context = tls.server_context(config["tls"]) if tls.wanted(config) else None
        self.identity_as_username = context is not None and config["tls"]["use_identity_as_username"]
        self.tenant_field = tls.SUBJECT_FIELDS[config["tenant_certificate_field"]] if context is not None else ""
        self.listeners = [(context if scheme in ("mqtts", "wss") else None, scheme in ("ws", "wss"), tenant)
                          for scheme, tenant in config["listening"]]

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.poller.stopping = True
        # BYE, after everything else this worker sent and before its clients close (closed as kicked,
        # they tell the router nothing): a node's router, which lives on, publishes their wills now
        # rather than after link_timeout; this host's, stopping too, reads up to it and need not wait
        # for thousands of closes
        self.link.bye()
        self.link.send()
        clients = list(self.conns.values())
        for conn in clients:  # each said at DEBUG: 100,000 lines would hold a restart up for seconds
            conn.kicked = True
            conn.close("broker shutting down", logging.DEBUG, code=reasons.SERVER_SHUTTING_DOWN)
        log.info("closed %d clients: broker shutting down", len(clients))
        self.flush()
        self.link.close(linger_ms=BYE_LINGER_MS)
        if self.peers is not None:
            self.peers.close()
        self.auth.close()
        if self.archive is not None:
            self.archive.close()
        self.loop.stop()


def forked(worker_id: int, channel_fd: int, config_env: str, mask: set[int | signal.Signals]) -> NoReturn:
    """A worker forked from the acceptor, which had imported this module: it starts without an
    interpreter and imports of its own (0.3 s of CPU each, most of a restart's before its first CONNACK).
    Signals are blocked until the acceptor's handlers are undone; `mask` is the one to restore."""
    status = 70  # EX_SOFTWARE: it raised
    try:
        leave_parent(channel_fd, config_env)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        asyncio.events._set_running_loop(None)  # forked inside the acceptor's running loop: not this process's
        status = serve(worker_id, channel_fd)
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        log.exception("worker %d failed", worker_id)
    finally:
        logging.shutdown()
        os._exit(status)


def serve(worker_id: int, channel_fd: int) -> int:
    """Run worker `worker_id` on the acceptor channel `channel_fd` until it stops; its exit status."""
    config = child_config()
    fd_limit = become_child(config["parent_pid"], config["log_level"], config["log_format"], f"worker-{worker_id}")
    uvloop.install()
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    channel = socket.socket(fileno=channel_fd)
    channel.setblocking(False)
    worker = Worker(worker_id, config, loop, channel, fd_limit)
    loop.add_signal_handler(signal.SIGTERM, worker.stop)
    loop.add_signal_handler(signal.SIGHUP, worker.reload)
    if missed_reload(config):
        worker.reload()
    settle_heap()
    log.info("worker %d ready (pid %d, up to %d connections)", worker_id, os.getpid(), worker.max_conns)
    loop.run_forever()
    return worker.exit_status
