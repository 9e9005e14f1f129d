"""The broker's CPU and memory, summed over its process and all its children (psutil).

plexmq is several processes (acceptor, router, workers), so one pid says little: every sample walks
the tree again, so workers restarted mid-run are still counted.
"""

from __future__ import annotations

import psutil

from plexmq.process import named_worker


def process_name(proc: psutil.Process) -> str:
    """A short role name: 'router', 'worker-1', 'acceptor', 'mosquitto'."""
    try:
        cmd, forked = proc.cmdline(), named_worker(proc.name())
    except psutil.Error:
        return "?"
    if forked is not None:  # forked from the acceptor: its command line is the acceptor's
        return f"worker-{forked}"
    module = cmd[cmd.index("-m") + 1] if "-m" in cmd[:-1] else ""
    if module == "plexmq.router":
        return "router"
    if any("acceptor" in part for part in cmd):
        return "acceptor"
    return proc.name()


def cpu_seconds(procs: list[psutil.Process]) -> float:
    """User + system CPU seconds consumed so far by those of `procs` still alive."""
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


class BrokerMonitor:
    """Samples of the broker tree: per-process CPU % (of one core) and RSS, and their sums."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.procs: dict[int, psutil.Process] = {}
        self.names: dict[int, str] = {}
        self.sample()  # primes cpu_percent

    def tree(self) -> list[psutil.Process]:
        try:
            found = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return []
        alive = []
        for proc in found:
            known = self.procs.get(proc.pid)
            if known is None:
                self.procs[proc.pid] = known = proc
                self.names[proc.pid] = process_name(proc)
                try:
                    known.cpu_percent(None)
                except psutil.Error:
                    continue
            alive.append(known)
        return alive

    def sample(self) -> list[dict]:
        """[{'pid', 'name', 'cpu_pct', 'rss_bytes'}] for every live process of the broker."""
        rows = []
        for proc in self.tree():
            try:
                with proc.oneshot():
                    rows.append({"pid": proc.pid, "name": self.names[proc.pid],
                                 "cpu_pct": proc.cpu_percent(None), "rss_bytes": proc.memory_info().rss})
            except psutil.Error:
                continue
        return rows

    def rss(self) -> int:
        total = 0
        for proc in self.tree():
            try:
                total += proc.memory_info().rss
            except psutil.Error:
                pass
        return total

    def cpu_seconds(self) -> float:
        """User + system CPU seconds consumed so far by the live processes of the tree."""
        return cpu_seconds(self.tree())

    def cpu_by_role(self) -> dict[str, float]:
        """`cpu_seconds` per role: 'acceptor', 'router', 'workers' (all of them), or the process's name."""
        roles: dict[str, float] = {}
        for proc in self.tree():
            name = self.names[proc.pid]
            role = "workers" if name.startswith("worker") else name
            roles[role] = roles.get(role, 0.0) + cpu_seconds([proc])
        return roles
