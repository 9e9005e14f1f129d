"""The router's side of each worker's link: which frames it may take, and which workers are silent.

Why: ZeroMQ reconnects a broken link by itself (a router restart, a node's TCP connection reset) and
whatever was in flight on the old connection is gone without a word. So every frame travels with a
`wire.LINK` tag, (join, seq): a worker numbers its joins (each starts with a HELLO, seq 0) and the
frames of each join. The router takes a frame only from the join it has accepted, in sequence; any
other frame (a worker this router never heard say HELLO, one that lost frames, one taken for dead) is
dropped and answered once with REJOIN, and the worker registers its live connections again and
resends what the router has not confirmed, exactly as after a router restart (docs/architecture.md §6).
The router numbers its frames to each worker the same way, so a worker notices lost answers too.
"""

from __future__ import annotations

import time

from router import wire

_pack_link = wire.LINK.pack
_unpack_link = wire.LINK.unpack


class Link:
    """One worker's link as the router sees it."""

    __slots__ = ("join", "next_in", "next_out", "heard", "asked", "node", "address", "pid", "worker_id", "state")

    def __init__(self) -> None:
        self.join = 0  # the join accepted (0: none: its frames are dropped)
        self.next_in = 0
        self.next_out = 0
        self.heard = time.monotonic()
        self.asked = -1  # the join last answered with REJOIN (one answer per join)
        self.node = ""
        self.address = ""
        self.pid = 0
        self.worker_id = 0
        self.state = "up"  # "up", or "lost": silent past the timeout, or dropping frames until HELLO


class Links:
    """Every worker's link, by its identity."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout  # seconds of silence after which a worker is taken for dead
        self.links: dict[bytes, Link] = {}
        self.rejoins: list[tuple[bytes, int]] = []  # (worker, join) to answer with REJOIN

    def accept(self, worker: bytes, tag: bytes) -> bool:
        """Whether to take this frame of `worker` (seq 0 opens a join: its first record is HELLO)."""
        join, seq = _unpack_link(tag)
        link = self.links.get(worker)
        if link is None:
            link = self.links[worker] = Link()
        link.heard = time.monotonic()
        if seq == 0:
            link.join, link.next_in, link.next_out, link.state = join, 1, 0, "up"
            return True
        if join == link.join and seq == link.next_in:
            link.next_in += 1
            return True
        if link.join and join == link.join:  # a gap: frames were lost on the way
            link.join, link.state = 0, "lost"
        if link.asked != join:
            link.asked = join
            self.rejoins.append((worker, join))
        return False

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

    def silent(self, now: float) -> list[bytes]:
        """Joined workers not heard from for `timeout` seconds: from now on their frames are refused."""
        lost = [worker for worker, link in self.links.items() if link.join and now - link.heard > self.timeout]
        for worker in lost:
            link = self.links[worker]
            link.join, link.state = 0, "lost"
        return lost
