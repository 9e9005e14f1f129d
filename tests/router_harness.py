"""The router core in-process, without sockets: workers played by the test, what the router sends
back decoded into readable records.

`Router` (router/core.py) never touches a socket: router/main.py takes each frame a worker sends
(`links.accept` on its tag, then `handle_frame`), and at the end of every loop turn `take_frames`
its answers, sends what may leave now, commits the store, then sends what waits for the commit.
`RouterHarness.turn()` is that end of a turn; every send is kept in `sent`, with whether the store
had uncommitted changes at that moment, so a test can check that an acknowledgement never leaves
before what it acknowledges is on disk.

    h = RouterHarness(tmp_path)               # tmp_path: with a Store (persistence); None: without
    w0 = h.worker("w0")                       # joined: HELLO sent (seq 0)
    w0.connect(1, "client", clean=False)      # each call is one frame the router takes at once
    h.turn()                                  # the turn's frames go out (and the store commits)
    assert w0.take() == [wire.Session(1, False, [])]

A worker's records are sent by the worker's own senders (`RouterLink`, here the ZeroMQ-less
`FakeLink` of tests/connection_harness.py); `decode` reads the router's with plexmq/wire.py's record
classes (`wire.Session`, `wire.Kick` ...: NamedTuples, equal to the tuple of their fields) and, for
the hot records without a class (DELIVER, DELIVER_RAW, ROUTED), with its unpack functions into the
`Deliver`, `DeliverRaw` and `Routed` below.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import zmq

from plexmq import wire
from plexmq.mqtt import v4
from plexmq.router.core import Router
from plexmq.router.store.postgres import PgStore
from plexmq.router.store.sqlite import SqliteStore
from plexmq.wire import Close, Kick, ListClients, Refused, Rejoin, ResendRel, Routes, Session, Suback, Traces, Unsuback
from tests.connection_harness import FakeLink, FakeLoop

# -- what the router sends, decoded ---------------------------------------------------------------


class Sub(NamedTuple):
    """One subscriber of a DELIVER: its connection, the QoS it gets, the packet id the router gave
    it (0: its worker numbers it)."""
    conn: int
    qos: int
    pid: int


class Deliver(NamedTuple):
    topic: bytes
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    subs: tuple[Sub, ...]
    props: bytes = b""
    expiry: int = 0


class DeliverRaw(NamedTuple):
    subs: tuple[Sub, ...]
    packets: bytes
    v5: bool
    messages: int  # packets in `packets`


class Routed(NamedTuple):
    """ROUTED: this many of the worker's QoS 1/2 PUBs may be acknowledged (of `records` PUB and PUB0
    records), `unmatched` the positions among those PUBs that matched nobody (and asked)."""
    pubs: int
    records: int
    unmatched: tuple[int, ...] = ()


class Other(NamedTuple):
    """A record the harness does not read further (BEAT, LIST_CLIENTS ...)."""
    kind: int
    header: bytes
    payload: bytes


def _subs(data: bytes) -> tuple[Sub, ...]:
    return tuple(Sub(*sub) for sub in wire.iter_subscribers(data))


def _deliver_raw(header: bytes, payload: bytes, v5: bool) -> DeliverRaw:
    return DeliverRaw(_subs(header[wire.COUNT.size:]), payload, v5, wire.COUNT.unpack_from(header)[0])


def _deliver(header: bytes, payload: bytes) -> Deliver:
    flags, topic_len = wire.unpack_deliver(header)
    start = wire.DELIVER_HEAD.size + topic_len
    topic = header[wire.DELIVER_HEAD.size:start]
    props, expiry = b"", 0
    if flags & wire.HAS_EXTRA:
        props, expiry, start = wire.read_extra(header, start)
    return Deliver(topic, payload, flags & 3, bool(flags & 4), bool(flags & 8), _subs(header[start:]), props, expiry)


# the router's records: how each is read (kind -> (header, payload) -> record); BEAT and what is
# not here become `Other`
_DECODERS: dict[int, Callable[[bytes, bytes], Any]] = {
    wire.SESSION: lambda header, _: Session.decode(header),
    wire.SUBACK: lambda header, _: Suback.decode(header),
    wire.UNSUBACK: lambda header, _: Unsuback.decode(header),
    wire.DELIVER: _deliver,
    wire.DELIVER_RAW: lambda header, payload: _deliver_raw(header, payload, False),
    wire.DELIVER_RAW_V5: lambda header, payload: _deliver_raw(header, payload, True),
    wire.ROUTED: lambda header, _: Routed(*wire.read_routed(header)),
    wire.RESEND_REL: lambda header, _: ResendRel.decode(header),
    wire.KICK: lambda header, _: Kick.decode(header),
    wire.LIST_CLIENTS: lambda header, _: ListClients.decode(header),
    wire.CLOSE: lambda header, _: Close.decode(header),
    wire.ROUTES: lambda header, _: Routes.decode(header),
    wire.SYNC: lambda header, _: wire.Sync.decode(header),
    wire.REJOIN: lambda header, _: Rejoin.decode(header),
    wire.REFUSED: lambda header, _: Refused.decode(header),
    wire.TRACES: lambda header, _: Traces.decode(header),
}


def decode(frame: bytes) -> list[Any]:
    """The records of a frame from the router: plexmq/wire.py's record classes, `Deliver`,
    `DeliverRaw`, `Routed`, or `Other`."""
    records: list[Any] = []
    for kind, header, payload in wire.records(frame):
        read = _DECODERS.get(kind)
        records.append(read(header, payload) if read is not None else Other(kind, header, payload))
    return records


class Sent(NamedTuple):
    """One frame the router sent: to whom, its records, and whether the store had changes not yet
    committed when it left (False without a store)."""
    worker: bytes
    records: list[Any]
    uncommitted: bool


# -- the harness ------------------------------------------------------------------------------------


class RouterHarness:
    """A `Router` (with a `Store` in `tmp_path/data` when `tmp_path` is given) and the workers that
    talk to it."""

    def __init__(self, tmp_path: Path | None = None, *, max_inflight: int = 10, max_queued: int = 100,
                 max_queued_bytes: int = 0, expiration: float = 0.0, share_strategy: str = "round_robin",
                 link_timeout: float = 5.0, store: PgStore | None = None) -> None:
        """`store`: a PostgreSQL store instead of tmp_path's SQLite one."""
        self.tmp_path = tmp_path
        self.settings = (max_inflight, max_queued, max_queued_bytes)
        self.store: SqliteStore | PgStore | None = store
        if store is None and tmp_path is not None:
            self.store = SqliteStore(str(tmp_path / "data"), "normal")
        self.router = Router(max_inflight, max_queued, max_queued_bytes, self.store, expiration, share_strategy,
                             link_timeout)
        self.workers: dict[bytes, WorkerEnd] = {}
        self.sent: list[Sent] = []  # every frame sent, in order; `commits` counts the commits between
        self.commits = 0

    def worker(self, name: str = "w0", live: tuple[int, ...] = (), hello: bool = True, node: str = "") -> WorkerEnd:
        """A worker joined to the router (HELLO sent unless `hello` is False), of `node` ("": the router's host)."""
        end = self.workers[name.encode()] = WorkerEnd(self, name.encode(), len(self.workers), node)
        if hello:
            end.hello(live)
        return end

    def take(self, end: WorkerEnd, tag: bytes, frame: bytes) -> None:
        """A frame from a worker, as router/main.py takes it."""
        if self.router.links.accept(end.identity, tag):
            self.router.handle_frame(end.identity, frame)

    def turn(self) -> list[Sent]:
        """The end of a loop turn, as router/main.py ends it (`one_turn`); then, while workers got a
        change of the route table or a SYNC, they answer it (ROUTES_ACK, SYNCED, as a worker does) and
        another turn ends, so that what waited for them (a SUBACK that placed a filter, a CONNECT that
        resumes a session) leaves too. The frames sent, in order."""
        sent = self.one_turn()
        for _ in range(10):
            answering = [end for end in self.workers.values() if end.routes_seen or end.syncs_seen]
            if not answering:
                return sent
            for end in answering:
                for generation in end.routes_seen:
                    end.routes_ack(generation)
                for number in end.syncs_seen:
                    end.synced(number)
                end.routes_seen, end.syncs_seen = [], []
            sent += self.one_turn()
        raise AssertionError("the route table does not settle")

    def one_turn(self) -> list[Sent]:
        """The end of one loop turn, as router/main.py ends it: what may leave now, the commit, then
        what waited for the commit. The frames sent, in order."""
        router, store = self.router, self.store
        for worker, join in router.links.rejoins:
            router.out(worker).rejoin(join)
        router.links.rejoins.clear()
        for worker in router.links.gaps:
            router.link_broken(worker)
        router.links.gaps.clear()
        durable = store is not None and bool(store.ops)
        frames = router.take_frames(split=durable)
        sent = [self._send(worker, now) for worker, now, _ in frames]
        if durable and store is not None:
            store.commit()
            self.commits += 1
        sent += [self._send(worker, later) for worker, _, later in frames]
        return [s for s in sent if s is not None]

    def _send(self, worker: bytes, frame: bytes) -> Sent | None:
        if not frame:
            return None
        self.router.links.tag(worker)  # numbered as main.py's send numbers it
        sent = Sent(worker, decode(frame), self.store is not None and bool(self.store.ops))
        self.sent.append(sent)
        end = self.workers.get(worker)
        if end is not None:
            end.inbox.extend(sent.records)
            if end.answers_routes:
                end.routes_seen += [r.gen for r in sent.records if isinstance(r, Routes)]
            if end.answers_syncs:
                end.syncs_seen += [r.number for r in sent.records if isinstance(r, wire.Sync)]
        return sent

    def restart(self) -> RouterHarness:
        """A new router from this one's store (committed first, then closed): a router restart.
        The workers have to join again (`worker(...)`)."""
        assert self.store is not None and self.tmp_path is not None, "a restart needs a store"
        self.store.close()
        max_inflight, max_queued, max_bytes = self.settings
        return RouterHarness(self.tmp_path, max_inflight=max_inflight, max_queued=max_queued,
                             max_queued_bytes=max_bytes, expiration=self.router.expiration,
                             share_strategy=self.router.share_strategy, link_timeout=self.router.links.timeout)

    def stored_messages(self, client_id: str, tenant: str = "") -> list[tuple[int, bytes, bytes, int, int]]:
        """(packet id, topic, payload, qos, state) of the client's messages the store has committed,
        in the order kept."""
        assert self.store is not None
        rows = self.store.db.execute("SELECT packet_id, topic, payload, qos, state FROM messages WHERE tenant = ? AND "
                                     "client_id = ? ORDER BY seq", (tenant, client_id))
        return [(pid, bytes(topic), bytes(payload), qos, state) for pid, topic, payload, qos, state in rows]


class WorkerEnd:
    """One worker as the router sees it: each method sends one record in one frame, through the
    worker's own sender for it (`RouterLink`), which the router takes at once; `inbox` collects what
    the router sent it (`take` empties it)."""

    def __init__(self, harness: RouterHarness, identity: bytes, worker_id: int, node: str = "") -> None:
        self.harness = harness
        self.identity = identity
        self.worker_id = worker_id
        self.node = node  # its node's name ("": the router's host)
        self.link = FakeLink(FakeLoop())  # its `join` and `seq` tag the frames
        self.inbox: list[Any] = []
        self.answers_routes = True  # answer ROUTES with ROUTES_ACK at the end of each turn
        self.routes_seen: list[int] = []
        self.answers_syncs = True  # answer SYNC with SYNCED at the end of each turn
        self.syncs_seen: list[int] = []
        self.via: zmq.Socket | None = None  # a DEALER: frames go through it instead of straight to the router

    # -- what the router sent

    def take(self, everything: bool = False) -> list[Any]:
        """The records received since the last take, without the route table's (ROUTES), SYNCs and
        heartbeats unless `everything`."""
        records, self.inbox = self.inbox, []
        if everything:
            return records
        return [r for r in records if not isinstance(r, (Routes, wire.Sync, Other))]

    def delivered(self, conn: int) -> list[tuple[bytes, bytes, int, bool, int]]:
        """(topic, payload, qos, dup, packet id) of each DELIVER to `conn` in the inbox, taken out of it
        with everything else."""
        return [(r.topic, r.payload, sub.qos, r.dup, sub.pid) for r in self.take() if isinstance(r, Deliver)
                for sub in r.subs if sub.conn == conn]

    # -- what the worker sends

    def send(self) -> None:
        """What the link's senders batched, as one frame, tagged as `RouterLink.send` tags it."""
        link = self.link
        tag = wire.LINK.pack(link.join, link.seq)
        link.send()
        if self.via is not None:
            self.via.send_multipart((tag, link.frames.pop()))
        else:
            self.harness.take(self, tag, link.frames.pop())

    def hello(self, live: tuple[int, ...] = (), pid: int = 4242) -> None:
        """Open a new join (seq 0), naming the connections still live."""
        self.link.open(wire.Hello(wire.PROTOCOL, self.worker_id, self.node, "", pid, list(live)))
        self.send()

    def connect(self, conn: int, client_id: str, clean: bool = True, *, connack_sent: int = 0, fresh: bool | None = None,
                expiry: int = -1, username: str | None = None, will: tuple[str, bytes, int, bool] | None = None,
                will_extra: list | None = None, tenant: str = "", window: int = 0, claimed: int = 0) -> None:
        """CONNECT of a client that asked for a clean session or not: `connack_sent` 0 asks for a SESSION;
        else the worker sent the CONNACK itself (a new clean session's connection, or one registered
        again) and `connack_sent` is its next packet id. `fresh` (default: `clean`): an earlier session
        is discarded. `will`: (topic, payload, qos, retain). `tenant`: the connection's ("": the default).
        `window`: the connection's (0: max_inflight). `claimed`: when it claimed the client id (0: not known)."""
        topic, payload, qos, retain = will if will is not None else (None, b"", 0, False)
        self.link.connect(wire.Connect(conn, client_id, not clean, username, topic, qos, retain, connack_sent,
                                       clean if fresh is None else fresh, expiry, will_extra, tenant, window, claimed),
                          payload)
        self.send()

    def subscribe(self, conn: int, pid: int, filters: list[tuple[str, int]]) -> None:
        """SUBSCRIBE: (filter, grant) pairs (a plain 3.1.1 grant is its QoS; plexmq/grants.py)."""
        self.link.subscribe(conn, pid, [list(f) for f in filters])
        self.send()

    def unsubscribe(self, conn: int, pid: int, filters: list[str]) -> None:
        self.link.unsubscribe(conn, pid, filters)
        self.send()

    def pub(self, conn: int, topic: str, payload: bytes, qos: int = 0, retain: bool = False, pid: int = 0,
            ask_match: bool = False) -> None:
        """PUB: one message of `conn` (QoS 1/2: with its packet id)."""
        self.link.pub(conn, pid, qos, retain, topic.encode(), payload, ask_match=ask_match)
        self.send()

    def pub0(self, conn: int, topic: str, payloads: list[bytes]) -> None:
        """PUB0: a run of plain QoS 0 PUBLISH packets (3.1.1) of `conn` to one topic."""
        packets = b"".join(v4.encode_publish(topic.encode(), payload) for payload in payloads)
        self.link.pub0(conn, topic.encode(), len(payloads), packets)
        self.send()

    def ack(self, conn: int, pid: int, stage: int = wire.ACK_DONE) -> None:
        """ACK: PUBACK/PUBCOMP (ACK_DONE) or PUBREC (ACK_RECEIVED) of a router-numbered delivery."""
        self.link.ack(conn, pid, stage)
        self.send()

    def rel(self, conn: int, pid: int) -> None:
        self.link.rel(conn, pid)
        self.send()

    def gone(self, conn: int, publish_will: bool = True) -> None:
        self.link.gone(conn, publish_will)
        self.send()

    def kicked(self, conn: int) -> None:
        self.link.kicked(conn)
        self.send()

    def session_expiry(self, conn: int, expiry: int) -> None:
        self.link.session_expiry(conn, expiry)
        self.send()

    def routes_ack(self, generation: int) -> None:
        self.link.routes_ack(generation)
        self.send()

    def synced(self, number: int) -> None:
        self.link.synced(number)
        self.send()

    def bye(self) -> None:
        self.link.bye()
        self.send()

    def traces_ack(self, generation: int) -> None:
        self.link.traces_ack(generation)
        self.send()

    def traced(self, trace: int, topic: str, payload: bytes, qos: int = 0, retain: bool = False, client: str = "",
               at: float = 0.0) -> None:
        """TRACED: a copy of a message for `trace`, as a worker's trace_watch sends it."""
        self.link.traced(trace, topic.encode(), qos, retain, payload, client, at)
        self.send()


def routed_of(records: list[Any]) -> Routed | None:
    """The ROUTED among `records` (None: none)."""
    found = [r for r in records if isinstance(r, Routed)]
    assert len(found) <= 1, found
    return found[0] if found else None

