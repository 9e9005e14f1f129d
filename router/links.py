"""The router's side of each worker's link: which frames it may take, and which workers are silent.

Why: ZeroMQ reconnects a broken link by itself (a router restart, a node's TCP connection reset) and
whatever was in flight on the old connection is gone without a word. So every frame travels with a
`wire.LINK` tag, (join, seq): a worker numbers its joins (each starts with a HELLO, seq 0) and the
frames of each join. The router takes a frame only from the join it has accepted, in sequence; any
other frame (a worker this router never heard say HELLO, one that lost frames, one taken for dead) is
dropped and answered with REJOIN (again each second while it lasts: a REJOIN can be lost too), and the
worker registers its live connections again and resends what the router has not confirmed, exactly as
after a router restart (docs/architecture.md §3, §5).
The router numbers its frames to each worker the same way, so a worker notices lost answers too.
"""

from __future__ import annotations

import time

from plexmq import wire

_pack_link = wire.LINK.pack
_unpack_link = wire.LINK.unpack


REJOIN_EVERY = 1.0  # seconds between REJOINs to a worker whose frames are refused


class Link:
    """One worker's link as the router sees it."""

    __slots__ = ("join", "alive", "next_in", "next_out", "heard", "gap_at", "asked", "node", "address", "worker_id",
                 "pid", "direct")

    def __init__(self) -> None:
        self.join = 0  # the join accepted (0: none: its frames are dropped)
        self.alive = False  # whether the router holds this worker's sessions as connected (until worker_lost)
        self.next_in = 0
        self.next_out = 0
        self.heard = time.monotonic()
        self.gap_at = 0.0  # time.monotonic() when frames went missing (while it has not joined again)
        self.asked = 0.0  # time.monotonic() of the last REJOIN
        self.node = ""
        self.address = ""
        self.worker_id = 0
        self.pid = 0  # of its process, as its last HELLO said
        self.direct = ""  # where other nodes' workers may send it messages, as its last HELLO said


class Links:
    """Every worker's link, by its identity."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout  # seconds of silence after which a worker is taken for dead
        self.links: dict[bytes, Link] = {}
        self.rejoins: list[tuple[bytes, int]] = []  # (worker, join) to answer with REJOIN
        self.gaps: list[bytes] = []  # workers that lost frames this turn: nobody may wait for them now

    def accept(self, worker: bytes, tag: bytes) -> bool:
        """Whether to take this frame of `worker` (seq 0 opens a join: its first record is HELLO)."""
        link = self.links.get(worker)
        if link is None:
            link = self.links[worker] = Link()
        now = link.heard = time.monotonic()
        if len(tag) != wire.LINK.size:
            return False  # not one of our workers (its CURVE key let it in): nothing to answer
        join, seq = _unpack_link(tag)
        if seq == 0:
            link.join, link.alive, link.next_in, link.next_out, link.asked, link.gap_at = join, True, 1, 0, 0.0, 0.0
            return True
        if join == link.join and seq == link.next_in:
            link.next_in += 1
            return True
        if link.join and join == link.join:  # a gap: frames were lost on the way
            link.join, link.gap_at = 0, now
            self.gaps.append(worker)
        if now - link.asked >= REJOIN_EVERY:
            link.asked = now
            self.rejoins.append((worker, join))
        return False

    def expect(self, worker: bytes) -> None:
        """A worker the last active router held connections on (router/lifecycle.py `_carry`): alive,
        its sessions connected, but not joined; taken for dead `timeout` seconds from now unless it joins."""
        link = self.links.get(worker)
        if link is None:
            link = self.links[worker] = Link()
        link.alive, link.heard = True, time.monotonic()

    def tag(self, worker: bytes) -> bytes:
        """The tag of the next frame to `worker` (counted even if the send fails: the worker then sees the gap)."""
        link = self.links.get(worker)
        if link is None:
            return _pack_link(0, 0)
        seq = link.next_out
        link.next_out = seq + 1
        return _pack_link(link.join, seq)

    def joined(self) -> list[bytes]:
        return [worker for worker, link in self.links.items() if link.join]

    def alive(self) -> list[bytes]:
        """The workers whose sessions the router holds as connected: the ones the route table and
        client listings count on."""
        return [worker for worker, link in self.links.items() if link.alive]

    def directory(self) -> dict[str, str]:
        """The direct endpoint of each worker whose sessions the router holds as connected and that has one."""
        return {worker.decode(): link.direct for worker, link in self.links.items() if link.alive and link.direct}

    def drop(self, worker: bytes) -> None:
        """From now on the worker's frames are refused and its sessions are not the router's to end."""
        link = self.links[worker]
        link.join, link.alive = 0, False

    def silent(self, now: float) -> list[bytes]:
        """Workers whose sessions the router holds as connected but that have not been heard from for
        `timeout` seconds (or, after a gap, have not joined again since): taken for dead from now on."""
        lost = []
        for worker, link in self.links.items():
            if link.alive and now - (link.gap_at if link.gap_at and not link.join else link.heard) > self.timeout:
                self.drop(worker)
                lost.append(worker)
        return lost
