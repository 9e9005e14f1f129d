"""A worker's `Connection` (workers/connection.py) in-process, without sockets, ZeroMQ or an event loop.

A `HarnessWorker` is the real `Worker` (workers/worker.py) with a constructor of its own: no
acceptor channel, no ZeroMQ link, no password file; its settings are keyword arguments; its loop is a
`FakeLoop` whose `call_soon` callbacks (the worker's end-of-turn flush) run when the test calls
`turn()`. What it does with records from the router (`on_frame`), with PUBLISHes (`publish`, the
awaiting queue, ROUTED) and with the connection's deliveries is the worker's own code. Its link is a
`FakeLink`: the real `RouterLink`'s record senders, its sends kept as frames and decoded by `records()`
with plexmq/wire.py's record classes. What the router sends is built by the router's own senders
(`wire.ToWorker`: `session`, `routed`, `deliver` ... below).
Each client is a `FakeTransport` that keeps what the connection wrote and can be paused (as asyncio
pauses a protocol whose transport buffer is full).

    h = ConnectionHarness(max_inflight=2)
    c = h.client("dev", clean=False)         # CONNECT sent, the router's SESSION answered: CONNACK read
    c.send(v4.encode_publish(b"t", b"x", qos=1, packet_id=1))
    h.turn()                                 # the worker's flush: writes and the frame to the router
    assert [r.kind for r in h.records()] == ["PUB"]
    h.from_router(routed(1, 1))              # a ROUTED: now the PUBACK
    assert c.packets() == [Packet(PUBACK, 0, 1)]

The worker's settings are the broker's defaults (acceptor/config.py) as `Settings.from_config` reads
them, with the harness's keyword arguments replacing fields of that `Settings` value.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from plexmq import wire
from plexmq.acceptor import config as broker_config
from plexmq.bans import BanSet
from plexmq.mqtt import PROTOCOLS, v5
from plexmq.mqtt import v4 as p
from plexmq.workers.connection import Connection
from plexmq.workers.counters import Counters
from plexmq.workers.keepalive import TimerWheel
from plexmq.workers.link import RouterLink
from plexmq.workers.peers import AnyPeer, Peer, Peers
from plexmq.workers.routes import RouteTables
from plexmq.workers.settings import Settings
from plexmq.workers.topic_sample import SAMPLE, TopicSample
from plexmq.workers.worker import Worker

# -- the event loop, the transport, the link ---------------------------------------------------------


class FakeLoop:
    """What the worker and its connections ask of the loop: its clock (moved by the test),
    `call_soon` (run by `run_ready`), `call_later`/`call_at` (run by `advance`)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.ready: deque[tuple[Any, tuple]] = deque()
        self.timers: list[tuple[float, int, Any, tuple]] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self.now

    def call_soon(self, callback: Any, *args: Any) -> None:
        self.ready.append((callback, args))

    def call_at(self, when: float, callback: Any, *args: Any) -> None:
        heapq.heappush(self.timers, (when, next(self._order), callback, args))

    def call_later(self, delay: float, callback: Any, *args: Any) -> None:
        self.call_at(self.now + delay, callback, *args)

    def run_ready(self) -> None:
        for _ in range(1000):
            if not self.ready:
                return
            callback, args = self.ready.popleft()
            callback(*args)
        raise AssertionError("call_soon callbacks keep coming")

    def advance(self, seconds: float) -> None:
        """Move the clock and run the timers that fall due (then what they made ready)."""
        self.now += seconds
        while self.timers and self.timers[0][0] <= self.now:
            _when, _n, callback, args = heapq.heappop(self.timers)
            callback(*args)
        self.run_ready()


class FakeTransport:
    """A client socket: keeps what is written; reading and writing can be paused."""

    def __init__(self, peer: tuple[str, int] = ("127.0.0.1", 50000)) -> None:
        self.peer = peer
        self.written = bytearray()
        self.reading = True
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": self.peer}.get(name, default)

    def write(self, data: bytes) -> None:
        assert not self.closed, "a write after close"
        self.written += data

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


class FakeLink(RouterLink):
    """The worker's link without ZeroMQ: the real record senders (`pub`, `ack`, `connect`, `gone` ...,
    into `batch`), each `send` kept in `frames`."""

    def __init__(self, loop: FakeLoop) -> None:  # not RouterLink's: it opens a ZeroMQ socket
        self.loop = loop  # type: ignore[assignment]  # the fake loop in the real one's place
        self.batch = wire.Batch()
        self.unrouted = 0
        self.batched = 0
        self.join = 0
        self.seq = 0
        self.next_in = 0
        self.current = True
        self.this_join = True
        self.answered = True
        self.opened_at = 0.0
        self.warned = False
        self.endpoint = "fake://router"
        self.frames: list[bytes] = []

    def send(self) -> None:
        if self.batch:
            self.frames.append(self.batch.take())
            self.seq += 1
            self.batched = 0

    def close(self, linger_ms: int = 0) -> None:
        pass


class FakePeers(Peers):
    """The worker's direct links to its peers without sockets: the real record senders (`raw`, `message`,
    into each peer's batch) and bookkeeping of what is unconfirmed; each `send` kept in `frames` as
    (place, frame); `answer` is a peer's answer to all it was sent."""

    def __init__(self, loop: FakeLoop, identity: bytes, on_answer: Callable[[], None]) -> None:  # no sockets
        self.loop = loop  # type: ignore[assignment]  # the fake loop in the real one's place
        self.identity = identity
        self.own = identity.decode()
        self.node = ""
        self.on_answer = on_answer
        self.direct = ""
        self.endpoints = {}
        self.shunned = {}
        self.peers = {}
        self.heads = {}
        self.pending = []
        self.unconfirmed = 0
        self.seq = 0
        self.frames: list[tuple[str, bytes]] = []

    def _peer(self, place: str) -> AnyPeer:
        peer = self.peers.get(place)
        if peer is None:
            kept = self.peers[place] = Peer.__new__(Peer)
            kept.batch, kept.sent, kept.answered, kept.since = wire.Batch(), 0, 0, 0.0
            kept.sock = _Kept(self.frames, place)  # keeps what a DEALER would send
            return kept
        return peer

    def answer(self, place: str) -> None:
        """`place` has delivered every frame it was sent."""
        peer = self.peers[place]
        self._answered(peer, peer.sent)


class _Kept:
    """A peer's socket that keeps each frame sent."""

    def __init__(self, frames: list[tuple[str, bytes]], place: str) -> None:
        self.frames, self.place = frames, place

    def send_multipart(self, parts: tuple, copy: bool = True) -> None:
        self.frames.append((self.place, bytes(parts[1])))

    def getsockopt(self, option: int) -> int:
        return 0  # EVENTS: no answer comes on its own (the test gives them: `FakePeers.answer`)


class FakeAuth:
    """No password file, no ACL: every login is accepted, nobody is screened."""

    required = False
    passwords = None
    tokens = None
    local = local_acl = False

    def __init__(self) -> None:
        self.denied = 0
        self.refused = 0

    def checker(self, username: str | None, client_id: str) -> None:
        return None

    def of(self, name: str) -> FakeAuth:
        return self

    def rules_changed(self) -> bool:
        return False

    def close(self) -> None:
        pass


# -- the worker ------------------------------------------------------------------------------------------

def settings(**overrides: Any) -> Settings:
    """The worker's settings as a broker's default config gives them, the fields named in `overrides`
    replaced (a name that is not a field of `Settings` is a TypeError)."""
    return dataclasses.replace(Settings.from_config(broker_config.defaults()), **overrides)


class HarnessWorker(Worker):
    """The real worker's code around fakes: its settings the defaults', any field overridden by keyword."""

    def __init__(self, *, direct: bool = False, **overrides: Any) -> None:  # not Worker's: no channel, link, auth
        """`direct`: its peers are `FakePeers` (the other workers of its host it delivers QoS 0 to)."""
        self.settings = settings(**overrides)
        self.counters = Counters()
        self.limits = {}
        self.identity_as_username = False
        self.tenant_field = ""
        self.worker_id = 0
        loop = FakeLoop()
        self.loop = loop  # type: ignore[assignment]  # the fake loop in the real one's place
        self.node = ""
        self.identity = wire.identity("", 0)
        self.label = wire.label("", 0)
        self.conns: dict[int, Connection] = {}
        self.ending = []
        self.next_conn = 1
        self.dirty = []
        self.connected = dict.fromkeys(PROTOCOLS, 0)
        self.queuing = set()
        self.flush_pending = False
        self.awaiting = deque()
        self.routes = RouteTables(self.identity, direct)
        self.unanswered = 0
        self.shedding = False
        self.shed = 0
        self.topics = TopicSample()
        self.sample_in = SAMPLE
        self.watching = {}
        self.bans = BanSet()
        self.wheel = TimerWheel(self.loop.time())
        self.link = FakeLink(loop)
        self.direct = ""
        self.peers = FakePeers(loop, self.identity, self.answered) if direct else None
        self.peer_acks = deque()
        self.routes_acks = deque()
        self.auth = FakeAuth()  # type: ignore[assignment]  # no logins, no ACL: the unit tests are about flow
        self.known_topics = {}
        self.turn_us = 0
        self.archive = None
        self.received = 0
        self.stopped = False
        self.exit_status = 0

    def _report_load(self) -> None:
        pass  # no acceptor to tell


# -- what the connection writes and sends, decoded ----------------------------------------------------------


class Packet(NamedTuple):
    """A packet written to the client: its type, its flags (a PUBLISH's: dup << 3 | qos << 1 | retain),
    its packet id (0: none), and for a PUBLISH its topic and payload (and a 5.0 one's properties);
    `body`: the rest, undecoded."""
    kind: int
    flags: int
    pid: int = 0
    topic: str = ""
    payload: bytes = b""
    body: bytes = b""
    props: dict | None = None

    @property
    def qos(self) -> int:
        return (self.flags >> 1) & 3

    @property
    def dup(self) -> bool:
        return bool(self.flags & 8)


_WITH_PID = (p.PUBACK, p.PUBREC, p.PUBREL, p.PUBCOMP, p.SUBACK, p.UNSUBACK)


def parse(data: bytes, v5_client: bool = False) -> list[Packet]:
    """The packets in `data`, as `Packet`s (PUBLISH read as 3.1.1 or, with `v5_client`, 5.0 reads it)."""
    packets = []
    pos = 0
    while pos < len(data):
        found = p.frame(data, pos, 1 << 28)
        assert found is not None, f"a partial packet written: {data[pos:]!r}"
        first, start, stop = found
        kind, flags, body = first >> 4, first & 15, bytes(data[start:stop])
        if kind == p.PUBLISH:
            props = None
            if v5_client:
                topic, pid, payload, props = v5.decode_publish(flags, body, from_server=True)
            else:
                topic, pid, payload = p.decode_publish(flags, body)
            packets.append(Packet(kind, flags, pid, topic, bytes(payload), props=props))
        elif kind in _WITH_PID:
            packets.append(Packet(kind, flags, int.from_bytes(body[:2], "big"), body=body[2:]))
        else:
            packets.append(Packet(kind, flags, body=body))
        pos = stop
    return packets


class Record(NamedTuple):
    """A record the worker sent to the router: its kind's name and its fields, decoded."""
    kind: str
    fields: tuple
    payload: bytes = b""


def _pub(header: bytes) -> tuple:
    """PUB as (conn, packet id, qos, retain, topic)."""
    conn, pid, flags = wire.unpack_pub(header)
    start = wire.PUB_HEAD.size
    if flags & wire.HAS_EXTRA:
        _props, _expiry, start = wire.read_extra(header, start)
    return conn, pid, flags & 3, bool(flags & 4), header[start:].decode()


def _pub0(header: bytes) -> tuple:
    """PUB0 as (count, conn, topic)."""
    return *wire.unpack_pub0(header), header[wire.PUB0_HEAD.size:].decode()


# every record a worker sends: its name, and how its header is read (the record classes of
# plexmq/wire.py, the hot records' unpack functions)
_DECODERS: dict[int, tuple[str, Callable[[bytes], tuple]]] = {
    wire.HELLO: ("HELLO", wire.Hello.decode),
    wire.CONNECT: ("CONNECT", wire.Connect.decode),
    wire.SUBSCRIBE: ("SUBSCRIBE", wire.Subscribe.decode),
    wire.UNSUBSCRIBE: ("UNSUBSCRIBE", wire.Unsubscribe.decode),
    wire.PUB: ("PUB", _pub),
    wire.ACK: ("ACK", wire.unpack_ack),
    wire.REL: ("REL", wire.Rel.decode),
    wire.GONE: ("GONE", wire.Gone.decode),
    wire.PUB0: ("PUB0", _pub0),
    wire.STATS: ("STATS", wire.Stats.decode),
    wire.CLIENTS: ("CLIENTS", wire.Clients.decode),
    wire.SESSION_EXPIRY: ("SESSION_EXPIRY", wire.SessionExpiry.decode),
    wire.PUB0_V5: ("PUB0_V5", _pub0),
    wire.ROUTES_ACK: ("ROUTES_ACK", wire.RoutesAck.decode),
    wire.BYE: ("BYE", lambda header: ()),
    wire.KICKED: ("KICKED", wire.Kicked.decode),
    wire.TRACES_ACK: ("TRACES_ACK", wire.TracesAck.decode),
    wire.TRACED: ("TRACED", wire.Traced.decode),
}


def decode_records(frame: bytes) -> list[Record]:
    """Records from a worker's frame: PUB as (conn, packet id, qos, retain, topic), ACK as (conn, packet
    id, stage), PUB0 as (count, conn, topic), BYE as (); the others as their plexmq/wire.py record (a
    NamedTuple: it compares equal to the tuple of its fields)."""
    records = []
    for kind, header, payload in wire.records(frame):
        assert kind in _DECODERS, f"not a record a worker sends: {kind}"
        name, decode = _DECODERS[kind]
        records.append(Record(name, decode(header), payload))
    return records


# -- what the router would send: each one of the router's own senders (`wire.ToWorker`) ---------------------

FromRouter = Callable[[wire.ToWorker], None]


def session(conn: int, present: bool = False, subs: list | None = None) -> FromRouter:
    return lambda out: out.session(conn, present, subs or [])


def suback(conn: int, pid: int, codes: list[int], local: list | None = None) -> FromRouter:
    return lambda out: out.suback(conn, pid, codes, local or [])


def routed(pubs: int, records: int | None = None, unmatched: tuple[int, ...] = ()) -> FromRouter:
    return lambda out: out.routed([pubs, pubs if records is None else records, *unmatched])


def deliver(topic: bytes, payload: bytes, qos: int, subs: list[tuple[int, int, int]], retain: bool = False,
            dup: bool = False) -> FromRouter:
    """A DELIVER to `subs`: (conn, granted QoS, packet id: 0 when the worker numbers it)."""
    head = wire.deliver_head(topic, qos, retain, dup, b"", 0)
    return lambda out: out.deliver(head, b"".join(wire.pack_subscriber(*sub) for sub in subs), payload)


def resend_rel(conn: int, pid: int) -> FromRouter:
    return lambda out: out.resend_rel(conn, pid)


def kick(conn: int) -> FromRouter:
    return lambda out: out.kick(conn)


def traces(gen: int, entries: list[list]) -> FromRouter:
    """TRACES: [trace id, tenant, filter] entries, as router/trace.py sends them."""
    return lambda out: out.traces(gen, entries)


def routes(gen: int, whole: bool, entries: list[list]) -> FromRouter:
    """ROUTES: [tenant, filter, [places]] entries, as router/routes.py sends them."""
    return lambda out: out.add(wire.ROUTES, wire.Routes(gen, whole, entries).encode())


# -- the harness ---------------------------------------------------------------------------------------------


class Client:
    """One client's end: what it sends (`send`) and what the connection wrote to it (`packets`)."""

    def __init__(self, harness: ConnectionHarness, conn: Connection, transport: FakeTransport) -> None:
        self.harness = harness
        self.conn = conn
        self.transport = transport
        self.v5 = False

    @property
    def conn_id(self) -> int:
        return self.conn.conn_id

    def send(self, data: bytes) -> None:
        """Bytes from the client (one read), then the end of the worker's turn."""
        self.conn.data_received(data)
        self.harness.turn()

    def packets(self) -> list[Packet]:
        """The packets written since the last call."""
        data = bytes(self.transport.written)
        self.transport.written.clear()
        return parse(data, self.v5)

    def pause_writing(self) -> None:
        """The transport's buffer is full (asyncio calls this)."""
        self.conn.pause_writing()

    def resume_writing(self) -> None:
        self.conn.resume_writing()
        self.harness.turn()


class ConnectionHarness:
    """A `HarnessWorker` (settings by keyword) and the clients connected to it."""

    def __init__(self, *, direct: bool = False, **settings: Any) -> None:
        self.worker = HarnessWorker(direct=direct, **settings)
        loop, link = self.worker.loop, self.worker.link
        assert isinstance(loop, FakeLoop) and isinstance(link, FakeLink)
        self.loop: FakeLoop = loop
        self.link: FakeLink = link
        self.taken: int = 0  # frames of the link already read by `records`

    def open(self, listener_tenant: str = "") -> Client:
        """A new connection, as `Worker.adopt` makes one (its socket accepted on a listener of
        `listener_tenant`, "": one of the broker's own; nothing read yet)."""
        worker = self.worker
        conn_id = worker.next_conn
        worker.next_conn += 1
        conn = Connection(worker, conn_id, self.loop.time() + worker.settings.connect_timeout)
        conn.tenant = listener_tenant
        worker.conns[conn_id] = conn
        worker.wheel.add(conn)
        transport = FakeTransport(("127.0.0.1", 50000 + conn_id))
        conn.connection_made(transport)  # type: ignore[arg-type]  # the fake transport records what is written
        return Client(self, conn, transport)

    def client(self, client_id: str, clean: bool = True, *, version: int = 4, present: bool = False,
               properties: dict | None = None, username: str | None = None, listener_tenant: str = "") -> Client:
        """A connected client: CONNECT read; for a session the router must answer (persistent, or 5.0
        with a session expiry), its SESSION is sent (session present: `present`); the CONNACK is read
        and the link's records taken."""
        client = self.open(listener_tenant)
        client.v5 = version == 5
        if version == 5:
            client.send(v5.encode_connect(client_id, clean, 60, username=username, protocol_level=5, properties=properties))
        else:
            client.send(p.encode_connect(client_id, clean, 60, username=username, protocol_level=version))
        if not client.packets():
            self.from_router(session(client.conn_id, present))
            [connack] = client.packets()
            assert connack.kind == p.CONNACK, connack
        self.records()
        return client

    def turn(self) -> None:
        """The end of the worker's loop turn: its flush (each connection's writes, one frame to the
        router), and what else was called soon."""
        self.loop.run_ready()

    def from_router(self, *records: FromRouter) -> None:
        """A frame from the router with these records (`session`, `routed`, `deliver` ... above, each
        added by the router's sender), then the end of the worker's turn."""
        out = wire.ToWorker()
        for add in records:
            add(out)
        self.worker.on_frame(out.take())
        self.turn()

    def records(self) -> list[Record]:
        """The records the worker sent to the router since the last call (STATS left out)."""
        frames = self.link.frames[self.taken:]
        self.taken += len(frames)
        return [r for frame in frames for r in decode_records(frame) if r.kind != "STATS"]
