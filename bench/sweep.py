"""`python -m plexmq.bench.sweep` (or `plexmq bench sweep`): one scenario against plexmq with --workers 1..K.

Why: the right worker count depends on the cores left to the router and the load generator; this
measures it instead of guessing. The scenario is a preset name (see bench.presets) or a scenario
with the same options as `plexmq bench`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile

from plexmq.bench import brokers, cli, presets, report
from plexmq.bench.brokers import BrokerSpec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plexmq.bench.sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", help=f"a preset ({', '.join(presets.PRESETS)}) or conn/fanin/fanout/p2p")
    parser.add_argument("-K", "--max-workers", type=int, default=3, help="sweep --workers 1..K (3)")
    parser.add_argument("--plexmq-arg", action="append", default=[], help="extra argument for plexmq serve")
    cli.add_options(parser, scenario=False)
    ns = parser.parse_args(argv)
    results = []
    log_dir = tempfile.mkdtemp(prefix="plexbench-sweep-")
    for workers in range(1, ns.max_workers + 1):
        opts = cli.scenario_options(parser, ns, ns.scenario)
        print(f"== {ns.scenario} on plexmq --workers {workers}", file=sys.stderr, flush=True)
        r = brokers.measure(BrokerSpec(f"plexmq-w{workers}", "plexmq", workers=workers, extra=ns.plexmq_arg), opts, log_dir)
        r["broker_workers"] = workers
        results.append(r)
        if not ns.quiet:
            print(report.table(r), file=sys.stderr)
    kind = "conn" if results[0]["scenario"] == "conn" else "pubsub"
    metrics = presets.METRICS[kind]
    rows = [["workers", *(label for label, _, _ in metrics)]]
    for r in results:
        rows.append([str(r["broker_workers"]), *(_fmt(presets.metric(r, key), d) for _, key, d in metrics)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    print("\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows))
    if ns.json:
        print(json.dumps(results, indent=1))
    return 0


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


if __name__ == "__main__":
    sys.exit(main())
