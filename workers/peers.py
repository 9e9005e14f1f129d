"""The worker's direct links to the other workers of its host, and to those of other nodes (issue 35):
a message whose topic only workers' own subscribers want goes from the publisher's worker straight
to theirs, not through the router (docs/architecture.md §4, "Worker to worker"): QoS 0, 1 and 2 (of a
session that ends with its connection) to the workers of its host, QoS 0 to those of other nodes.

Each worker has an inbox for the workers of its host (workers/host_links.py: a Unix socket at
`RUN_DIR/peer-w<id>.sock`) and connects to a peer's the first time it sends there. One frame per peer
per loop turn carries that turn's records (plexmq/wire.py: PEER_RAW, PEER_RAW_V5, PEER_MSG) behind its
number; the receiver delivers them to the subscribers it serves itself and sends the number back, and a
QoS 1 publisher's PUBACK (QoS 2: PUBREC) waits for that answer. A frame not yet answered is
*unconfirmed*: while any is, the worker's frame to the router waits if it holds a message
(`Worker.flush`), so that none overtakes, through the router, one still on its way to a peer. A peer of
this host that answers nothing for PATIENCE seconds (stopped), or whose inbox closes (killed: its
clients are gone with it), is taken as answered.

A node's workers with `direct_bind` bind a second inbox there (a ZeroMQ ROUTER, tcp, CURVE with the
router link's keys; a DEALER to each such peer, PEER_SEQ leading each frame and its answer) and tell the
router (HELLO), which tells every worker where the others' are (DIRECTORY); a worker sends to another
node's worker itself only when both have one. Such a peer that answers nothing for PATIENCE is *shunned*
for RETRY seconds: what was on its way is dropped (QoS 0: at most once) and the messages for its node
cross the router, which reaches every node. QoS 1 between nodes (and 2) always crosses the router: a
PUBACK there means the router holds the message, which a cut between two nodes that both still reach
the router cannot lose.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial

import zmq
from zmq.auth.thread import ThreadAuthenticator

from plexmq import curve, wire
from plexmq.workers.host_links import HostInbox, HostPeer, inbox_path

log = logging.getLogger("plexmq.worker")

PATIENCE = 2.0  # seconds a peer may leave a frame unanswered before it is taken for gone
HEADS = 10_000  # PEER_MSG heads kept (`Peers.message`): a topic's is made once, not per message
RETRY = 30.0  # seconds another node's worker that did not answer is shunned (its node's messages cross the router)
_EVENTS, _POLLIN, _NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)
_pack_seq, _unpack_seq = wire.PEER_SEQ.pack, wire.PEER_SEQ.unpack
_pack_head, _pack_count = wire.PEER_HEAD.pack, wire.COUNT.pack


def direct_endpoint(direct_bind: str, worker_id: int) -> str:
    """Where worker `worker_id` of a node with `direct_bind` (tcp://HOST:PORT) takes other nodes' frames: PORT+id."""
    host, _, port = direct_bind.rpartition(":")
    return f"{host}:{int(port) + worker_id}"


def delivered(marks: Marks) -> bool:
    """Whether each peer has answered past its mark (`Peers.message`, `Peers.owed`): all it was sent up
    to then is delivered."""
    return all(peer.answered > mark for peer, mark in marks)


class Peer:
    """One peer's DEALER (another node's worker) and the turn's records for it."""

    __slots__ = ("sock", "fd", "batch", "sent", "answered", "since")

    def __init__(self, ctx: zmq.Context, endpoint: str, identity: bytes, keys: dict[str, str] | None) -> None:
        """`keys`: the CURVE keys, for another node's worker (tcp)."""
        sock = self.sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, identity)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.LINGER, 0)
        if keys:
            curve.client(sock, keys)
        sock.connect(endpoint)
        self.fd: int = sock.getsockopt(zmq.FD)
        self.batch = wire.Batch()
        self.sent = 0  # the number of the last frame sent here
        self.answered = 0  # the number of the last frame it answered
        self.since = 0.0  # loop.time() when its oldest unanswered frame left (0: none)

    def send(self, seq: int, frame: bytes) -> bool:
        """Frame number `seq`; whether an answer may be waiting (a send can consume the fd's edge)."""
        sock = self.sock
        sock.send_multipart((_pack_seq(seq), frame))
        return bool(sock.getsockopt(_EVENTS) & _POLLIN)


AnyPeer = Peer | HostPeer
Marks = tuple[tuple[AnyPeer, int], ...]  # each peer with the last frame number its answers must pass


class Peers:
    """The inboxes, a HostPeer or Peer per worker sent to, and what is unconfirmed."""

    def __init__(self, loop: asyncio.AbstractEventLoop, run_dir: str, identity: bytes,
                 on_frame: Callable[[bytes], None], on_answer: Callable[[], None],
                 on_reach: Callable[[set[str]], None], direct: str = "", keys: dict[str, str] | None = None) -> None:
        """`on_frame`: the records of a peer's frame, to deliver; `on_answer`: a peer answered (the PUBACKs
        and the frame to the router that waited for it may go); `on_reach`: the other nodes' workers it
        sends to itself now (workers/routes.py); `direct`: its own endpoint for those (`direct_endpoint`;
        "": none), with the CURVE `keys`."""
        self.loop = loop
        self.run_dir = run_dir
        self.identity = identity
        self.own = identity.decode()
        self.node = self.own.rpartition("/")[0]
        self.on_frame = on_frame
        self.on_answer = on_answer
        self.inbox = HostInbox(loop, inbox_path(run_dir, self.own), on_frame)
        self.direct = direct
        self.keys = keys
        # other nodes' workers: ZeroMQ over tcp, CURVE (only with an endpoint of its own: `directory`)
        self.ctx: zmq.Context | None = None
        self.auth: ThreadAuthenticator | None = None
        self.far_fd = -1
        if direct:
            ctx = self.ctx = zmq.Context(io_threads=1)
            far = self.far = ctx.socket(zmq.ROUTER)
            far.setsockopt(zmq.RCVHWM, 0)
            far.setsockopt(zmq.SNDHWM, 0)
            far.setsockopt(zmq.LINGER, 0)
            self.auth = curve.server(ctx, far, keys)  # type: ignore[arg-type]  # a node has them
            far.bind(direct)
            self.far_fd = far.getsockopt(zmq.FD)  # type: ignore[assignment]  # an int option
            loop.add_reader(self.far_fd, self.drain_inbox, far)
        self.on_reach = on_reach
        self.endpoints: dict[str, str] = {}  # other nodes' workers, where they take frames (DIRECTORY)
        self.shunned: dict[str, float] = {}  # those that did not answer -> loop.time() to try again
        self.peers: dict[str, AnyPeer] = {}
        self.heads: dict[tuple[str, bytes, int], bytes] = {}  # (tenant, topic, QoS) -> its PEER_MSG head
        self.pending: list[AnyPeer] = []  # peers with records this turn
        self.unconfirmed = 0  # peers with a frame not yet answered
        self.seq = 0

    def directory(self, endpoints: dict[str, str]) -> None:
        """DIRECTORY: where every joined worker takes frames from other nodes; those of other nodes are
        sent to directly when this worker has an endpoint too (a link to one no longer listed closes)."""
        self.endpoints = {place: endpoint for place, endpoint in endpoints.items()
                          if self.direct and place.rpartition("/")[0] != self.node}
        for place in [place for place in self.peers if place.rpartition("/")[0] != self.node]:
            if place not in self.endpoints:
                self._close(place)
        self._reach()

    def _reach(self) -> None:
        self.on_reach({place for place in self.endpoints if place not in self.shunned})

    def _peer(self, place: str) -> AnyPeer:
        peer = self.peers.get(place)
        if peer is None:
            far = self.endpoints.get(place)
            if far:
                peer = self.peers[place] = Peer(self.ctx, far, self.identity, self.keys)  # type: ignore[arg-type]  # reached: it has one
                self.loop.add_reader(peer.fd, self._drain_answers, peer)
            else:
                peer = self.peers[place] = HostPeer(self.loop, inbox_path(self.run_dir, place), self._answered,
                                                    partial(self._gone, place))
        return peer

    def _gone(self, place: str, peer: HostPeer) -> None:
        """A worker of this host that closed its inbox or was not there: killed, its clients gone with it.
        What it was sent counts as answered; the next message for it connects again."""
        if self.peers.get(place) is peer:
            del self.peers[place]
        self._forget(peer)

    def raw(self, place: str, tenant: str, topic: bytes, packets: bytes, count: int, as_v5: bool) -> None:
        """A run of `count` plain QoS 0 packets to `topic` of a client of `tenant`, for `place`'s subscribers."""
        peer = self._peer(place)
        if not peer.batch:
            self.pending.append(peer)
        name = tenant.encode()
        peer.batch.add(wire.PEER_RAW_V5 if as_v5 else wire.PEER_RAW,
                       _pack_head(len(name)) + name + _pack_count(count) + topic, packets)

    def message(self, places: tuple[str, ...], tenant: str, topic: bytes, payload: bytes,
                extra: tuple[bytes, int] | None, qos: int) -> Marks:
        """A QoS 0, 1 or 2 message (with its 5.0 properties and expiry, if any) for the subscribers of each of
        `places`: each peer with the number of the last frame sent to it, which its answer to a later one
        passes (`Worker.answered`: the publisher's PUBACK or PUBREC waits for it). The record's head is made once
        per message, and once per tenant, topic and QoS while none carries properties (`heads`)."""
        if extra is None:
            key = (tenant, topic, qos)
            head = self.heads.get(key)
            if head is None:
                if len(self.heads) >= HEADS:
                    self.heads.clear()
                name = tenant.encode()
                head = self.heads[key] = _pack_head(len(name)) + name + wire.deliver_head(topic, qos, False, False, b"", 0)
        else:
            name = tenant.encode()
            head = _pack_head(len(name)) + name + wire.deliver_head(topic, qos, False, False, *extra)
        marks = []
        for place in places:
            peer = self._peer(place)
            if not peer.batch:
                self.pending.append(peer)
            peer.batch.add(wire.PEER_MSG, head, payload)
            marks.append((peer, peer.sent))
        return tuple(marks)

    def owed(self) -> Marks:
        """Each peer with something not yet delivered (a frame unanswered, or records not yet sent) and the
        mark its answers must pass for all of it to be (as `message` gives them)."""
        return tuple([(peer, peer.sent if peer.batch else peer.sent - 1) for peer in self.peers.values()
                      if peer.batch or peer.answered < peer.sent])

    def send(self) -> None:
        """The turn's frame to each peer that has records (at the end of every loop turn)."""
        if not self.pending:
            return
        now = self.loop.time()
        for peer in self.pending:
            self.seq += 1
            if peer.sent == peer.answered:
                self.unconfirmed += 1
                peer.since = now
            peer.sent = self.seq
            if peer.send(self.seq, peer.batch.take()):
                self.loop.call_soon(self._drain_answers, peer)  # type: ignore[arg-type]  # only a far Peer says so
        self.pending.clear()

    def drain_inbox(self, inbox: zmq.Socket) -> None:
        """Deliver each frame of another node's worker, then answer it with its number (the ZeroMQ fd is
        edge-triggered: read until EVENTS says nothing is left)."""
        while inbox.getsockopt(_EVENTS) & _POLLIN:  # type: ignore[operator]  # an int option
            sender, seq, frame = inbox.recv_multipart(_NOBLOCK)
            self.on_frame(frame)
            inbox.send_multipart((sender, seq), _NOBLOCK)

    def _drain_answers(self, peer: Peer) -> None:
        sock = peer.sock
        answered = peer.answered
        while sock.getsockopt(_EVENTS) & _POLLIN:
            answered = _unpack_seq(sock.recv(_NOBLOCK))[0]
        self._answered(peer, answered)

    def _answered(self, peer: AnyPeer, seq: int) -> None:
        if seq <= peer.answered:
            return
        peer.answered = seq
        if peer.sent == seq:
            peer.since = 0.0
            self.unconfirmed -= 1
        else:
            peer.since = self.loop.time()  # its next frame is the oldest unanswered now
        self.on_answer()

    def expire(self, now: float) -> None:
        """(each second) A peer of this host silent for PATIENCE with frames unanswered is taken for gone
        (a killed worker's clients went with it): its frames count as answered. One of another node is
        shunned for RETRY (a dead node, or a cut between the two); one shunned that long is tried again."""
        for place, peer in list(self.peers.items()):
            if peer.since and now - peer.since >= PATIENCE:
                if place in self.endpoints:
                    log.warning("worker %s answered no direct delivery for %.1f s: its node's messages cross the "
                                "router for %g s", place, now - peer.since, RETRY)
                    self._close(place)
                    self.shunned[place] = now + RETRY
                    self._reach()
                else:
                    log.warning("worker %s answered no direct delivery for %.1f s: taken for gone", place, now - peer.since)
                    self._answered(peer, peer.sent)
        if self.shunned and any(now >= until for until in self.shunned.values()):
            self.shunned = {place: until for place, until in self.shunned.items() if now < until}
            self._reach()

    def _close(self, place: str) -> None:
        """Drop the link to another node's worker and what is on its way there (QoS 0 only): every mark
        on it counts as passed."""
        peer = self.peers.pop(place)
        assert isinstance(peer, Peer)  # another node's
        self.loop.remove_reader(peer.fd)
        peer.sock.close(linger=0)
        self._forget(peer)

    def _forget(self, peer: AnyPeer) -> None:
        """A peer no longer sent to: what was on its way is dropped and every mark on it counts as passed."""
        if peer.batch:
            peer.batch.take()
            self.pending.remove(peer)
        if peer.answered < peer.sent:
            self.unconfirmed -= 1
        peer.answered = peer.sent + 1  # past every mark given (`message`, `owed`)
        self.on_answer()

    def close(self) -> None:
        for peer in self.peers.values():
            if isinstance(peer, HostPeer):
                peer.close()
            else:
                self.loop.remove_reader(peer.fd)
        self.inbox.close()
        if self.far_fd >= 0:
            self.loop.remove_reader(self.far_fd)
        if self.auth is not None:
            self.auth.stop()
        if self.ctx is not None:
            self.ctx.destroy(linger=0)
