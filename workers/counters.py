"""What a worker counts of the messages and sockets it did not serve, sent once a second in `STATS`
(`Worker._report_stats`) for `$SYS` and `/metrics`. Each is incremented where a message or a socket
is left out, never per message served: the fan-out path pays nothing for them."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(slots=True)
class Counters:
    dropped: int = 0  # deliveries dropped: a full queue (max_queued_messages), expired, too large for the client
    denied: int = 0  # PUBLISHes and deliveries the ACL did not allow
    withheld: int = 0  # deliveries the receiver's read rules did not allow (counted in `denied` too)
    refused: int = 0  # sockets refused for want of file descriptors
    limit_hits: Counter[tuple[str, str]] = field(default_factory=Counter)  # (tenant, limit name) -> times a limit refused

    def limit_hit(self, tenant: str, limit: str) -> None:
        """A tenant's limit refused, dropped or slowed something (issue 23: the operator sees who hit which)."""
        self.limit_hits[tenant, limit] += 1
