"""`python -m plexmq.bench.tenants`: the noisy-neighbour benchmark of issue 23.

One `plexmq serve` with two tenants: A with a message_rate, B without. B's load (p2p pairs at a fixed
rate: its throughput and end-to-end latency) runs alone, then again while A's publishers flood as fast
as they can (open loop: they write without waiting for their subscriber). A noisy tenant must not
starve the others: B's throughput and p99 latency with A flooding should stay within a stated margin
of B alone, and A should get about its limit (its share on each worker, workers/tenant_limits.py).
First, on a broker of their own, A's publishers alone: as B publishing at A's limit themselves, then held
at it, for the broker's CPU per admitted message (`--cost-duration`; a throttled client must cost no more
per message than one under its limit).

Both loads are the project's own generator (bench/runner.py), its clients logging in as `NAME@a` and
`NAME@b` (tenant_separator "@"); A's runs in a child process (`python -m plexmq.bench fanin ...`),
started `--lead` seconds before B's run so that B is measured with A already flooding, and long
enough to outlast it. The C generator mqload cannot name a user, so it cannot name a tenant.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from plexmq.bench import runner
from plexmq.bench.brokers import BrokerSpec, RunningBroker
from plexmq.bench.plan import Options

CONFIG = """tenant_separator = "@"

[tenants.a]
message_rate = {rate}

[tenants.b]
"""
A_TAIL_S = 3.0  # A floods this much longer than B's run could need beyond its duration (connects, drain)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m plexmq.bench.tenants", description=__doc__.split("\n\n")[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=1, help="broker workers (1: both tenants share one)")
    parser.add_argument("--a-rate", type=float, default=1000.0, help="tenant A's message_rate, msgs/s (1000)")
    parser.add_argument("--a-pubs", type=int, default=4, help="A's publishers, flooding (4)")
    parser.add_argument("--b-pairs", type=int, default=10, help="B's publisher -> subscriber pairs (10)")
    parser.add_argument("--b-rate", type=float, default=100.0, help="msgs/s per B publisher (100)")
    parser.add_argument("-q", "--qos", type=int, choices=(0, 1, 2), default=0, help="B's QoS (0)")
    parser.add_argument("-s", "--size", type=int, default=64, help="payload bytes of both (64)")
    parser.add_argument("-d", "--duration", type=float, default=10.0, help="seconds B publishes in each run (10)")
    parser.add_argument("--lead", type=float, default=2.0, help="seconds A floods before B's second run starts (2)")
    parser.add_argument("--procs", type=int, default=1, help="generator processes of each load (1)")
    parser.add_argument("--cost-duration", type=float, default=5.0,
                        help="seconds of each run of A alone, throttled and not, for its CPU per message (5; 0: none)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (table to stderr)")
    return parser.parse_args(argv)


def b_options(ns: argparse.Namespace, port: int, pid: int) -> Options:
    return Options("p2p", port=port, broker_pid=pid, clients=ns.b_pairs, rate=ns.b_rate, qos=ns.qos, size=ns.size,
                   duration=ns.duration, username="bench@b", client_prefix="b-", topic_prefix="b", procs=ns.procs,
                   drain=2.0, progress=False)


def flood(ns: argparse.Namespace, port: int, seconds: float, tenant: str = "a", rate: float = 0.0,
          broker_pid: int = 0) -> subprocess.Popen[bytes]:
    """`ns.a_pubs` publishers of `tenant` to one subscriber for `seconds`, each at `rate` msgs/s (0: open
    loop at full speed); its report on stdout, with the broker's CPU in its window if `broker_pid` is given."""
    return subprocess.Popen(
        [sys.executable, "-m", "plexmq.bench", "fanin", "-p", str(port), "-P", str(ns.a_pubs), "-S", "1", "-r", str(rate),
         "-e", "0", "-s", str(ns.size), "-d", f"{seconds:.1f}", "--username", f"flood@{tenant}", "--client-prefix",
         f"{tenant}-", "--topic-prefix", tenant, "--procs", str(ns.procs), "--drain", "1", "--settle", "0.1", "--quiet",
         "--json", *(["--broker-pid", str(broker_pid)] if broker_pid else [])],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


def cost(ns: argparse.Namespace, config: str, log_dir: str) -> dict:
    """The broker's CPU per admitted message of A's publishers alone, as B (no limit) publishing at A's
    rate themselves and then held at A's message_rate (flooding), on a broker of their own: a flooding
    client's backlog outlasts its run, read at the rate long after (issue 34: the throttled path must
    cost no more per message)."""
    found = {}
    broker = RunningBroker(BrokerSpec("plexmq", "plexmq", workers=ns.workers, extra=["--config", config]), log_dir)
    try:
        for name, tenant, rate in (("unthrottled", "b", ns.a_rate / ns.a_pubs), ("throttled", "a", 0.0)):
            run = flood(ns, broker.port, ns.cost_duration, tenant, rate, broker.pid)
            r = json.loads(run.communicate(timeout=ns.cost_duration + 60)[0])
            admitted = r["msgs_out_per_s"] * r["duration"]
            found[name] = {"msgs_per_s": r["msgs_out_per_s"], "broker_cpu_pct": r["broker_cpu_pct"],
                           "us_per_msg": r["broker_cpu_s"] / admitted * 1e6 if admitted else None}
    finally:
        broker.stop()
    return found


def summary(alone: dict, flooded: dict, a: dict, a_cost: dict, ns: argparse.Namespace) -> dict:
    """What the table shows, as the --json document."""
    def b(r: dict) -> dict:
        lat = r["latency_ms"]
        return {"msgs_per_s": r["msgs_out_per_s"], "p50_ms": lat["p50"], "p99_ms": lat["p99"],
                "lost": r["lost"], "ok": r["ok"]}
    return {"workers": ns.workers, "b_alone": b(alone), "b_with_a": b(flooded),
            "a_limit_per_s": ns.a_rate, "a_achieved_per_s": a.get("msgs_out_per_s"), "a_sent_per_s": a.get("msgs_in_per_s"),
            "a_cost": a_cost}


def _n(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def table(s: dict) -> str:
    rows = [("B alone", s["b_alone"]), ("B with A flooding", s["b_with_a"])]
    lines = [f"{'':20} {'msgs/s':>10} {'p50 ms':>9} {'p99 ms':>9} {'lost':>6}"]
    lines += [f"{name:20} {_n(r['msgs_per_s']):>10} {_n(r['p50_ms'], 2):>9} {_n(r['p99_ms'], 2):>9} {r['lost']:>6}"
              for name, r in rows]
    lines.append(f"A achieved {_n(s['a_achieved_per_s'])} msgs/s of its limit {_n(s['a_limit_per_s'])} "
                 f"(its publishers wrote {_n(s['a_sent_per_s'])} msgs/s; {s['workers']} worker(s))")
    for name, r in s["a_cost"].items():
        lines.append(f"A alone, {name}: {_n(r['msgs_per_s'])} msgs/s, broker CPU {_n(r['broker_cpu_pct'], 1)} %, "
                     f"{_n(r['us_per_msg'], 1)} µs per message")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ns = parse(argv)
    log_dir = tempfile.mkdtemp(prefix="plexbench-tenants-")
    config = os.path.join(log_dir, "tenants.toml")
    with open(config, "w") as f:
        f.write(CONFIG.format(rate=float(ns.a_rate)))
    a_cost = cost(ns, config, log_dir) if ns.cost_duration else {}
    broker = RunningBroker(BrokerSpec("plexmq", "plexmq", workers=ns.workers, extra=["--config", config]), log_dir)
    try:
        alone = runner.run(b_options(ns, broker.port, broker.pid))
        a_run = flood(ns, broker.port, ns.lead + ns.duration + A_TAIL_S)
        time.sleep(ns.lead)  # A connected and flooding before B's clients connect
        flooded = runner.run(b_options(ns, broker.port, broker.pid))
        out, _ = a_run.communicate(timeout=ns.lead + ns.duration + A_TAIL_S + 60)
    finally:
        broker.stop()
    a = json.loads(out) if out.strip() else {}
    result = summary(alone, flooded, a, a_cost, ns)
    if ns.json:
        print(json.dumps(result, indent=2))
        print(table(result), file=sys.stderr)
    else:
        print(table(result))
    return 0 if alone["ok"] and flooded["ok"] and a else 1


if __name__ == "__main__":
    sys.exit(main())
