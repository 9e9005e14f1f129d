"""The overview's history (issue 37): the router keeps the charts' series so that a page opened now
draws the last hour at once (one point a second) and the last day (one a minute), then goes on live,
instead of starting empty at every load.

Fed by `Stats.refresh` once a second from the snapshot it has just taken (nothing walked twice), read by
the console's HTTP threads (`copy`: a lock held for one second's writes, or for copying the arrays).

Bounded: every series is a ring of float64 (`array('d')`) of fixed size, made once and overwritten
oldest first: SECONDS (3,600) points at 1 s and MINUTES (1,440) at 1 min, each minute's point the mean
of its seconds. The broker's BROKER series and their times take 7 x (3,600 + 1,440) x 8 B = 282,240 B;
each worker's CPU and RSS with their times 3 x 5,040 x 8 B = 120,960 B, for at most WORKERS workers
(labels; one that leaves keeps its rings: a restarted worker has its label again), about 31 MB at
most. A figure the broker does not have (bytes without metrics_tenants) is NaN, which JSON shows as null.
"""

from __future__ import annotations

import math
import threading
from array import array
from collections.abc import Mapping

SECONDS = 3600  # points at 1 s: the last hour
MINUTES = 1440  # points at 1 min: the last day
WORKERS = 256  # workers whose CPU and memory are kept
BROKER = ("connections", "received", "sent", "dropped", "bytes_in", "bytes_out")  # stats.COUNTED's rates after it
WORKER = ("cpu", "rss")
NAN = math.nan


def rate(count: float | None, prior: float | None, elapsed: float) -> float | None:
    """A counter's rise per second (a counter that fell, a restarted worker's, counts as no rise);
    None when either figure is unknown. The overview's live events use it too (router/console/events.py)."""
    if count is None or prior is None or elapsed <= 0:
        return None
    return max(0.0, (count - prior) / elapsed)


class Ring:
    """`size` points of named columns and their times, the oldest overwritten."""

    __slots__ = ("at", "columns", "size", "next", "filled")

    def __init__(self, size: int, names: tuple[str, ...]) -> None:
        self.at = array("d", bytes(8 * size))
        self.columns = {name: array("d", bytes(8 * size)) for name in names}
        self.size = size
        self.next = 0  # where the next point goes
        self.filled = 0  # points held

    def add(self, at: float, values: dict[str, float]) -> None:
        i = self.next
        self.at[i] = at
        for name, column in self.columns.items():
            column[i] = values[name]
        self.next = (i + 1) % self.size
        self.filled = min(self.filled + 1, self.size)

    def taken(self) -> Ring:
        """A copy of the ring (memory copies: quick under the lock); `shown` formats it outside."""
        copied = Ring.__new__(Ring)
        copied.at, copied.size, copied.next, copied.filled = self.at[:], self.size, self.next, self.filled
        copied.columns = {name: column[:] for name, column in self.columns.items()}
        return copied

    def shown(self) -> dict[str, list[float | None]]:
        """{"at": [...], name: [...]}, oldest first, rounded to 0.1 (a page's JSON stays small), NaN None."""
        start = (self.next - self.filled) % self.size
        order = [(start + k) % self.size for k in range(self.filled)]
        return {name: [None if math.isnan(v := column[i]) else round(v, 1) for i in order]
                for name, column in (("at", self.at), *self.columns.items())}


class Series:
    """One subject's rings: each second's point, and each minute's mean of them."""

    __slots__ = ("seconds", "minutes", "_minute", "_sums", "_count")

    def __init__(self, names: tuple[str, ...]) -> None:
        self.seconds = Ring(SECONDS, names)
        self.minutes = Ring(MINUTES, names)
        self._minute = -1  # the minute (Unix time // 60) being summed
        self._sums = dict.fromkeys(names, 0.0)
        self._count = 0

    def add(self, at: float, values: dict[str, float]) -> None:
        minute = int(at // 60)
        if minute != self._minute:
            if self._count:
                self.minutes.add(self._minute * 60.0 + 30.0, {n: s / self._count for n, s in self._sums.items()})
            self._minute, self._count = minute, 0
            self._sums = dict.fromkeys(self._sums, 0.0)
        self.seconds.add(at, values)
        for name, value in values.items():
            self._sums[name] += value
        self._count += 1

    def taken(self) -> tuple[Ring, Ring]:
        return self.seconds.taken(), self.minutes.taken()


class History:
    """The broker's series and each worker's; `add` from the router's loop, `copy` from any thread."""

    def __init__(self) -> None:
        self.broker = Series(BROKER)
        self.workers: dict[str, Series] = {}
        self._last: tuple[float, Mapping[str, float | None]] | None = None  # the last snapshot's time and counters
        self._lock = threading.Lock()

    def add(self, at: float, connections: int, counts: Mapping[str, float | None], workers: dict[str, dict]) -> None:
        """One second: the connections, the counters of BROKER's rates (None: unknown) and each worker's
        report (its `cpu`, `rss`). The first call only notes the counters: a rate needs two."""
        last, self._last = self._last, (at, counts)
        if last is None:
            return
        values = {name: _number(rate(count, last[1].get(name), at - last[0])) for name, count in counts.items()}
        with self._lock:
            self.broker.add(at, {"connections": float(connections), **values})
            for label, report in workers.items():
                series = self.workers.get(label)
                if series is None and len(self.workers) < WORKERS:
                    series = self.workers[label] = Series(WORKER)
                if series is not None:
                    series.add(at, {"cpu": float(report["cpu"]), "rss": float(report["rss"])})

    def copy(self) -> dict:
        """Everything kept, as the overview draws it: {"broker": {"seconds": {...}, "minutes": {...}},
        "workers": {label: the same}}."""
        with self._lock:  # copied whole under the lock, formatted after it: the loop never waits for a page
            broker = self.broker.taken()
            workers = {label: series.taken() for label, series in self.workers.items()}
        return {"broker": _shown(broker), "workers": {label: _shown(rings) for label, rings in workers.items()}}


def _shown(rings: tuple[Ring, Ring]) -> dict[str, dict[str, list[float | None]]]:
    return {"seconds": rings[0].shown(), "minutes": rings[1].shown()}


def _number(value: float | None) -> float:
    return NAN if value is None else value
