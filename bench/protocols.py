"""`python -m plexmq.bench.protocols` (or `plexmq bench protocols`): the same scenarios with MQTT 3.1.1 and
5.0 clients against one plexmq build, side by side, with the ratio 5.0/3.1.1.

Why: 5.0 clients should cost the broker about what 3.1.1 clients cost (within 10 %). On a
shared machine the load drifts, so the runs alternate (3.1.1 first in odd repetitions, 5.0 first in
even ones) and the table shows the median of the repetitions next to each run's value. Every run gets
a fresh broker, as in bench.compare.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

from plexmq.bench import brokers, presets, report, wire
from plexmq.bench.brokers import BrokerSpec

DEFAULT = ("fanin0", "fanin1", "fanout0", "fanout1")


def table(results: dict[str, dict[int, list[dict]]]) -> str:
    """Scenario x metric rows: each level's runs and median, then the ratio of the medians."""
    rows = [["scenario", "metric", "3.1.1 runs", "3.1.1", "5.0 runs", "5.0", "5.0/3.1.1"]]
    for scen, by_level in results.items():
        for i, (label, key, digits) in enumerate(presets.METRICS["pubsub"]):
            cells = [scen if i == 0 else "", label]
            medians = []
            for level in wire.LEVELS:
                values = [presets.metric(r, key) for r in by_level[level]]
                known = [v for v in values if v is not None]
                median = statistics.median(known) if known else None
                medians.append(median)
                cells += [" / ".join(_fmt(v, digits) for v in values), _fmt(median, digits)]
            base, new = medians
            cells.append(f"{new / base:.2f}" if base and new is not None else "-")
            rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plexmq.bench.protocols", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default=",".join(DEFAULT),
                        help=f"comma-separated presets, of: {', '.join(presets.PRESETS)} (default {','.join(DEFAULT)})")
    parser.add_argument("-n", "--repeat", type=int, default=3, help="runs per scenario and level (3)")
    parser.add_argument("-d", "--duration", type=float, default=10.0, help="publish seconds per run (10)")
    parser.add_argument("--workers", type=int, default=1, help="plexmq workers (1: the router needs the other core)")
    parser.add_argument("--plexmq-arg", action="append", default=[], help="extra argument for plexmq serve")
    parser.add_argument("--procs", type=int, default=0, help="generator processes (default: cores)")
    parser.add_argument("--json", action="store_true", help="print all results as JSON after the table")
    parser.add_argument("--quiet", action="store_true")
    ns = parser.parse_args(argv)
    scenarios = ns.scenarios.split(",")
    unknown = [s for s in scenarios if s not in presets.PRESETS]
    if unknown:
        parser.error(f"unknown scenario {unknown[0]!r}: one of {', '.join(presets.PRESETS)}")
    log_dir = tempfile.mkdtemp(prefix="plexbench-protocols-")
    results: dict[str, dict[int, list[dict]]] = {s: {level: [] for level in wire.LEVELS} for s in scenarios}
    for rep in range(ns.repeat):
        for scen in scenarios:
            for level in wire.LEVELS if rep % 2 == 0 else reversed(wire.LEVELS):
                opts = presets.options(scen, ns.duration, procs=ns.procs or None, protocol=level,
                                       progress=not ns.quiet)
                print(f"== {scen} with MQTT {wire.NAMES[level]} clients, run {rep + 1}", file=sys.stderr, flush=True)
                spec = BrokerSpec("plexmq", "plexmq", workers=ns.workers, extra=ns.plexmq_arg)
                r = brokers.measure(spec, opts, log_dir)
                r["load_avg"] = os.getloadavg()
                results[scen][level].append(r)
                if not ns.quiet:
                    print(report.table(r), file=sys.stderr)
    print(table(results))
    if ns.json:
        print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
