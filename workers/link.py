"""The worker's ZeroMQ link to the router: a DEALER whose records are batched per loop turn, each
batch tagged with the join it belongs to and its number in it (router/links.py)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import zmq

from plexmq import curve, wire

_pack_pub = wire.pack_pub
_pack_ack = wire.pack_ack
_pack_run = wire.pack_pub0
_pack_link = wire.LINK.pack
_unpack_link = wire.LINK.unpack
# plain ints: pyzmq's flag enums build a new enum object on every `&`, twice per loop turn here
_EVENTS, _POLLIN, _NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)
JOIN_GRACE = 1.0  # seconds a join may go unanswered before the worker takes itself for one without a router
# seconds without a frame (the router BEATs every second) before the router is taken for gone: the
# router's own default link_timeout, after which it takes a silent worker for dead
ROUTER_SILENCE = 5.0


def local_address(endpoint: str) -> str:
    """The address this host reaches a tcp:// router from (what the router's listings show for a
    node); "" for the local ipc:// link. A UDP connect sends nothing: it only picks the route."""
    if not endpoint.startswith("tcp://"):
        return ""
    host, _, port = endpoint[len("tcp://"):].rpartition(":")
    host = host.strip("[]")
    try:
        family = socket.getaddrinfo(host, int(port), type=socket.SOCK_DGRAM)[0][0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, int(port)))
            return probe.getsockname()[0]
    except OSError:
        return ""


class RouterLink:
    """Collects the records of one loop turn in `batch`; `send()` ships them as one frame. Each record
    a worker sends has its sender here (plexmq/wire.py defines them)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, endpoints: list[str], identity: bytes,
                 on_frame: Callable[[bytes], None], on_gap: Callable[[], None],
                 keys: dict[str, str] | None = None) -> None:
        """`endpoints`: the routers that may be active, connected one at a time, the first first
        (workers/follow.py moves on). `keys`: the CURVE keys of a tcp:// link (router_bind), which the
        acceptor hands its children. `on_gap`: called after a frame when frames from the router went
        missing before it."""
        self.loop = loop
        self.on_frame = on_frame
        self.on_gap = on_gap
        self.ctx = zmq.Context(io_threads=1)
        sock = self.sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, identity)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.LINGER, 0)  # at shutdown the router is stopping too: nothing to wait for
        if keys:
            curve.client(sock, keys)
        sock.connect(endpoints[0])
        self.batch = wire.Batch()
        self.unrouted = 0  # PUB and PUB0 records the router has not yet confirmed (ROUTED)
        self.batched = 0  # PUB and PUB0 records in `batch` (Worker.flush: they may wait for the peers)
        self.join = 0  # this worker's joins with the router: each starts with HELLO
        self.seq = 0  # frames sent in this join
        self.next_in = 0  # the router's next frame in this join
        self.this_join = False  # whether the frame being handled is tagged with this join
        self.current = False  # whether it answers this join, none lost before it (else its ROUTED is stale)
        self.answered = False  # whether the router has answered this join (accepted its HELLO)
        self.opened_at = 0.0  # loop.time() of this join's HELLO
        self.warned = False  # whether the worker has said that this join goes unanswered
        self.endpoints = endpoints
        self.endpoint = endpoints[0]  # the one connected
        self.heard_at = loop.time()  # when the last frame came from it (or when it was connected)
        self.standby = False  # whether it answered this join with STANDBY
        self.fd: int = sock.getsockopt(zmq.FD)  # type: ignore[assignment]  # an int option (stubs: int | bytes)
        loop.add_reader(self.fd, self.drain)

    def open(self, hello: wire.Hello) -> None:
        """Start a new join, led by HELLO. What is batched is dropped with the old join (its PUBs
        would be routed twice: the caller sends again what it still needs confirmed), as the router
        drops what it refused of it (docs/architecture.md §3 says what that costs)."""
        self.batch.take()
        self.join += 1
        self.seq = self.next_in = self.unrouted = self.batched = 0
        self.answered = self.warned = self.standby = False
        self.opened_at = self.loop.time()
        self.batch.add(wire.HELLO, hello.encode())

    def missing(self, now: float) -> str:
        """Why no router serves this link now, '' when one does: its join unanswered for JOIN_GRACE (the
        router down or unreachable, or this node's keys not the router's), a standby's answer, or
        ROUTER_SILENCE without a frame. A CONNECT is refused meanwhile (`handlers.connect`): a clean
        session's CONNACK would go out, and then nothing it sends would be answered."""
        if self.standby:
            return f"the router at {self.endpoint} is a standby"
        if not self.answered:
            return f"no answer from the router at {self.endpoint}" if now - self.opened_at >= JOIN_GRACE else ""
        if now - self.heard_at >= ROUTER_SILENCE:
            return f"the router at {self.endpoint} is silent"
        return ""

    def drain(self) -> None:
        """Handle every frame that has arrived (the ZeroMQ fd is edge-triggered: until EVENTS says
        nothing is left)."""
        sock = self.sock
        while sock.getsockopt(_EVENTS) & _POLLIN:  # type: ignore[operator]  # an int option (stubs: int | bytes)
            parts = sock.recv_multipart(_NOBLOCK, copy=True)
            join, seq = _unpack_link(parts[0])
            self.heard_at = self.loop.time()
            gap = False
            this_join = self.this_join = join == self.join
            if this_join:
                gap = seq != self.next_in
                self.next_in = seq + 1
                self.answered = True
            self.current = this_join and not gap
            self.on_frame(parts[1])
            if gap and join == self.join:  # else a handler opened a new join (workers/follow.py moved on)
                self.on_gap()

    def follow(self, endpoint: str) -> None:
        """Leave the router connected for `endpoint` (what is queued for it is dropped); the caller
        opens a new join there (Worker.rejoin)."""
        self.sock.disconnect(self.endpoint)
        self.endpoint = endpoint
        self.sock.connect(endpoint)
        self.heard_at = self.loop.time()

    def send(self) -> None:
        """The batch to the router; nothing once the link is closed (a flush the loop had scheduled
        may still run after `Worker.stop` closed it)."""
        if self.batch and not self.sock.closed:
            try:
                self.sock.send_multipart((_pack_link(self.join, self.seq), self.batch.take()), _NOBLOCK)
            except zmq.Again:
                pass  # no connection takes it (the router refused our key, or is down): a lost frame,
                # which the router sees as a gap, or as a join it never heard of, and answers with REJOIN
            self.seq += 1
            self.batched = 0
            # a send can consume the fd's edge: look for input that arrived meanwhile
            if self.sock.getsockopt(_EVENTS) & _POLLIN:  # type: ignore[operator]  # an int option (stubs: int | bytes)
                self.loop.call_soon(self.drain)

    def pub(self, conn_id: int, packet_id: int, qos: int, retain: bool, topic: bytes, payload: bytes,
            props: bytes = b"", expiry: int = 0, ask_match: bool = False) -> None:
        """`ask_match` (QoS 1/2): ROUTED is to say whether the message matched nobody (wire.MATCH_ASKED)."""
        self.unrouted += 1
        self.batched += 1
        flags = qos | (retain << 2) | (wire.MATCH_ASKED if ask_match else 0)
        if props or expiry:
            head = _pack_pub(conn_id, packet_id, flags | wire.HAS_EXTRA) + wire.extra(props, expiry)
            self.batch.add(wire.PUB, head + topic, payload)
        else:
            self.batch.add(wire.PUB, _pack_pub(conn_id, packet_id, flags) + topic, payload)

    def pub0(self, conn_id: int, topic: bytes, count: int, packets: bytes, v5: bool = False) -> None:
        """A raw run of plain QoS 0 PUBLISH packets of `conn_id` (`v5`: a 5.0 client's, with empty property
        blocks)."""
        self.unrouted += 1
        self.batched += 1
        self.batch.add(wire.PUB0_V5 if v5 else wire.PUB0, _pack_run(count, conn_id) + topic, packets)

    def ack(self, conn_id: int, packet_id: int, stage: int) -> None:
        self.batch.add(wire.ACK, _pack_ack(conn_id, packet_id, stage))

    def connect(self, record: wire.Connect, will_payload: bytes) -> None:
        self.batch.add(wire.CONNECT, record.encode(), will_payload)

    def subscribe(self, conn_id: int, packet_id: int, filters: list[list]) -> None:
        self.batch.add(wire.SUBSCRIBE, wire.Subscribe(conn_id, packet_id, filters).encode())

    def unsubscribe(self, conn_id: int, packet_id: int, filters: list[str]) -> None:
        self.batch.add(wire.UNSUBSCRIBE, wire.Unsubscribe(conn_id, packet_id, filters).encode())

    def rel(self, conn_id: int, packet_id: int) -> None:
        self.batch.add(wire.REL, wire.Rel(conn_id, packet_id).encode())

    def gone(self, conn_id: int, publish_will: bool) -> None:
        self.batch.add(wire.GONE, wire.Gone(conn_id, publish_will).encode())

    def session_expiry(self, conn_id: int, expiry: int) -> None:
        self.batch.add(wire.SESSION_EXPIRY, wire.SessionExpiry(conn_id, expiry).encode())

    def stats(self, report: wire.Stats) -> None:
        self.batch.add(wire.STATS, report.encode())

    def clients(self, request: int, label: str, clients: list[list], matched: int) -> None:
        self.batch.add(wire.CLIENTS, wire.Clients(request, label, clients, matched).encode())

    def routes_ack(self, gen: int) -> None:
        self.batch.add(wire.ROUTES_ACK, wire.RoutesAck(gen).encode())

    def traces_ack(self, gen: int) -> None:
        self.batch.add(wire.TRACES_ACK, wire.TracesAck(gen).encode())

    def bans_ack(self, gen: int, closed: int) -> None:
        self.batch.add(wire.BANS_ACK, wire.BansAck(gen, closed).encode())

    def traced(self, trace: int, topic: bytes, qos: int, retain: bool, payload: bytes, client: str, at: float) -> None:
        """A copy of a PUBLISH for trace `trace`, its payload cut to wire.TRACED_PAYLOAD bytes."""
        self.batch.add(wire.TRACED, wire.Traced(trace, topic.decode(), qos, retain, len(payload), client, at).encode(),
                       payload[:wire.TRACED_PAYLOAD])

    def synced(self, number: int) -> None:
        self.batch.add(wire.SYNCED, wire.Sync(number).encode())

    def kicked(self, conn_id: int) -> None:
        self.batch.add(wire.KICKED, wire.Kicked(conn_id).encode())

    def bye(self) -> None:
        self.batch.add(wire.BYE, b"")

    def close(self, linger_ms: int = 0) -> None:
        """`linger_ms`: how long what is still queued may take to leave (0: dropped)."""
        self.loop.remove_reader(self.fd)
        self.sock.close(linger=linger_ms)
        self.ctx.term()
