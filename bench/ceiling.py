"""`python -m plexmq.bench.ceiling`: the most messages a second one router routes, the limit of a router with
nodes (docs/architecture.md, section 12).

A router and two nodes (bench/topology.py) on this host; p2p pairs at max rate whose publisher and
subscriber sit on different nodes, so that every message passes through the router. The router's
own CPU time over the whole run (its connects included) gives messages per router CPU-second: where
the router is not yet saturated (the generator and the nodes share the cores), that is the rate it
would reach with a core of its own.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

import psutil

from plexmq.bench import brokers, runner
from plexmq.bench.brokers import BrokerSpec
from plexmq.bench.monitor import cpu_seconds, process_name
from plexmq.bench.plan import Options


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plexmq.bench.ceiling", description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--pairs", type=int, default=200, help="p2p pairs, each across the two nodes (200)")
    parser.add_argument("-q", "--qos", type=int, choices=(0, 1), default=0)
    parser.add_argument("-d", "--duration", type=float, default=10.0, help="publish seconds (10)")
    parser.add_argument("--workers", type=int, default=1, help="workers per node (1)")
    parser.add_argument("--procs", type=int, default=0, help="generator processes (default: cores)")
    parser.add_argument("--json", action="store_true")
    ns = parser.parse_args(argv)
    broker = brokers.RunningBroker(BrokerSpec("plexmq-nodes", "nodes", workers=ns.workers),
                                   tempfile.mkdtemp(prefix="plexbench-ceiling-"))
    try:
        router = next(p for p in psutil.Process(broker.pid).children(recursive=True) if process_name(p) == "router")
        opts = Options("p2p", port=broker.port, ports=broker.ports, clients=ns.pairs, qos=ns.qos, rate=0.0,
                       duration=ns.duration, broker_pid=broker.pid, procs=ns.procs, progress=False)
        before, started = cpu_seconds([router]), time.monotonic()
        result = runner.run(opts)
        router_s, wall = cpu_seconds([router]) - before, time.monotonic() - started
    finally:
        broker.stop()
    routed = result["received"]
    summary = {"pairs": ns.pairs, "qos": ns.qos, "msgs_per_s": result["msgs_in_per_s"], "lost": result["lost"],
               "router_cpu_pct": round(100 * router_s / wall), "router_cpu_s": round(router_s, 2),
               "msgs_per_router_cpu_s": round(routed / router_s) if router_s else None,
               "broker_cpu_pct": result["broker_cpu_pct"], "p99_ms": result["latency_ms"].get("p99")}
    print(json.dumps(summary) if ns.json else
          f"{summary['msgs_per_s']:,} msgs/s through the router (lost {summary['lost']}), router CPU "
          f"{summary['router_cpu_pct']} % over the run: {summary['msgs_per_router_cpu_s'] or 0:,} msgs per router "
          f"CPU-second; all processes {summary['broker_cpu_pct']} %, p99 {summary['p99_ms']} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
