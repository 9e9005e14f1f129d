"""One timer wheel per worker for keepalive and CONNECT deadlines: no timer per connection.

Entries sit in one-second slots. Activity only moves a connection's `deadline` forward; the sweep
re-files an entry whose deadline moved and returns the ones whose deadline has passed, so a busy
connection costs one float store per read and one re-filing per keepalive period.
"""

from __future__ import annotations

import math
from typing import Protocol


class Deadlined(Protocol):
    deadline: float

    @property
    def closed(self) -> bool: ...


class TimerWheel:
    __slots__ = ("slots", "cursor")

    def __init__(self, now: float) -> None:
        self.slots: dict[int, list[Deadlined]] = {}
        self.cursor = int(now)

    def add(self, item: Deadlined) -> None:
        """File `item` under its current deadline (an infinite deadline is never due)."""
        deadline = item.deadline
        if deadline == math.inf:
            return
        second = max(int(deadline) + 1, self.cursor)
        slot = self.slots.get(second)
        if slot is None:
            self.slots[second] = [item]
        else:
            slot.append(item)

    def expire(self, now: float) -> list[Deadlined]:
        """The open items whose deadline is at or before `now`; the rest are re-filed."""
        due: list[Deadlined] = []
        last = int(now)
        slots = self.slots
        while self.cursor <= last:
            items = slots.pop(self.cursor, None)
            self.cursor += 1
            if not items:
                continue
            for item in items:
                if item.closed:
                    continue
                if item.deadline <= now:
                    due.append(item)
                else:
                    self.add(item)
        return due
