"""`python -m plexmq.bench.tenant_cost`: what declaring tenants costs a broker (issue 23).

Each run starts a fresh `plexmq serve` with N tenants declared (`t0` ... `tN-1`, tenant `t0` owning a
listener of its own) and loads it with the C generator mqload (bench/mqload.py), either on the broker's
own listener (clients in the default tenant) or on `t0`'s listener (clients in a declared tenant:
mqload sends no username, so a listener is how its clients name a tenant). With N = 0 no tenant is
declared: the broker as a user without tenants runs it. The memory part starts idle brokers with
N tenants declared and reads the resident memory of the router and of each worker, so that the cost
of one declared tenant can be stated (the difference to N = 0, divided by N).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import psutil

from plexmq.bench import brokers, compare, mqload, presets
from plexmq.bench.monitor import process_name


def config(path: str, declared: int, tenant_port: int) -> None:
    """A config file with `declared` tenants; the first owns a listener on `tenant_port`."""
    with open(path, "w") as f:
        for i in range(declared):
            f.write(f"[tenants.t{i}]\n")
            if i == 0:
                f.write(f'listeners = ["mqtt://127.0.0.1:{tenant_port}"]\n')


def spec(log_dir: str, declared: int, workers: int) -> tuple[brokers.BrokerSpec, int]:
    """A plexmq broker with `declared` tenants, and the port of `t0`'s listener (0: none)."""
    if not declared:
        return compare.spec("plexmq", workers, 1000, []), 0
    port = brokers.free_port()
    path = os.path.join(log_dir, f"tenants-{declared}-{port}.toml")
    config(path, declared, port)
    return compare.spec("plexmq", workers, 1000, ["--config", path]), port


def load(scenarios: list[str], declared: list[int], duration: float | None, workers: int, binary: str,
         log_dir: str) -> list[dict]:
    """One mqload run per (scenario, declared count, listener)."""
    rows = []
    for scen in scenarios:
        for count in declared:
            for via in ("default", "t0") if count else ("default",):
                opts = presets.options(scen, duration)
                s, tenant_port = spec(log_dir, count, compare.plexmq_workers(scen, opts.connections, workers))
                print(f"== {scen}, {count} tenants declared, clients in tenant {via}", file=sys.stderr, flush=True)
                result = mqload.measure(s, opts, binary, log_dir, tenant_port if via == "t0" else 0)
                rows.append({**result, "scenario": scen, "declared": count, "tenant": via})
    return rows


def memory(declared: list[int], workers: int, log_dir: str) -> list[dict]:
    """Resident memory (bytes) of the router and the workers of an idle broker with each count declared."""
    rows = []
    for count in declared:
        s, _port = spec(log_dir, count, workers)
        broker = brokers.RunningBroker(s, log_dir)
        try:
            rss: dict[str, int] = {}
            for proc in psutil.Process(broker.pid).children(recursive=True):
                name = process_name(proc)
                if name == "router" or name.startswith("worker"):
                    rss[name] = proc.memory_info().rss
            rows.append({"declared": count, "rss": rss})
        finally:
            broker.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plexmq.bench.tenant_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default="fanin0,fanout0,fanin1,connstorm15k", help="mqload presets (bench/presets.py)")
    parser.add_argument("--declared", default="0,1000", help="tenant counts to declare, comma-separated")
    parser.add_argument("--memory", default="0,1000,10000", help="tenant counts for the idle memory part ('': skip it)")
    parser.add_argument("-d", "--duration", type=float, help="publish seconds per run (default: the preset's)")
    parser.add_argument("--workers", type=int, default=1, help="plexmq workers where the scenario names none (1)")
    mqload.binary_option(parser)
    parser.add_argument("--json", action="store_true", help="print all results as JSON after the tables")
    ns = parser.parse_args(argv)
    mqload.check_binary(parser, ns.mqload)
    log_dir = tempfile.mkdtemp(prefix="plexbench-tenants-")
    counts = [int(n) for n in ns.declared.split(",")]
    rows = load(ns.scenarios.split(","), counts, ns.duration, ns.workers, ns.mqload, log_dir) if ns.scenarios else []
    print("| scenario | tenants declared | clients in | msgs/s out | conn/s | broker µs/conn | p99 ms |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(f"| {row['scenario']} | {row['declared']} | {row['tenant']} | {row['msgs_out_per_s']:,} | "
              f"{row['connect_rate']:,} | {row['broker_connect_us'] or ''} | {row['latency_ms']['p99']:.2f} |")
    mem = memory([int(n) for n in ns.memory.split(",")], ns.workers, log_dir) if ns.memory else []
    if mem:
        base = mem[0]["rss"]
        print("\n| tenants declared | process | RSS MiB | bytes per declared tenant |")
        print("| ---: | --- | ---: | ---: |")
        for row in mem:
            for name, rss in sorted(row["rss"].items()):
                per = (rss - base.get(name, rss)) / row["declared"] if row["declared"] else 0
                print(f"| {row['declared']} | {name} | {rss / 2**20:.1f} | {per:,.0f} |")
    if ns.json:
        print(json.dumps({"load": rows, "memory": mem}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
