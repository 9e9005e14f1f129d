"""`python -m plexmq.bench.scale` (or `plexmq bench scale`): what each worker count gives, and what the
router spends per message (issue 35).

Sweeps `plexmq serve --workers 1..K`, a fresh broker per run, with the C generator mqload as the load:
fan-in and fan-out at QoS 0, point-to-point at QoS 0 and 1 with every pair across two workers and with
every pair on one worker, and the connect rate. The acceptor hands each socket to the least-loaded
worker, so with c pairs (subscribers connect first) subscriber i lands on worker i mod K and publisher
i on (c + i) mod K: c a multiple of K puts each pair on one worker, one pair more puts every pair
across two. The table gives msgs/s (connects/s), the ratio to one worker, the router's CPU per message
delivered (µs: what a message through the router costs the one process every worker shares), and
mosquitto's figure beside (one process: the same at every count).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from collections.abc import Callable

from plexmq.bench import compare, mqload
from plexmq.bench.plan import Options, with_defaults

PAIRS = 200  # point-to-point pairs, rounded up to a multiple of the worker count
# name -> (what it measures, its Options at a worker count)
SCENARIOS: dict[str, tuple[str, Callable[[int], Options]]] = {
    "fanin0": ("100 publishers -> 1 subscriber, QoS 0", lambda k: Options("fanin", pubs=100, subs=1)),
    "fanout0": ("1 publisher -> 1,000 subscribers, QoS 0", lambda k: Options("fanout", pubs=1, subs=1000)),
    "p2p0-beside": ("pairs on one worker, QoS 0", lambda k: Options("p2p", clients=_pairs(k))),
    "p2p0-across": ("pairs across two workers, QoS 0", lambda k: Options("p2p", clients=_pairs(k) + 1)),
    "p2p1-beside": ("pairs on one worker, QoS 1", lambda k: Options("p2p", clients=_pairs(k), qos=1)),
    "p2p1-across": ("pairs across two workers, QoS 1", lambda k: Options("p2p", clients=_pairs(k) + 1, qos=1)),
    "connect": ("10,000 connections at once", lambda k: Options("conn", clients=10_000, duration=3.0, keepalive=60)),
}


def _pairs(workers: int) -> int:
    return math.ceil(PAIRS / workers) * workers


def options(name: str, workers: int, duration: float) -> Options:
    opts = SCENARIOS[name][1](workers)
    if opts.scenario != "conn":
        opts.duration = duration
    return with_defaults(opts)


def rate(result: dict) -> float | None:
    """A run's figure: msgs/s delivered, or connects/s."""
    if "skipped" in result:
        return None
    return result["connect_rate"] if result["scenario"] == "conn" else result["msgs_out_per_s"]


def table(results: dict[str, dict[str, dict]], counts: list[int], others: list[str]) -> str:
    """One row per scenario and worker count: its figure, the ratio to one worker, the router's µs per
    message, the broker's CPU; each other broker's figure on the scenario's first row."""
    rows = [["scenario", "workers", "msgs/s (conn/s)", "x 1 worker", "router µs/msg", "broker cpu %", *others]]
    for name, by_broker in results.items():
        base = rate(by_broker.get("plexmq-w1", {"skipped": ""}))
        for i, k in enumerate(counts):
            r = by_broker[f"plexmq-w{k}"]
            got = rate(r)
            ratio = f"{got / base:.2f}" if got and base else "-"
            conn = r.get("scenario") == "conn"
            router = r.get("router_connect_us") if conn else r.get("router_us_per_msg")
            cpu = r.get("broker_connect_cpu_pct") if conn else r.get("broker_cpu_pct")
            rows.append([name if i == 0 else "", str(k), _fmt(got), ratio, _fmt(router, 2), _fmt(cpu),
                         *(_fmt(rate(by_broker[o])) if i == 0 else "" for o in others)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    for qos in (0, 1):  # issue 35's measure: pairs across workers against pairs on one, in the same run
        beside, across = results.get(f"p2p{qos}-beside"), results.get(f"p2p{qos}-across")
        for k in counts[1:] if beside and across else []:
            got, base = rate(across[f"plexmq-w{k}"]), rate(beside[f"plexmq-w{k}"])  # type: ignore[index]  # both there
            if got and base:
                lines.append(f"QoS {qos}, --workers {k}: pairs across workers get {got / base:.2f} of pairs on one")
    return "\n".join(lines)


def _fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plexmq.bench.scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("-K", "--max-workers", type=int, default=2, help="sweep --workers 1..K (2)")
    parser.add_argument("--workers", help="the worker counts instead, comma-separated (1,2,4,8,14)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"comma-separated, of: {', '.join(SCENARIOS)} (default all)")
    parser.add_argument("--brokers", default="mosquitto", help="others beside plexmq, comma-separated ('' none)")
    parser.add_argument("--plexmq-arg", action="append", default=[],
                        help="extra argument for plexmq serve (--plexmq-arg=--config --plexmq-arg=FILE)")
    parser.add_argument("-d", "--duration", type=float, default=8.0, help="publish seconds per run (8)")
    mqload.binary_option(parser)
    parser.add_argument("--json", action="store_true", help="print all results as JSON after the table")
    ns = parser.parse_args(argv)
    mqload.check_binary(parser, ns.mqload)
    names = [n for n in ns.scenarios.split(",") if n]
    unknown = set(names) - set(SCENARIOS)
    if unknown:
        parser.error(f"--scenarios: unknown {', '.join(sorted(unknown))}")
    counts = [int(k) for k in ns.workers.split(",")] if ns.workers else list(range(1, ns.max_workers + 1))
    others = [o for o in ns.brokers.split(",") if o]
    log_dir = tempfile.mkdtemp(prefix="plexbench-scale-")
    results: dict[str, dict[str, dict]] = {}
    for name in names:
        results[name] = {}
        runs = [(f"plexmq-w{k}", compare.spec("plexmq", k, 1000, ns.plexmq_arg), k) for k in counts]
        runs += [(o, compare.spec(o, 1, 1000, []), max(counts)) for o in others]
        for label, spec, k in runs:
            opts = options(name, k, ns.duration)
            why = compare.cannot(spec, opts.connections)
            print(f"== {name} on {label}{': ' + why if why else ''}", file=sys.stderr, flush=True)
            try:
                results[name][label] = {"skipped": why} if why else mqload.measure(spec, opts, ns.mqload, log_dir)
            except RuntimeError as exc:
                results[name][label] = {"skipped": f"failed: {exc}"}
    print(table(results, counts, others))
    if ns.json:
        print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
