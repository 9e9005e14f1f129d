"""`plexmq_bridge_*` on the router's /metrics: read at each scrape from the status file the bridge
process writes in the run dir once a second (acceptor/bridges/status.py), so the router's loop never hears of
bridges; a file older than STALE seconds (the bridge process is down) says every bridge disconnected."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import orjson
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from plexmq.acceptor.bridges.status import FILE

STALE = 5.0  # seconds


class BridgeMetrics:
    """A prometheus-client collector of the bridges of the broker whose run dir is `run_dir`."""

    def __init__(self, run_dir: str) -> None:
        self.path = os.path.join(run_dir, FILE)

    def collect(self) -> Iterator[Metric]:
        try:
            with open(self.path, "rb") as f:
                written = orjson.loads(f.read())
        except (OSError, orjson.JSONDecodeError):
            return  # no bridges (or none has written yet)
        fresh = time.time() - written["time"] < STALE
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "connected": GaugeMetricFamily("plexmq_bridge_connected", "Whether both of a bridge's links are up",
                                           labels=["bridge"]),
            "held": GaugeMetricFamily("plexmq_bridge_held_messages", "Messages a bridge has taken and the other "
                                      "broker not yet acknowledged", labels=["bridge"]),
            "sent": CounterMetricFamily("plexmq_bridge_messages_sent", "Messages a bridge passed to the remote broker "
                                        "(since the bridge process started)", labels=["bridge"]),
            "received": CounterMetricFamily("plexmq_bridge_messages_received", "Messages a bridge brought from the "
                                            "remote broker", labels=["bridge"]),
            "dropped": CounterMetricFamily("plexmq_bridge_messages_dropped", "Messages a bridge dropped (no rule, "
                                           "refused, QoS 0 while a side was down)", labels=["bridge"]),
        }
        for name, bridge in written["bridges"].items():
            for key, family in families.items():
                value = fresh and bridge["state"] == "connected" if key == "connected" else bridge[key]
                family.add_metric([name], float(value))
        yield from families.values()
