"""The controller: forks the generator processes, steps them through the run, measures the broker.

Phases: every process connects its clients (the connect storm is measured from the first attempt to
the last CONNACK/SUBACK over all of them), a short settle, then all publish over the same window of
CLOCK_MONOTONIC time; after it the controller waits for late deliveries (until every expected one
arrived, nothing arrived for a second, or `--drain` passed) and collects the counters.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import socket
import sys
import time
from multiprocessing.connection import Connection, wait
from time import monotonic_ns
from typing import cast

import psutil

from plexmq.bench import agent, limits, rawout, report
from plexmq.bench.monitor import BrokerMonitor, cpu_seconds
from plexmq.bench.plan import Options, assign, with_defaults

DRAIN_IDLE_S = 1.0  # nothing new for this long after the window: the rest is lost


class Controller:
    def __init__(self, opts: Options) -> None:
        self.opts = with_defaults(opts)
        self.notes: list[str] = []
        self.latest: dict[int, dict] = {}
        self.finals: dict[int, tuple[dict, dict]] = {}
        self.phase = "starting"
        self.rates: list[dict] = []
        self.broker_rows: list[dict] = []
        self.monitor: BrokerMonitor | None = None
        self.t0 = time.monotonic()
        self.last_progress = 0.0
        self.prev: dict | None = None
        self.tty = sys.stderr.isatty()

    # -- setup ------------------------------------------------------------------------------------

    def plan(self) -> None:
        opts = self.opts
        fd_limit = limits.raise_fd_limit()
        conns = opts.connections
        procs = opts.procs or os.cpu_count() or 1
        need = limits.procs_needed(conns, fd_limit)
        if need > procs:
            self.notes.append(f"{conns} connections need {need} generator processes at the open-file "
                              f"limit of {fd_limit} each: using {need}")
            procs = need
        opts.procs = max(1, min(procs, conns or 1))
        self.sources, notes = limits.source_addresses(opts.host, conns, opts.source_addrs)
        self.notes += notes
        if self.sources:
            self.notes.append(f"connections spread over {len(self.sources)} source addresses "
                              f"{self.sources[0]}..{self.sources[-1]}")
        self.shares = assign(opts, opts.procs, fd_limit - limits.FD_RESERVE)
        self.owners = [0] * opts.pubs
        for k, share in enumerate(self.shares):
            for i in share.pubs:
                self.owners[i] = k
        self.run_id = random.getrandbits(32) or 1

    def spawn(self) -> None:
        ctx = mp.get_context("fork")
        dgrams = [socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(self.opts.procs)]
        for rx, tx in dgrams:
            for s in (rx, tx):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            tx.setblocking(False)
        txs = [tx for _, tx in dgrams]
        self.pipes: list[Connection] = []
        self.pipes_index: dict[Connection, int] = {}
        self.children: list[mp.process.BaseProcess] = []
        for k in range(self.opts.procs):
            ours, theirs = ctx.Pipe()
            child = ctx.Process(target=agent.run, name=f"bench-{k}", daemon=True,
                                args=(k, self.opts, self.shares[k], self.owners, self.run_id, theirs,
                                      dgrams[k][0], txs, self.sources))
            child.start()
            theirs.close()
            self.pipes.append(ours)
            self.pipes_index[ours] = k
            self.children.append(child)
        for rx, tx in dgrams:
            rx.close()
            tx.close()
        self.gen_procs = [psutil.Process(c.pid) for c in self.children]

    # -- talking to the generator processes -------------------------------------------------------

    def send(self, *cmd: object) -> None:
        for pipe in self.pipes:
            pipe.send(cmd)

    def pump(self, timeout: float) -> list[tuple]:
        """Receive what the generator processes sent within `timeout`; the events other than stats."""
        events = []
        for pipe in cast(list[Connection], wait(self.pipes, timeout)):  # the ones it was given
            try:
                while pipe.poll():
                    kind, index, counters, extra = pipe.recv()
                    self.latest[index] = counters
                    if kind == "final":
                        self.finals[index] = (counters, extra)
                    if kind != "stats":
                        events.append((kind, index, extra))
            except EOFError:
                self.pipes.remove(pipe)
                if self.pipes_index[pipe] not in self.finals:
                    self.notes.append(f"generator process {self.pipes_index[pipe]} died before it reported")
        return events

    def wait_all(self, kind: str, timeout: float | None = None) -> list[dict]:
        got: dict[int, dict] = {}
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(got) < self.opts.procs:
            if deadline is not None and time.monotonic() > deadline:
                raise RuntimeError(f"generator processes did not report '{kind}' within {timeout} s")
            if not self.pipes:
                raise RuntimeError("the generator processes died")
            for ev_kind, index, extra in self.pump(0.2):
                if ev_kind == kind:
                    got[index] = extra
            self.tick()
        return [got[k] for k in sorted(got)]

    def total(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for counters in self.latest.values():
            for key, value in counters.items():
                out[key] = out.get(key, 0) + value
        return out

    # -- once a second: rates, broker samples, the progress line ----------------------------------

    def tick(self, force: bool = False) -> None:
        now = time.monotonic()
        if now - self.last_progress < 1.0 and not force:
            return
        self.last_progress = now
        tot = self.total()
        t_s = round(now - self.t0, 3)
        utc_s = int(time.time())
        row = {"t_s": t_s, "utc_s": utc_s, "phase": self.phase, **{k: tot.get(k, 0) for k in (
            "sent", "received", "acked", "connected", "failed", "dropped", "pings", "pongs")}}
        prev = self.prev
        dt = t_s - prev["t_s"] if prev else 0
        row["sent_per_s"] = round((row["sent"] - prev["sent"]) / dt) if prev and dt else 0
        row["recv_per_s"] = round((row["received"] - prev["received"]) / dt) if prev and dt else 0
        row["conn_per_s"] = round((row["connected"] - prev["connected"]) / dt) if prev and dt else 0
        cpu = rss = 0.0
        if self.monitor is not None:
            for proc_row in self.monitor.sample():
                self.broker_rows.append({"t_s": t_s, "utc_s": utc_s, **proc_row})
                cpu += proc_row["cpu_pct"]
                rss += proc_row["rss_bytes"]
            row["broker_cpu_pct"] = round(cpu, 1)
            row["broker_rss_bytes"] = int(rss)
        self.rates.append(row)
        self.prev = row
        if self.opts.progress:
            line = (f"{self.opts.scenario} {self.phase:<10} {t_s:6.1f}s conns {row['connected']}/{self.opts.connections}"
                    f" sent {row['sent_per_s']:,}/s recv {row['recv_per_s']:,}/s")
            if row["failed"] or row["dropped"]:
                line += f" failed {row['failed']} dropped {row['dropped']}"
            if self.monitor is not None:
                line += f" | broker {cpu:.0f}% {rss / 2**20:,.0f} MB"
            print(("\r" + line + "\x1b[K") if self.tty else line, end="" if self.tty else "\n",
                  file=sys.stderr, flush=True)

    def sleep_until(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            self.pump(min(0.2, max(0.0, deadline - time.monotonic())))
            self.tick()

    # -- the run ----------------------------------------------------------------------------------

    def run(self) -> dict:
        opts = self.opts
        self.plan()
        if opts.broker_pid:
            try:
                self.monitor = BrokerMonitor(opts.broker_pid)
            except psutil.Error as exc:
                self.notes.append(f"cannot monitor broker pid {opts.broker_pid}: {exc}")
        self.spawn()
        try:
            return self._run()
        finally:
            for child in self.children:
                child.join(5)
                if child.is_alive():
                    child.kill()
            if self.opts.progress and self.tty:
                print(file=sys.stderr)

    def _run(self) -> dict:
        opts = self.opts
        hellos = self.wait_all("hello", 30)
        fd_limit = min(h["fd_limit"] for h in hellos)
        rss_idle = self.monitor.rss() if self.monitor else 0
        self.phase = "connecting"
        cpu_c0, gen_c0, wall_c0 = self.monitor.cpu_seconds() if self.monitor else 0.0, self._gen_cpu(), time.monotonic()
        self.send("connect")
        self.wait_all("connected")
        wall_c = max(time.monotonic() - wall_c0, 1e-9)
        connect_cpu = {"broker_connect_cpu_pct": (self.monitor.cpu_seconds() - cpu_c0) / wall_c * 100 if self.monitor else None,
                       "generator_connect_cpu_pct": (self._gen_cpu() - gen_c0) / wall_c * 100}
        counters = self.total()
        pubsub = opts.scenario != "conn"
        setup_ok = counters["failed"] == 0 and counters["not_attempted"] == 0
        if pubsub and not setup_ok:
            self.notes.append(f"setup failed: {counters['failed'] + counters['not_attempted']} of "
                              f"{opts.connections} clients did not connect/subscribe; nothing published")
        if pubsub:
            self.phase = "settling"
            self.sleep_until(time.monotonic() + opts.settle)
        t_start = monotonic_ns() + 50_000_000
        t_end = t_start + int(opts.duration * 1e9) if (setup_ok or not pubsub) else t_start
        self.phase = "publishing" if pubsub else "holding"
        self.send("start", t_start, t_end)
        self.sleep_until(time.monotonic() + (t_start - monotonic_ns()) / 1e9)
        cpu0 = self.monitor.cpu_seconds() if self.monitor else 0.0
        gen0 = self._gen_cpu()
        wall0 = time.monotonic()
        self.sleep_until(time.monotonic() + (t_end - monotonic_ns()) / 1e9)
        wall = time.monotonic() - wall0
        broker_cpu_s = self.monitor.cpu_seconds() - cpu0 if self.monitor else None
        broker_cpu = broker_cpu_s / wall * 100 if broker_cpu_s is not None and wall > 0 else None
        gen_cpu = (self._gen_cpu() - gen0) / wall * 100 if wall > 0 else None
        rss_run = self.monitor.rss() if self.monitor else 0
        if pubsub and setup_ok:
            self.phase = "draining"
            self._drain()
        self.phase = "finishing"
        self.send("finish")
        finals = self.wait_all("final", 60)
        self.tick(force=True)  # the last row carries the final counts
        result = report.build(opts, self.finals, finals, notes=self.notes, run_id=self.run_id,
                              fd_limit=fd_limit, broker_cpu_pct=broker_cpu, broker_cpu_s=broker_cpu_s,
                              generator_cpu_pct=gen_cpu,
                              rss_idle=rss_idle, rss_run=rss_run, broker_rows=self.broker_rows,
                              monitored=self.monitor is not None, **connect_cpu)
        if opts.out:
            self._write_samples(result)
        return result

    def _drain(self) -> None:
        deadline = time.monotonic() + self.opts.drain
        fan = max(self.opts.fan(), 1)
        last, last_change = -1, time.monotonic()
        while time.monotonic() < deadline:
            if not self._stopped():  # counters from before a process stopped publishing: `sent` is stale
                self.pump(0.05)
                last_change = time.monotonic()
                continue
            tot = self.total()
            unique = tot["received"] - tot["dups"]
            if unique >= tot["sent"] * fan:
                return
            if unique != last:
                last, last_change = unique, time.monotonic()
            elif time.monotonic() - last_change > DRAIN_IDLE_S:
                return
            self.pump(0.1)
            self.tick()

    def _stopped(self) -> bool:
        """Every live generator process has reported its counters after the end of the window (its
        `sent_at_end`): before that, a subscriber's fresher count can pass a publisher's stale `sent`
        and end the drain while messages are still on their way (they were then counted as lost)."""
        latest = [self.latest.get(self.pipes_index[pipe]) for pipe in self.pipes]
        return all(c is not None and c["sent_at_end"] >= 0 for c in latest)

    def _gen_cpu(self) -> float:
        return cpu_seconds(self.gen_procs)

    def _write_samples(self, result: dict) -> None:
        out, run = self.opts.out, self.run_id
        assert out is not None  # samples are written with --out only
        files = [f for _, extra in self.finals.values() if (f := extra.get("samples_file"))]
        files.append(rawout.write_rates(out, run, self.rates))
        if self.broker_rows:
            files.append(rawout.write_processes(out, run, self.broker_rows))
        result["sample_files"] = sorted(files)
        rawout.write_json(out, f"summary-{run:08x}.json", result)


def run(opts: Options) -> dict:
    """Run one scenario and return its report (see bench.report.build for the keys)."""
    return Controller(opts).run()
