"""A node's workers follow the active router (docs/architecture.md §3): with more than one endpoint
in `router`, the link moves to another router when the one it is connected to answers STANDBY (to
the active one it names, if the list holds it, else to the next) or sends nothing for
FOLLOW_SILENCE (dead or cut off: the next), and the worker joins there (`Worker.rejoin`). With one
endpoint the link stays where it is: a standby there answers until it takes over, and then asks
for a new join (REJOIN) as a restarted router does."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from plexmq.workers.link import local_address

if TYPE_CHECKING:
    from plexmq.workers.worker import Worker

log = logging.getLogger("plexmq.worker")

FOLLOW_SILENCE = 1.5  # seconds without a frame before the router is taken for gone (it BEATs every second)
FOLLOW_PAUSE = 0.5  # least seconds between two moves: while every router is a standby, no tight loop of joins
WATCH_EVERY = 0.25  # seconds between two looks at the silence
# seconds a worker stays at a standby that is about to take over: the active it names is the router this
# worker left for silence (its lease not yet lapsed), or it names none (the lease has lapsed): going back
# to the silent one would cost another FOLLOW_SILENCE. Bounded: a router silent to this node alone keeps
# its lease, and the worker must go back to it.
STAY = 3.0
NUDGE_EVERY = 0.5  # seconds between two joins sent to the standby it stays at: the first after it takes over is taken


class Follower:
    """Which router the worker's link should be on, and the moves there, one log line each for the
    first round; then one line per round while no router answers as the active one."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.moves = 0  # moves since an active router last answered
        self.moved_at = worker.loop.time() - FOLLOW_PAUSE
        self.addresses = {worker.link.endpoint: worker.address}  # endpoint -> this host's address towards it
        self.left = ""  # the endpoint the link last left for silence
        self.left_at = 0.0
        self.staying = 0.0  # loop.time() the worker began to stay at a standby (0: it is not staying)
        self.standby_join = 0  # the last join a standby answered while the worker stays there
        if len(worker.link.endpoints) > 1:
            worker.loop.call_later(WATCH_EVERY, self._watch)

    def standby(self, router: str, active: str) -> None:
        """STANDBY answered this join: a standby counts no frames (it tags every answer seq 0), so
        its next answers are no gap; the first one moves the link on."""
        link = self.worker.link
        link.next_in = 0
        if link.standby:
            return  # a move is due already (or, with one endpoint, the worker waits)
        now = self.worker.loop.time()
        if len(link.endpoints) > 1 and (not active or active == self.left) and now - self.left_at < STAY:
            self.standby_join = link.join
            if not self.staying:
                self.staying = now
                log.info("router at %s is a standby and the active one is %s: waiting for it to take over",
                         link.endpoint, f"{active}, silent here" if active else "none")
            return  # _watch joins it again every NUDGE_EVERY; after STAY the next STANDBY moves on
        self.staying = 0.0
        link.standby = True
        if len(link.endpoints) == 1:
            log.info("router at %s is a standby (%s, active: %s): waiting for it to take over", link.endpoint, router,
                     active or "unknown")
            return
        target = active if active in link.endpoints and active != link.endpoint else self._next()
        why = f"router at {link.endpoint} is a standby (active: {active or 'unknown'}): joining {target}"
        wait = self.moved_at + FOLLOW_PAUSE - self.worker.loop.time()
        if wait > 0:
            self.worker.loop.call_later(wait, self._move, link.join, target, why)
        else:
            self._move(link.join, target, why)

    def _next(self) -> str:
        endpoints = self.worker.link.endpoints
        return endpoints[(endpoints.index(self.worker.link.endpoint) + 1) % len(endpoints)]

    def _watch(self) -> None:
        worker = self.worker
        if worker.stopped:
            return
        link = worker.link
        now = worker.loop.time()
        if now - link.heard_at >= FOLLOW_SILENCE:
            target = self._next()
            self.left, self.left_at, self.staying = link.endpoint, now, 0.0
            self._move(link.join, target, f"router at {link.endpoint} silent for {FOLLOW_SILENCE:g} s: trying {target}")
        elif self.staying and link.answered and self.standby_join != link.join:
            self.staying = 0.0  # the standby took over: it answered this join as the active one
        elif self.staying and now - link.opened_at >= NUDGE_EVERY:
            worker.rejoin("waiting at a standby about to take over", logging.DEBUG)
        elif link.answered and not link.standby and not self.staying:
            self.moves = 0
        worker.loop.call_later(WATCH_EVERY, self._watch)

    def _move(self, join: int, target: str, why: str) -> None:
        """Connect the link to `target` and join there, unless join `join` has ended meanwhile (a
        REJOIN: the standby took over; or the worker stopped)."""
        worker = self.worker
        link = worker.link
        if link.join != join or worker.stopped:
            return
        count = len(link.endpoints)
        self.moves += 1
        level = logging.WARNING
        if not self.moves % count:
            why = f"no router of {count} answers as the active one; trying again: {target}"
        elif self.moves > count:
            level = logging.DEBUG  # said once per round
        if target not in self.addresses:
            self.addresses[target] = local_address(target)
        worker.address = self.addresses[target]
        self.moved_at = worker.loop.time()
        link.follow(target)
        worker.rejoin(why, level)
