"""When something about an offline session falls due: its delayed will (MQTT 5 will delay interval)
or its end (its own session expiry interval). A heap of times, so the router's look after every
turn costs nothing while nothing is due, whatever the number of sessions, and its poll waits no longer
than until the first (`first`): a deadline is kept to within milliseconds, not to the next tick.

An entry is only a reminder: the session may have reconnected, changed its deadline or gone since,
so whoever pops it checks the session's state then (`Session.will_at`, `Session.ends_at`).
"""

from __future__ import annotations

import heapq
import math
from itertools import count
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from plexmq.router.sessions import Session


class Deadlines:
    __slots__ = ("_heap", "_order")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Session]] = []
        self._order = count()  # ties never compare sessions

    def __len__(self) -> int:
        return len(self._heap)

    @property
    def first(self) -> float:
        """The time of the earliest reminder (inf: none)."""
        return self._heap[0][0] if self._heap else math.inf

    def add(self, at: float, session: Session) -> None:
        heapq.heappush(self._heap, (at, next(self._order), session))

    def due(self, now: float) -> list[Session]:
        """The sessions with a reminder at or before `now` (each once), removed from the heap."""
        heap = self._heap
        found: dict[int, Session] = {}
        while heap and heap[0][0] <= now:
            session = heapq.heappop(heap)[2]
            found[id(session)] = session
        return list(found.values())
