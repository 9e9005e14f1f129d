"""Robustness end to end: tens of thousands of generated and mutated packets (tests/fuzz.py) from 50
parallel connections leave every broker process alive and serving, and leave no memory growing.

The byte streams come from one seed, printed in every assertion message: rerun a failure with
PLEXMQ_FUZZ_SEED=<seed>, or send the same streams by hand at a running broker with
`python -m tests.fuzz --port P --seed <seed> --packets 20000 --round 20000` (the first test) or
`--packets 50000 --round 10000` (the memory test: warm-up and rounds).
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Callable

import psutil

from tests.conftest import Broker, wait_for
from tests.fuzz import Stats, fuzz
from tests.mqtt import Client

SEED = int(os.environ.get("PLEXMQ_FUZZ_SEED", time.time_ns() % 1_000_000_007))
CONNECTIONS = 50
PACKETS = 20_000  # 10,000 asked for, twice over: a run takes a few seconds here
MEMORY_ROUNDS = 4  # after the warm-up round, each of MEMORY_PACKETS
MEMORY_PACKETS = 10_000
# RSS of all broker processes together may grow this much from the end of the warm-up round to the
# end of the last round. A healthy broker's long-lived state is bounded by the fuzzer's name pools
# (64 + 4 client ids, 259 topic names: sessions, subscriptions, retained messages, at most 4 x 1000
# queued messages), and the allocators' high-water mark is mostly reached in the warm-up round (50
# connections, each buffering at most one partial packet of up to 1 MB); what stays is that state
# filling up, and fragmentation: 8 to 25 MB measured here (with the leak named below patched out).
# The measured rounds open about 2,400 connections and cut about 240 uploads of 50 KB to 1 MB short
# (100 MB): a broker that keeps the partial packets of closed connections grows far past the bound
# (+100 MB measured). Small leaks per connection show only in longer runs by hand (see tests/fuzz.py).
MEMORY_BOUND = 40 << 20


def processes(b: Broker) -> dict[str, psutil.Process]:
    """Every running broker process by role: the acceptor, the router and each worker."""
    found = {"acceptor": psutil.Process(b.proc.pid)}
    router = b.router()
    if router is not None:
        found["router"] = router
    found.update((f"worker {i}", proc) for i, proc in b.workers().items())
    return found


def settle(b: Broker) -> None:
    """Wait until the workers hold no client connection: every fuzz connection is closed and forgotten."""
    def idle() -> bool:
        return not any(c.laddr and c.laddr.port == b.port for w in b.workers().values()
                       for c in w.net_connections(kind="tcp"))
    wait_for(idle, 20, "the workers to close every fuzz connection")
    time.sleep(0.5)  # the router handles the last GONE records


def run(b: Broker, packets: int, first_slot: int = 0) -> Stats:
    stats = asyncio.run(fuzz(b.port, packets, SEED, CONNECTIONS, first_slot))
    assert stats.packets >= packets, f"seed {SEED}: only {stats} were sent"
    settle(b)
    return stats


def assert_unharmed(b: Broker, before: dict[str, int], stats: Stats) -> None:
    """The same processes run (none died and was restarted) and the log shows no error."""
    now = {name: proc.pid for name, proc in processes(b).items()}
    log = b.output()
    problems = [line for line in log.splitlines()
                if re.search(r" (ERROR|CRITICAL) |Traceback|restarting", line)]
    assert b.proc.poll() is None and now == before and not problems, (
        f"seed {SEED} ({stats}): processes before {before}, after {now}; log:\n" + "\n".join(problems or [log[-3000:]]))


def assert_serves(b: Broker) -> None:
    """A normal paho client still subscribes and gets what another publishes, at every QoS."""
    sub = Client(b.port, "fuzz-after-sub")
    assert sub.subscribe("fuzz-after/#", 2) == [2], f"seed {SEED}"
    pub = Client(b.port, "fuzz-after-pub")
    for qos in (0, 1, 2):
        pub.publish(f"fuzz-after/{qos}", f"qos {qos}".encode(), qos)
        msg = sub.get()
        assert (msg.topic, msg.payload, msg.qos) == (f"fuzz-after/{qos}", f"qos {qos}".encode(), qos), f"seed {SEED}"
    pub.disconnect()
    sub.disconnect()


def test_fuzzed_packets_leave_every_process_alive_and_serving(start_broker: Callable[..., Broker]) -> None:
    b = start_broker("--workers", "2")
    before = {name: proc.pid for name, proc in processes(b).items()}
    stats = run(b, PACKETS)
    assert stats.closed_by_broker > 0, f"seed {SEED}: the broker closed no connection at all ({stats})"
    assert_unharmed(b, before, stats)
    assert_serves(b)


def test_fuzzing_does_not_grow_memory(start_broker: Callable[..., Broker]) -> None:
    b = start_broker("--workers", "2")
    procs = processes(b)

    def rss() -> dict[str, int]:
        return {name: proc.memory_info().rss for name, proc in procs.items()}

    run(b, MEMORY_PACKETS)  # warm-up: caches, allocator arenas, the pools' sessions and retained messages
    warm = rss()
    total = Stats()
    for i in range(1, MEMORY_ROUNDS + 1):
        total.add(run(b, MEMORY_PACKETS, first_slot=i * CONNECTIONS))
    end = rss()
    growth = sum(end.values()) - sum(warm.values())
    detail = ", ".join(f"{name} {warm[name] >> 20} -> {end[name] >> 20} MB" for name in procs)
    assert growth <= MEMORY_BOUND, f"seed {SEED}: RSS grew by {growth >> 20} MB over {total}: {detail}"
