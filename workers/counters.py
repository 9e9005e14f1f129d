"""What a worker counts of the messages and sockets it did not serve, sent once a second in `STATS`
(`Worker._report_stats`) for `$SYS` and `/metrics`. Each is incremented where a message or a socket
is left out, never per message served: the fan-out path pays nothing for them.

Per tenant (issue 23), a `Tally` that each connection holds (`Connection.tally`, its tenant's): what
the worker counted anyway (local deliveries, drops, denials) goes to it instead of, or beside, the
worker-wide figure, and bytes are added once per read and once per write, never per message."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(slots=True)
class Tally:
    """One tenant's numbers in this worker (`STATS.tenants`)."""
    connections: int = 0  # past their CONNACK
    received: int = 0  # PUBLISHes delivered here without the router (the router counts the others)
    sent: int = 0  # their copies to local subscribers
    bytes_in: int = 0  # read from its clients' sockets, MQTT bytes (a WebSocket's frames unwrapped)
    bytes_out: int = 0  # written to them
    dropped: int = 0  # deliveries to its clients dropped (as `Counters.dropped`)
    denied: int = 0  # its clients' PUBLISHes and deliveries the ACL did not allow
    refused: Counter[str] = field(default_factory=Counter)  # CONNACK refusal reason -> connections refused


@dataclass(slots=True)
class Counters:
    dropped: int = 0  # deliveries dropped: a full queue (max_queued_messages), expired, too large for the client
    denied: int = 0  # PUBLISHes and deliveries the ACL did not allow
    withheld: int = 0  # deliveries the receiver's read rules did not allow (counted in `denied` too)
    refused: int = 0  # sockets refused for want of file descriptors
    limit_hits: Counter[tuple[str, str]] = field(default_factory=Counter)  # (tenant, limit name) -> times a limit refused
    # (metrics: per tenant) tenant -> its tally, made for a tenant when a connection is first placed in it
    tenants: dict[str, Tally] = field(default_factory=dict)

    def limit_hit(self, tenant: str, limit: str) -> None:
        """A tenant's limit refused, dropped or slowed something (issue 23: the operator sees who hit which)."""
        self.limit_hits[tenant, limit] += 1

    def tally(self, tenant: str) -> Tally:
        """The tally of `tenant`, made when first asked (only for tenants a connection is placed in)."""
        found = self.tenants.get(tenant)
        if found is None:
            found = self.tenants[tenant] = Tally()
        return found

    def by_tenant(self) -> dict[str, dict]:
        """Each tenant's tally with its limit hits, as STATS carries them."""
        for tenant, _limit in self.limit_hits:
            self.tally(tenant)
        hits: dict[str, dict[str, int]] = {name: {} for name in self.tenants}
        for (tenant, limit), count in self.limit_hits.items():
            hits[tenant][limit] = count
        report = {name: {"connections": t.connections, "received": t.received, "sent": t.sent, "bytes_in": t.bytes_in,
                         "bytes_out": t.bytes_out, "dropped": t.dropped, "denied": t.denied, "refused": t.refused,
                         "limit_hits": hits[name]} for name, t in self.tenants.items()}
        return report
