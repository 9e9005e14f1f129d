"""One timer wheel per worker for keepalive and CONNECT deadlines: no timer per connection.

Entries sit in slots of 1/SLOTS_PER_SECOND s, swept just after each slot ends (`Worker._sweep`), so a
deadline is acted on within a slot of passing: a silent client is closed within 1.5 × keepalive +
0.1 s and the loop's latency (a slot of 1 s made it up to 1 s late). Activity only moves a
connection's `deadline` forward; the sweep re-files an entry whose deadline moved and returns the ones
whose deadline has passed, so a busy connection costs one float store per read and one re-filing per
keepalive period, whatever the slot. A deadline that moves earlier (CONNECT's keepalive replacing the
CONNECT timeout) is filed again with `add`; the item remembers its slot so the entry left behind in
the later slot is ignored.
"""

from __future__ import annotations

import math
from typing import Protocol

SLOTS_PER_SECOND = 10


class Deadlined(Protocol):
    deadline: float
    wheel_slot: int

    @property
    def closed(self) -> bool: ...


class TimerWheel:
    __slots__ = ("slots", "cursor")

    def __init__(self, now: float) -> None:
        self.slots: dict[int, list[Deadlined]] = {}
        self.cursor = int(now * SLOTS_PER_SECOND)  # the first slot not yet swept

    def add(self, item: Deadlined) -> None:
        """File `item` under its current deadline (an infinite deadline is never due)."""
        deadline = item.deadline
        if deadline == math.inf:
            item.wheel_slot = -1
            return
        slot_at = max(math.ceil(deadline * SLOTS_PER_SECOND), self.cursor)  # the first slot end at or after it
        item.wheel_slot = slot_at
        slot = self.slots.get(slot_at)
        if slot is None:
            self.slots[slot_at] = [item]
        else:
            slot.append(item)

    def next_sweep(self, now: float) -> float:
        """The loop time just after the slot that holds `now` ends."""
        return (math.floor(now * SLOTS_PER_SECOND) + 1) / SLOTS_PER_SECOND

    def expire(self, now: float) -> list[Deadlined]:
        """The open items whose deadline is at or before `now`; the rest are re-filed."""
        due: list[Deadlined] = []
        last = int(now * SLOTS_PER_SECOND)
        slots = self.slots
        while self.cursor <= last:
            slot_at = self.cursor
            items = slots.pop(slot_at, None)
            self.cursor += 1
            if not items:
                continue
            for item in items:
                if item.closed or item.wheel_slot != slot_at:
                    continue
                if item.deadline <= now:
                    due.append(item)
                else:
                    self.add(item)
        return due
