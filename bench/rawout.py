"""This run's raw samples under `--out`, in the format of `bench.samples` (read by `plexmq pipeline bench`).

  latency/<run>-p<k>.smp   one record per message kept by generator process k
  rates/<run>.smp          messages sent and received in each second of the run
  processes/<run>.smp      each broker process's CPU % and RSS, each second
  summary-<run>.json       the run's report (not a sample file; the pipeline skips it)

Why collected in memory and written after the measured window: writing during it would load the
very processes being measured. Per-message latency is kept for every message up to `max_samples`
per process; beyond that every other kept sample is dropped and the stride doubles, so the kept
ones stay spread evenly over the run. Times are CLOCK_MONOTONIC in the generator (the same clock in
every process of the host) and turned into UTC microseconds when written.
"""

from __future__ import annotations

import array
import json
import os
import time

from plexmq.bench.samples import LATENCY, PROCESSES, RATES, SampleWriter


def utc_offset_ns() -> int:
    """What to add to a CLOCK_MONOTONIC time to get UTC nanoseconds."""
    return time.time_ns() - time.monotonic_ns()


class LatencySamples:
    """Per-message (send time, receive time, publisher, sequence, subscriber), evenly decimated."""

    COLUMNS = ("sent_ns", "recv_ns", "pub", "seq", "sub")
    __slots__ = ("cap", "skip", "stride", *COLUMNS)

    def __init__(self, cap: int) -> None:
        self.cap = max(cap, 2)
        self.stride = 1
        self.skip = 0
        self.sent_ns = array.array("q")
        self.recv_ns = array.array("q")
        self.pub = array.array("I")
        self.seq = array.array("I")
        self.sub = array.array("I")

    def add(self, sent_ns: int, recv_ns: int, pub: int, seq: int, sub: int) -> None:
        if self.skip:
            self.skip -= 1
            return
        self.skip = self.stride - 1
        self.sent_ns.append(sent_ns)
        self.recv_ns.append(recv_ns)
        self.pub.append(pub)
        self.seq.append(seq)
        self.sub.append(sub)
        if len(self.sub) >= self.cap:
            for name in self.COLUMNS:
                setattr(self, name, getattr(self, name)[::2])
            self.stride *= 2

    def write(self, out_dir: str, run_id: int, proc: int) -> str:
        offset = utc_offset_ns()
        with SampleWriter(out_dir, LATENCY, f"{run_id:08x}-p{proc}") as w:
            add = w.add
            for sent, recv, pub, seq, sub in zip(self.sent_ns, self.recv_ns, self.pub, self.seq, self.sub):
                add((sent + offset) // 1000, (recv + offset) // 1000, (recv - sent) // 1000, pub, seq, sub)
        return str(w.path)


def write_rates(out_dir: str, run_id: int, rows: list[dict]) -> str:
    """rows: the controller's per-second records (`utc_s`, cumulative `sent` and `received`)."""
    with SampleWriter(out_dir, RATES, f"{run_id:08x}") as w:
        prev_sent = prev_recv = 0
        for row in rows:
            w.add(int(row["utc_s"]), row["sent"] - prev_sent, row["received"] - prev_recv)
            prev_sent, prev_recv = row["sent"], row["received"]
    return str(w.path)


def write_processes(out_dir: str, run_id: int, rows: list[dict]) -> str:
    """rows: the monitor's per-second records (`utc_s`, `pid`, `name`, `cpu_pct`, `rss_bytes`)."""
    with SampleWriter(out_dir, PROCESSES, f"{run_id:08x}") as w:
        for row in rows:
            w.add(int(row["utc_s"]), row["pid"], row["name"].encode()[:32], float(row["cpu_pct"]), row["rss_bytes"])
    return str(w.path)


def write_json(out_dir: str, name: str, data: dict) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    with open(path, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    return path
