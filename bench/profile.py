"""`python -m plexmq.bench.profile PID` (or `plexmq bench profile`): where a running broker's CPU goes, per
process and per thread, over one window: CPU %, voluntary and involuntary context switches per second,
and with `--py-spy` a sampled profile of the router and one worker, summed by function (self and
inclusive % of the busy samples).

Why per thread: py-spy sees only Python threads, but each ZeroMQ socket has a native I/O thread
(`ZMQbg/IO/0`) whose wake-ups are part of every hop; /proc shows what it costs. Run it while a
scenario loads the broker (`python -m plexmq.bench p2p2k1 -p PORT ... &`). Works for any broker pid
(mosquitto is one process, one thread).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass

from plexmq.bench.monitor import BrokerMonitor

PROFILED = ("router", "worker-0")  # the processes --py-spy samples: one of each role is enough


@dataclass
class ThreadTimes:
    """One thread's counters at one moment (/proc/PID/task/TID)."""
    name: str
    cpu_s: float
    voluntary: int
    involuntary: int


def thread_times(pid: int) -> dict[int, ThreadTimes]:
    """Every thread of `pid` now; a thread or process that is gone is left out."""
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[int, ThreadTimes] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{base}/stat") as f:
                stat = f.read()
            with open(f"{base}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state is field 3 of stat
        out[int(tid)] = ThreadTimes(name=stat[stat.index("(") + 1:stat.rindex(")")],
                                    cpu_s=(int(fields[11]) + int(fields[12])) / ticks,
                                    voluntary=int(status["voluntary_ctxt_switches"]),
                                    involuntary=int(status["nonvoluntary_ctxt_switches"]))
    return out


def rates(before: dict[int, ThreadTimes], after: dict[int, ThreadTimes], wall: float) -> list[dict]:
    """Per thread alive at both ends: CPU % of one core and context switches per second."""
    rows = []
    for tid, end in after.items():
        start = before.get(tid)
        if start is None:
            continue
        rows.append({"tid": tid, "thread": end.name, "cpu_pct": round((end.cpu_s - start.cpu_s) / wall * 100, 1),
                     "vcsw_per_s": round((end.voluntary - start.voluntary) / wall),
                     "ivcsw_per_s": round((end.involuntary - start.involuntary) / wall)})
    return rows


def summarize(raw: str, top: int) -> dict:
    """A py-spy `--format raw` file (collapsed stacks, root first, then a count) as the `top` functions
    by self and by inclusive share of all samples; lines of one function are merged."""
    self_n: Counter[str] = Counter()
    incl_n: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_function(frame) for frame in stack.split(";")]
        self_n[frames[-1]] += n
        for frame in set(frames) - _ENTRY:
            incl_n[frame] += n

    def share(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(name, round(100 * n / total, 1)) for name, n in counter.most_common(top)] if total else []

    return {"samples": total, "self": share(self_n), "inclusive": share(incl_n)}


_ENTRY = {"_run_module_as_main (<frozen runpy>)", "_run_code (<frozen runpy>)"}  # in every stack: no news


def _function(frame: str) -> str:
    """'flush (workers/connection.py:299)' -> 'flush (workers/connection.py)'."""
    head, sep, where = frame.partition(" (")
    return f"{head} ({where.rsplit(':', 1)[0].rstrip(')')})" if sep else frame


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plexmq.bench.profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("pid", type=int, help="the broker's pid (plexmq: the acceptor; its children are found)")
    parser.add_argument("-d", "--duration", type=float, default=10.0, help="window seconds (10)")
    parser.add_argument("--py-spy", action="store_true", help=f"also sample {', '.join(PROFILED)} with py-spy")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second (250)")
    parser.add_argument("--native", action="store_true", help="py-spy --native: C frames too (uvloop, pyzmq); "
                        "it pauses the process at each sample, so it costs more")
    parser.add_argument("--top", type=int, default=15, help="functions listed per profile (15)")
    parser.add_argument("--out", metavar="DIR", help="py-spy raw files and profile.json go here (default: a temp dir)")
    ns = parser.parse_args(argv)
    out = ns.out or os.path.join("/tmp", f"plexbench-profile-{ns.pid}")
    os.makedirs(out, exist_ok=True)
    monitor = BrokerMonitor(ns.pid)
    procs = {monitor.names[p.pid]: p.pid for p in monitor.tree()}
    spies = []
    if ns.py_spy:
        for name in PROFILED:
            if name in procs:
                path = os.path.join(out, f"{name}.txt")
                spies.append((name, path, subprocess.Popen(
                    ["py-spy", "record", "--pid", str(procs[name]), "--duration", str(int(ns.duration)),
                     "--rate", str(ns.rate), "--format", "raw", "--output", path,
                     *(["--native"] if ns.native else ["--nonblocking"])],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
    before = {name: thread_times(pid) for name, pid in procs.items()}
    t0 = time.monotonic()
    time.sleep(ns.duration)
    after = {name: thread_times(pid) for name, pid in procs.items()}
    wall = time.monotonic() - t0
    report: dict = {"pid": ns.pid, "window_s": round(wall, 2), "processes": {}, "profiles": {}}
    for name in procs:
        threads = rates(before[name], after[name], wall)
        report["processes"][name] = {
            "cpu_pct": round(sum(t["cpu_pct"] for t in threads), 1),
            "vcsw_per_s": sum(t["vcsw_per_s"] for t in threads),
            "ivcsw_per_s": sum(t["ivcsw_per_s"] for t in threads),
            "threads": [t for t in threads if t["cpu_pct"] or t["vcsw_per_s"]]}
    for name, path, spy in spies:
        spy.wait()
        try:
            with open(path) as f:
                report["profiles"][name] = summarize(f.read(), ns.top)
        except OSError:
            report["profiles"][name] = {"error": f"py-spy wrote no {path} (exit {spy.returncode})"}
    with open(os.path.join(out, "profile.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(text(report))
    return 0


def text(report: dict) -> str:
    """The report as people read it: processes and threads, then each profile."""
    lines = [f"window {report['window_s']} s; CPU % of one core; context switches per second"]
    for name, p in report["processes"].items():
        lines.append(f"{name:<12} cpu {p['cpu_pct']:5.1f} %  voluntary {p['vcsw_per_s']:6,}/s  "
                     f"involuntary {p['ivcsw_per_s']:5,}/s")
        for t in p["threads"]:
            lines.append(f"  {t['thread']:<14} cpu {t['cpu_pct']:5.1f} %  voluntary {t['vcsw_per_s']:6,}/s  "
                         f"involuntary {t['ivcsw_per_s']:5,}/s")
    for name, prof in report["profiles"].items():
        if "error" in prof:
            lines.append(f"{name}: {prof['error']}")
            continue
        lines.append(f"\n{name}: {prof['samples']:,} busy samples (py-spy leaves idle ones out)")
        lines.append(f"  {'self %':>7}  function{'':<52}  {'incl %':>7}  function")
        for (s_name, s_pct), (i_name, i_pct) in zip(prof["self"], prof["inclusive"]):
            lines.append(f"  {s_pct:7.1f}  {s_name[:60]:<60}  {i_pct:7.1f}  {i_name[:60]}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
