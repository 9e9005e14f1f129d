"""`plexmq_bridge_*` on the router's /metrics, from the router's snapshot (`Stats.snapshot["bridges"]`:
the bridge process's status file, read once a second, with each bridge's queue in the router), so a
scrape never reads a file nor the router's live state."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from plexmq.router.ops.stats import Stats


class BridgeMetrics:
    """A prometheus-client collector of the bridges the router's snapshot holds."""

    def __init__(self, stats: Stats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        bridges = self.stats.snapshot.get("bridges")
        if not bridges:
            return
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "connected": GaugeMetricFamily("plexmq_bridge_connected", "Whether both of a bridge's links are up",
                                           labels=["bridge"]),
            "queued": GaugeMetricFamily("plexmq_bridge_queued_messages", "Messages waiting in the router for a "
                                        "bridge's local session, not yet sent to the bridge", labels=["bridge"]),
            "held": GaugeMetricFamily("plexmq_bridge_held_messages", "Messages a bridge has taken and the other "
                                      "broker not yet acknowledged", labels=["bridge"]),
            "sent": CounterMetricFamily("plexmq_bridge_messages_sent", "Messages a bridge passed to the remote broker "
                                        "(since the bridge process started)", labels=["bridge"]),
            "received": CounterMetricFamily("plexmq_bridge_messages_received", "Messages a bridge brought from the "
                                            "remote broker", labels=["bridge"]),
            "dropped": CounterMetricFamily("plexmq_bridge_messages_dropped", "Messages a bridge dropped (no rule, "
                                           "refused, QoS 0 while a side was down)", labels=["bridge"]),
        }
        for name, bridge in bridges.items():
            for key, family in families.items():
                value = bridge["state"] == "connected" if key == "connected" else bridge[key]
                family.add_metric([name], float(value))
        yield from families.values()
