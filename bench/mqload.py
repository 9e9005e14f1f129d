"""`python -m plexmq.bench.mqload` (or `plexmq bench mqload`): compare's presets and table, with the independent
C generator mqload as the load instead of ours (its binary: --mqload, else `find_binary`).

Why: at light load a broker's cost depends on how its messages arrive. Our generator publishes at a
fixed rate on a 1 ms tick, so the messages of one process leave in bursts that plexmq handles in one
loop turn; mqload wakes on every delivery and sends each message when it is due, as independent
devices would. The light-load table (bench/RESULTS.md) was measured with mqload. Each (scenario, broker) pair gets a fresh
broker as in compare; the broker's CPU (all its processes) is read over mqload's publishing window.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from plexmq.bench import brokers, compare, limits, presets
from plexmq.bench.monitor import BrokerMonitor
from plexmq.bench.plan import Options
from plexmq.bench.report import per_connect_us


def find_binary() -> str:
    """The mqload to run: $MQLOAD, else `mqload` on the PATH, else a build in shared/tools/mqload beside
    this checkout or beside the working directory (an installed plexmq has no checkout to look beside);
    where none is built, the first of those places, for the message that says to build it."""
    places = [Path(os.environ["MQLOAD"])] if "MQLOAD" in os.environ else []
    on_path = shutil.which("mqload")
    places += [Path(on_path)] if on_path else []
    places += [where / "shared" / "tools" / "mqload" / "mqload" for where in (brokers.ROOT.parent, Path.cwd().parent, Path.cwd())]
    return str(next((p for p in places if os.access(p, os.X_OK)), places[0]))


DEFAULT_BINARY = find_binary()


def binary_option(parser: argparse.ArgumentParser) -> None:
    """--mqload, for every tool that runs it."""
    parser.add_argument("--mqload", default=DEFAULT_BINARY, help=f"the mqload binary (default {DEFAULT_BINARY})")


def check_binary(parser: argparse.ArgumentParser, path: str) -> None:
    """A usage error that says how to build mqload where `path` is none."""
    if not os.access(path, os.X_OK):
        parser.error(f"no mqload at {path}: build it (make -C ../shared/tools/mqload, beside a plexmq checkout), "
                     "then give --mqload PATH or set MQLOAD")
PROGRESS_S = 0.1  # mqload's progress interval: how late the start of its run phase is seen
ROLES = ("acceptor", "router", "workers")  # plexmq's processes, whose CPU per connection a conn scenario shows


def arguments(opts: Options, port: int) -> list[str]:
    """The mqload command line of a run (mqload takes the same scenario names and defaults)."""
    args = [opts.scenario, "-p", str(port), "-d", f"{opts.duration:g}", "-s", str(opts.size), "-k", str(opts.keepalive),
            "-i", f"{PROGRESS_S:g}"]
    if opts.scenario == "conn":
        args += ["-c", str(opts.clients), "-R", f"{opts.conn_rate:g}"]
    else:
        args += ["-q", str(opts.qos), "-r", f"{opts.rate:g}", "-w", str(opts.window), "-e", str(opts.e2e_window)]
        args += ["-c", str(opts.clients)] if opts.scenario == "p2p" else ["-P", str(opts.pubs), "-S", str(opts.subs)]
    procs = limits.procs_needed(opts.connections, limits.fd_hard_limit())
    if procs > 1:  # one process holds its open-file limit of sockets
        args += ["-F", "-T", str(max(procs, opts.procs))]
    else:  # a thread per core, as our generator runs a process per core: on one, mqload was the bottleneck of
        args += ["-T", str(opts.procs or os.cpu_count() or 1)]  # pairs across workers (bench/RESULTS.md, stop 40)
    sources, _ = limits.source_addresses(opts.host, opts.connections, opts.source_addrs)
    return args + ["-b", str(len(sources))] if sources else args


def parse(line: str) -> dict[str, str]:
    """mqload's `RESULT k=v k=v ...` line."""
    return dict(field.split("=", 1) for field in line.split()[1:] if "=" in field)


def report(raw: dict[str, str], cpu_s: float | None, wall: float, rss: tuple[int, int], opts: Options,
           connecting: tuple[float, float] | None = None, roles: dict[str, float] | None = None,
           router_s: float | None = None) -> dict:
    """mqload's result under the keys of bench.report, so compare's table shows it; `rss` is the broker's
    (idle, held) resident memory over all its processes; `connecting` its CPU seconds and the wall
    seconds from mqload's start until it said the connect phase was over (a conn scenario's only: in
    the others that time holds subscribing too), and `roles` those CPU seconds per role of plexmq
    (`BrokerMonitor.cpu_by_role`: what the acceptor, the router and the workers each spend per connection);
    `router_s` plexmq's router's CPU seconds over the run window, which `router_us_per_msg` divides among
    the messages delivered in it (what the router spends per message: issue 35)."""
    def num(key: str) -> float:
        return float(raw.get(key, 0) or 0)

    scaled = cpu_s * opts.duration / wall if cpu_s is not None and wall else None  # the whole window's CPU
    connected = int(num("conns"))
    connect_pct = connect_rate = None
    if connecting is not None and opts.scenario == "conn" and connecting[1] > 0:
        connect_pct, connect_rate = connecting[0] / connecting[1] * 100, connected / connecting[1]
    return {"scenario": opts.scenario, "connected": connected, "connect_failed": int(num("conn_fail") + num("failed")),
            "connect_rate": round(num("connect_rate")),
            "rss_per_conn_kb": round((rss[1] - rss[0]) / connected / 1024, 2) if connected and rss[1] else None,
            "broker_rss_mb": round(rss[1] / 2**20, 1) if rss[1] else None,
            "dropped": int(num("dropped")), "msgs_in_per_s": round(num("pub_rate")),
            "msgs_out_per_s": round(num("recv_rate")),
            "router_us_per_msg": round(router_s / wall / num("recv_rate") * 1e6, 2)
            if router_s is not None and wall and num("recv_rate") else None,
            "lost": int(num("lost")), "e2e_resets": int(num("e2e_resets")),
            "latency_ms": {k: num(f"{k.replace('.', '')}_us") / 1000 for k in ("p50", "p90", "p99", "p99.9", "max")},
            "broker_cpu_s": round(scaled, 3) if scaled is not None else None,
            "broker_cpu_pct": round(cpu_s / wall * 100, 1) if cpu_s is not None and wall else None,
            "broker_connect_cpu_pct": round(connect_pct, 1) if connect_pct is not None else None,
            "broker_connect_us": per_connect_us(connect_pct, connect_rate or 0),
            "generator_connect_cpu_pct": num("self_cpu_connect_pct") if "self_cpu_connect_pct" in raw else None,
            **{f"{role}_connect_us": round(seconds * 1e6 / connected, 1)
               for role, seconds in (roles or {}).items() if role in ROLES and opts.scenario == "conn" and connected},
            "mqload": raw}


def measure(spec: brokers.BrokerSpec, opts: Options, binary: str, log_dir: str, port: int = 0) -> dict:
    """A fresh broker, mqload against it (on `port`, one of the broker's listeners, else its first), the
    broker's CPU over the run phase (from mqload's progress)."""
    broker = brokers.RunningBroker(spec, log_dir)
    try:
        monitor = BrokerMonitor(broker.pid)
        cmd = [binary, *arguments(opts, port or broker.port)]
        connect_cpu0, roles0, launched = monitor.cpu_seconds(), monitor.cpu_by_role(), time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        running = threading.Event()
        threading.Thread(target=_watch, args=(proc.stderr, running), daemon=True).start()
        rss_idle, rss_held, cpu_s, wall, connecting, roles, router_s = monitor.rss(), 0, None, 0.0, None, {}, None
        if running.wait(opts.connect_timeout + 120):  # connected: mqload publishes (or holds) `duration` s
            cpu0, t0 = monitor.cpu_seconds(), time.monotonic()
            connecting = (cpu0 - connect_cpu0, t0 - launched)
            roles = {role: seconds - roles0.get(role, 0.0) for role, seconds in monitor.cpu_by_role().items()}
            router0 = monitor.cpu_by_role().get("router")
            time.sleep(max(opts.duration - PROGRESS_S, 0.1))
            cpu_s, wall, rss_held = monitor.cpu_seconds() - cpu0, time.monotonic() - t0, monitor.rss()
            router1 = monitor.cpu_by_role().get("router")
            router_s = router1 - router0 if router0 is not None and router1 is not None else None
        out, _ = proc.communicate()
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        if not lines:
            raise RuntimeError(f"mqload exited with {proc.returncode} and no RESULT: {' '.join(cmd)}")
        result = report(parse(lines[-1]), cpu_s, wall, (rss_idle, rss_held), opts, connecting, roles, router_s)
        result.update(mqload_cmd=" ".join(cmd), mqload_exit=proc.returncode, broker_cmd=" ".join(broker.cmd))
        return result
    finally:
        broker.stop()


def _watch(stream, running: threading.Event) -> None:
    """Set `running` at mqload's first progress line of the run (or hold) phase; read stderr to its end."""
    for line in stream:
        if not running.is_set() and " run " in line:
            running.set()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plexmq.bench.mqload", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default="light", help="presets or groups, as for compare (default light)")
    parser.add_argument("--brokers", default="plexmq,mosquitto", help="comma-separated, first is the base")
    parser.add_argument("-d", "--duration", type=float, help="publish seconds per run (default: the preset's)")
    parser.add_argument("--workers", type=int, default=1, help="plexmq workers where the scenario names none (1)")
    binary_option(parser)
    parser.add_argument("--json", action="store_true", help="print all results as JSON after the table")
    ns = parser.parse_args(argv)
    check_binary(parser, ns.mqload)
    try:
        scenarios = presets.expand(ns.scenarios)
    except KeyError as exc:
        parser.error(exc.args[0])
    names = ns.brokers.split(",")
    log_dir = tempfile.mkdtemp(prefix="plexbench-mqload-")
    results: dict[str, dict[str, dict]] = {}
    for scen in scenarios:
        results[scen] = {}
        for name in names:
            opts = presets.options(scen, ns.duration)
            s = compare.spec(name, compare.plexmq_workers(scen, opts.connections, ns.workers), 1000, [])
            why = compare.cannot(s, opts.connections)
            print(f"== {scen} on {name}{': ' + why if why else ''}", file=sys.stderr, flush=True)
            try:
                results[scen][name] = {"skipped": why} if why else measure(s, opts, ns.mqload, log_dir)
            except RuntimeError as exc:
                results[scen][name] = {"skipped": f"failed: {exc}"}
    print(compare.table(results, names))
    if ns.json:
        print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
