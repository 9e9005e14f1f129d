"""The worker's direct links to the other workers of its host (issue 35): a QoS 0 or 1 message whose
topic only workers' own subscribers want goes from the publisher's worker straight to theirs, not
through the router (docs/architecture.md §4, "Worker to worker").

Each worker binds a ZeroMQ ROUTER, its inbox, at `ipc://RUN_DIR/peer-w<id>.ipc`, and connects a
DEALER to a peer's inbox the first time it sends there. One frame per peer per loop turn carries that
turn's records (plexmq/wire.py: PEER_RAW, PEER_RAW_V5, PEER_MSG) behind its number (PEER_SEQ); the
receiver delivers them to the subscribers it serves itself and sends the number back, and a QoS 1
publisher's PUBACK waits for that answer. A frame not yet
answered is *unconfirmed*: while any is, the worker's frame to the router waits if it holds a message
(`Worker.flush`), so that none overtakes, through the router, one still on its way to a peer. A peer
that answers nothing for PATIENCE seconds (killed: its clients are gone with it) is taken as answered.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

import zmq

from plexmq import wire

log = logging.getLogger("plexmq.worker")

PATIENCE = 2.0  # seconds a peer may leave a frame unanswered before it is taken for gone
_EVENTS, _POLLIN, _NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)
_pack_seq, _unpack_seq = wire.PEER_SEQ.pack, wire.PEER_SEQ.unpack
_pack_head = wire.PEER_HEAD.pack


def inbox_path(run_dir: str, place: str) -> str:
    """Where the worker of `place` (its identity: `w3`, or `node/w3` on a node) takes its peers' frames."""
    return os.path.join(run_dir, f"peer-{place.rpartition('/')[2]}.ipc")


def delivered(marks: Marks) -> bool:
    """Whether each peer has answered past its mark (`Peers.message`, `Peers.owed`): all it was sent up
    to then is delivered."""
    return all(peer.answered > mark for peer, mark in marks)


class Peer:
    """One peer's DEALER and the turn's records for it."""

    __slots__ = ("sock", "fd", "batch", "sent", "answered", "since")

    def __init__(self, ctx: zmq.Context, endpoint: str, identity: bytes) -> None:
        sock = self.sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, identity)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        self.fd: int = sock.getsockopt(zmq.FD)
        self.batch = wire.Batch()
        self.sent = 0  # the number of the last frame sent here
        self.answered = 0  # the number of the last frame it answered
        self.since = 0.0  # loop.time() when its oldest unanswered frame left (0: none)


Marks = tuple[tuple[Peer, int], ...]  # each peer with the last frame number its answers must pass


class Peers:
    """The inbox, a Peer per worker sent to, and what is unconfirmed."""

    def __init__(self, loop: asyncio.AbstractEventLoop, run_dir: str, identity: bytes,
                 on_frame: Callable[[bytes], None], on_answer: Callable[[], None]) -> None:
        """`on_frame`: the records of a peer's frame, to deliver; `on_answer`: a peer answered (the PUBACKs
        and the frame to the router that waited for it may go)."""
        self.loop = loop
        self.run_dir = run_dir
        self.identity = identity
        self.own = identity.decode()
        self.node = self.own.rpartition("/")[0]
        self.on_frame = on_frame
        self.on_answer = on_answer
        self.ctx = zmq.Context(io_threads=1)
        inbox = self.inbox = self.ctx.socket(zmq.ROUTER)
        inbox.setsockopt(zmq.RCVHWM, 0)
        inbox.setsockopt(zmq.SNDHWM, 0)
        inbox.setsockopt(zmq.LINGER, 0)
        path = inbox_path(run_dir, self.own)
        if os.path.exists(path):  # left by this worker's predecessor, killed
            os.unlink(path)
        inbox.bind(f"ipc://{path}")
        self.inbox_fd: int = inbox.getsockopt(zmq.FD)  # type: ignore[assignment]  # an int option
        loop.add_reader(self.inbox_fd, self.drain_inbox)
        self.peers: dict[str, Peer] = {}
        self.pending: list[Peer] = []  # peers with records this turn
        self.unconfirmed = 0  # peers with a frame not yet answered
        self.seq = 0

    def reaches(self, place: str) -> bool:
        """Whether `place` is another worker of this host (a router's place, b"", is none)."""
        return bool(place) and place.rpartition("/")[0] == self.node and place != self.own

    def _peer(self, place: str) -> Peer:
        peer = self.peers.get(place)
        if peer is None:
            peer = self.peers[place] = Peer(self.ctx, f"ipc://{inbox_path(self.run_dir, place)}", self.identity)
            self.loop.add_reader(peer.fd, self._drain_answers, peer)
        return peer

    def raw(self, place: str, tenant: str, topic: bytes, packets: bytes, as_v5: bool) -> None:
        """A run of plain QoS 0 packets to `topic` of a client of `tenant`, for `place`'s subscribers."""
        peer = self._peer(place)
        if not peer.batch:
            self.pending.append(peer)
        name = tenant.encode()
        peer.batch.add(wire.PEER_RAW_V5 if as_v5 else wire.PEER_RAW, _pack_head(len(name)) + name + topic, packets)

    def message(self, place: str, tenant: str, topic: bytes, payload: bytes, extra: tuple[bytes, int] | None,
                qos: int) -> tuple[Peer, int]:
        """A QoS 0 or 1 message (with its 5.0 properties and expiry, if any) for `place`'s subscribers; the
        peer and the number of the last frame sent to it, which its answer to a later one passes
        (`Worker.answered`: the publisher's PUBACK waits for it)."""
        peer = self._peer(place)
        if not peer.batch:
            self.pending.append(peer)
        name = tenant.encode()
        head = wire.deliver_head(topic, qos, False, False, *(extra or (b"", 0)))
        peer.batch.add(wire.PEER_MSG, _pack_head(len(name)) + name + head, payload)
        return peer, peer.sent

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
            sock = peer.sock
            sock.send_multipart((_pack_seq(self.seq), peer.batch.take()), copy=False)
            if sock.getsockopt(_EVENTS) & _POLLIN:  # a send can consume the fd's edge: an answer may be in
                self.loop.call_soon(self._drain_answers, peer)
        self.pending.clear()

    def drain_inbox(self) -> None:
        """Deliver each peer's frame, then answer it with its number (the ZeroMQ fd is edge-triggered:
        read until EVENTS says nothing is left)."""
        inbox = self.inbox
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

    def _answered(self, peer: Peer, seq: int) -> None:
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
        """A peer silent for PATIENCE with frames unanswered is taken for gone (a killed worker's clients
        went with it): its frames count as answered."""
        for place, peer in self.peers.items():
            if peer.since and now - peer.since >= PATIENCE:
                log.warning("worker %s answered no direct delivery for %.1f s: taken for gone", place, now - peer.since)
                self._answered(peer, peer.sent)

    def close(self) -> None:
        for peer in self.peers.values():
            self.loop.remove_reader(peer.fd)
        self.loop.remove_reader(self.inbox_fd)
        self.ctx.destroy(linger=0)
        try:
            os.unlink(inbox_path(self.run_dir, self.own))  # a run dir a broker stopped in holds nothing of its own
        except FileNotFoundError:
            pass
