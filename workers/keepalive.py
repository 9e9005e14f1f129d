"""One timer wheel per worker for keepalive and CONNECT deadlines: no timer per connection.

Entries sit in one-second slots, swept just after each whole second, so a deadline is acted on
less than a second after it passes. Activity only moves a connection's `deadline` forward; the sweep
re-files an entry whose deadline moved and returns the ones whose deadline has passed, so a busy
connection costs one float store per read and one re-filing per keepalive period. A deadline that
moves earlier (CONNECT's keepalive replacing the CONNECT timeout) is filed again with `add`; the
item remembers its slot so the entry left behind in the later slot is ignored.
"""

from __future__ import annotations

import math
from typing import Protocol


class Deadlined(Protocol):
    deadline: float
    wheel_slot: int

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
            item.wheel_slot = -1
            return
        second = max(math.ceil(deadline), self.cursor)  # the first whole second at or after it
        item.wheel_slot = second
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
            second = self.cursor
            items = slots.pop(second, None)
            self.cursor += 1
            if not items:
                continue
            for item in items:
                if item.closed or item.wheel_slot != second:
                    continue
                if item.deadline <= now:
                    due.append(item)
                else:
                    self.add(item)
        return due
