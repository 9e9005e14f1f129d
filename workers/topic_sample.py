"""Which topics a worker's clients publish to most, for the console's busiest topics
(router/topic_rates.py merges what every worker says).

Most messages never reach the router (a worker delivers them to its own subscribers,
docs/architecture.md §4), so the worker that reads a PUBLISH is the one place that sees every
message. Counting every topic there would put a dict update on the fan-out path; instead the worker
keeps a countdown (`Worker.sample_in`) that each PUBLISH decrements (a run of QoS 0 packets by its
count) and only when it reaches zero calls `take`: one PUBLISH in SAMPLE is tallied, by tenant and
topic, and each tally stands for SAMPLE messages. The tallies are bounded (TOPICS per tenant: a topic
not yet tallied is left out when they are full) and emptied by each once-a-second STATS report, which
carries each tenant's TOP topics.
"""

from __future__ import annotations

import heapq
from collections import Counter

SAMPLE = 64  # one PUBLISH in SAMPLE is tallied
TOPICS = 256  # topics tallied per tenant between two reports
TOP = 5  # topics per tenant in each report


class TopicSample:
    """The sampled topics since the last report: tenant -> topic -> samples."""

    __slots__ = ("tallies",)

    def __init__(self) -> None:
        self.tallies: dict[str, Counter[str]] = {}

    def take(self, tenant: str, topic: bytes, countdown: int) -> int:
        """The countdown reached zero (or below, by a run) on a PUBLISH to `topic`: tally the samples it
        stands for; the next countdown."""
        samples = 1 + -countdown // SAMPLE
        tally = self.tallies.get(tenant)
        if tally is None:
            tally = self.tallies[tenant] = Counter()
        name = topic.decode()
        if name in tally or len(tally) < TOPICS:
            tally[name] += samples
        return countdown + samples * SAMPLE

    def report(self) -> dict[str, list[list]]:
        """Each tenant's TOP topics with the messages they stand for ([topic, estimate]), and a fresh start."""
        report = {tenant: [[topic, count * SAMPLE] for topic, count in heapq.nlargest(TOP, tally.items(),
                                                                                     key=lambda item: item[1])]
                  for tenant, tally in self.tallies.items()}
        self.tallies = {}
        return report
