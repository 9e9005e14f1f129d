"""The busiest topics, for the console: estimated messages per second per topic, merged from what
every worker sampled (workers/topic_sample.py) and reported in its STATS.

The workers sample every PUBLISH their clients send, whichever path it takes (delivered there or
routed here), so the router adds nothing of its own: counting what it routes too would count those
messages twice; what the router publishes itself (wills, $SYS) is not a client's and is left out.
Each report covers about a second; the last WINDOW seconds of reports are kept and summed, which
smooths the sampling (at a few messages per second a topic is sampled less than once a second).
A topic that was not among a worker's top few in some second loses that second's share: the figure
is an estimate, and labelled so.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque

WINDOW = 10.0  # seconds of reports summed


class TopicRates:
    """The reports of the last WINDOW seconds: (time.monotonic() it came, tenant -> [[topic, messages]])."""

    __slots__ = ("reports", "started")

    def __init__(self, now: float) -> None:
        self.reports: deque[tuple[float, dict[str, list[list]]]] = deque()
        self.started = now

    def add(self, topics: dict[str, list[list]], now: float) -> None:
        """A worker's STATS report of its sampled topics."""
        if topics:
            self.reports.append((now, topics))
        self._forget(now)

    def busiest(self, tenant: str | None, count: int, now: float) -> list[tuple[str, str, float]]:
        """The `count` busiest topics (of `tenant` only; None: of every tenant) as (tenant, topic,
        estimated messages per second)."""
        self._forget(now)
        totals: Counter[tuple[str, str]] = Counter()
        for _at, topics in self.reports:
            for name, listed in topics.items() if tenant is None else ((tenant, topics.get(tenant, ())),):
                for topic, messages in listed:
                    totals[name, topic] += messages
        seconds = max(1.0, min(WINDOW, now - self.started))  # a router up for less than WINDOW has less
        return [(name, topic, messages / seconds)
                for (name, topic), messages in heapq.nlargest(count, totals.items(), key=lambda item: item[1])]

    def _forget(self, now: float) -> None:
        reports = self.reports
        while reports and reports[0][0] < now - WINDOW:
            reports.popleft()
