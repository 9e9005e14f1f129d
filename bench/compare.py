"""`python -m plexmq.bench.compare` (or `plexmq bench compare`): the same scenarios, the same load generator,
against plexmq and mosquitto (Nagle on, and `set_tcp_nodelay true`) in one run; a table with ratios.

Every (scenario, broker) pair gets a fresh broker on a free loopback port. A broker that cannot
take a scenario (one mosquitto process against 100k connections and a 20,000 open-file limit) is
reported as such rather than run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile

from plexmq.bench import brokers, limits, presets, report, wire
from plexmq.bench.brokers import BrokerSpec

BROKERS = ("plexmq", "mosquitto", "mosquitto-nodelay")
PER_WORKER = 18_000  # connections a plexmq worker takes under the 20,000 open-file limit, with room to spare


def spec(name: str, workers: int, max_queued: int, extra: list[str]) -> BrokerSpec:
    if name in ("plexmq-nodes", "plexmq-nodes-direct"):  # the same worker count, over two nodes of one router
        return BrokerSpec(name, "nodes", workers=max(workers // 2, 1), max_queued=max_queued, extra=extra,
                          direct=name.endswith("direct"))  # bench/topology.py
    if name.startswith("plexmq"):
        return BrokerSpec(name, "plexmq", workers=workers, max_queued=max_queued, extra=extra)
    if name in ("mosquitto", "mosquitto-nodelay"):
        return BrokerSpec(name, "mosquitto", nodelay=name.endswith("nodelay"), max_queued=max_queued)
    raise SystemExit(f"unknown broker {name!r}: one of {', '.join(BROKERS)}, plexmq-nodes, plexmq-nodes-direct")


def plexmq_workers(scen: str, connections: int, default: int) -> int:
    """The workers a scenario is stated with (presets.WORKERS), else `default`, and never fewer than
    hold its connections."""
    return max(presets.WORKERS.get(scen, default), math.ceil(connections / PER_WORKER))


def cannot(s: BrokerSpec, connections: int) -> str | None:
    """Why this broker cannot hold the scenario's connections, or None."""
    cap = limits.fd_hard_limit() - 100
    if s.kind == "mosquitto" and connections > cap:
        return f"cannot: one mosquitto process stops at the open-file limit ({limits.fd_hard_limit():,})"
    return None


def _fmt(value: float | None, digits: int) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def table(results: dict[str, dict[str, dict]], names: list[str]) -> str:
    """Scenario x metric rows, one column per broker, then plexmq's ratio to each other broker."""
    base = names[0]
    others = names[1:]
    header = ["scenario", "metric", *names, *(f"{base}/{o}" for o in others)]
    rows = [header]
    for scen, by_broker in results.items():
        kind = "conn" if presets.PRESETS[scen]["scenario"] == "conn" else "pubsub"
        first = True
        for label, key, digits in presets.METRICS[kind]:
            cells = [scen if first else "", label]
            values = []
            for name in names:
                r = by_broker.get(name, {})
                v = None if "skipped" in r else presets.metric(r, key) if r else None
                values.append(v)
                cells.append(r["skipped"] if "skipped" in r and first else _fmt(v, digits))
            for v in values[1:]:
                cells.append(f"{values[0] / v:.2f}x" if values[0] is not None and v else "-")
            rows.append(cells)
            first = False
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    groups = "; ".join(f"{g} = {','.join(members)}" for g, members in presets.GROUPS.items())
    parser = argparse.ArgumentParser(prog="python -m plexmq.bench.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default=",".join(presets.DEFAULT),
                        help=f"comma-separated, of: {', '.join(presets.PRESETS)}, or a group: {groups} "
                             f"(default {','.join(presets.DEFAULT)})")
    parser.add_argument("--brokers", default=",".join(BROKERS), help=f"comma-separated, first is the base ({','.join(BROKERS)})")
    parser.add_argument("-d", "--duration", type=float,
                        help="publish seconds per run (default: the preset's, 10 where it names none)")
    parser.add_argument("--workers", type=int, default=1,
                        help="plexmq workers where the scenario names none (1: the router needs the other core)")
    parser.add_argument("--max-queued", type=int, default=1000, help="max_queued_messages for mosquitto (1000)")
    parser.add_argument("--plexmq-arg", action="append", default=[], help="extra argument for plexmq serve")
    parser.add_argument("--procs", type=int, default=0, help="generator processes (default: cores)")
    parser.add_argument("--protocol", type=int, choices=wire.LEVELS, default=4,
                        help="MQTT protocol level of the clients: 4 = 3.1.1 (default), 5 = 5.0")
    parser.add_argument("--out", metavar="DIR", help="raw samples and compare.json go here")
    parser.add_argument("--json", action="store_true", help="print all results as JSON after the table")
    parser.add_argument("--quiet", action="store_true")
    ns = parser.parse_args(argv)
    names = ns.brokers.split(",")
    try:
        scenarios = presets.expand(ns.scenarios)
    except KeyError as exc:
        parser.error(exc.args[0])
    log_dir = tempfile.mkdtemp(prefix="plexbench-compare-")
    results: dict[str, dict[str, dict]] = {}
    for scen in scenarios:
        results[scen] = {}
        for name in names:
            opts = presets.options(scen, ns.duration, procs=ns.procs or None, protocol=ns.protocol,
                                   progress=not ns.quiet, out=f"{ns.out}/{scen}-{name}" if ns.out else None)
            s = spec(name, plexmq_workers(scen, opts.connections, ns.workers), ns.max_queued, ns.plexmq_arg)
            why = cannot(s, opts.connections)
            if why:
                results[scen][name] = {"skipped": why}
                print(f"== {scen} on {name}: {why}", file=sys.stderr)
                continue
            print(f"== {scen} on {name}", file=sys.stderr, flush=True)
            try:
                r = brokers.measure(s, opts, log_dir)
            except RuntimeError as exc:
                results[scen][name] = {"skipped": f"failed: {exc}"}
                print(f"   failed: {exc}", file=sys.stderr)
                continue
            r["broker_workers"] = None if s.kind == "mosquitto" else s.workers * (2 if s.kind == "nodes" else 1)
            results[scen][name] = r
            if not ns.quiet:
                print(report.table(r), file=sys.stderr)
    text = table(results, names)
    print(text)
    if ns.out:
        os.makedirs(ns.out, exist_ok=True)
        with open(os.path.join(ns.out, "compare.json"), "w") as f:
            json.dump(results, f, indent=1)
    if ns.json:
        print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
