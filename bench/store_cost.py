"""`python -m plexmq.bench.store_cost`: what each store costs a persistent session's QoS 1 stream.

One broker per store (SQLite `--sync normal`, SQLite `--sync full`, PostgreSQL: `--dsn` of a server
you run, or a private one from plexmq/bench/postgres.py), each on a free loopback port: a persistent
QoS 1 subscriber and one publisher sending `-n` QoS 1 messages with at most `--window`
unacknowledged. Every PUBACK waits for the commit that keeps the message for the subscriber, so the
rate is bound by the commit's latency (SQLite normal: no fsync; full: one fsync per commit;
PostgreSQL: a round trip and the server's fsync), and the router's CPU per message is what the store's
driver adds. The stores run in turn, `--rounds` times, alternating.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time

import psutil

from plexmq.bench.brokers import BrokerSpec, RunningBroker
from plexmq.bench.durability import DISCONNECT, read_packet
from plexmq.bench.failover import client
from plexmq.bench.monitor import cpu_seconds, process_name
from plexmq.mqtt.v4 import encode_puback, encode_subscribe, publish_header

TOPIC = b"store-cost/stream"


async def stream(port: int, n: int, window: int, size: int) -> float:
    """Seconds from the first PUBLISH until the subscriber has all `n`."""
    sub_r, sub_w = await client(port, "store-cost-sub", clean=False)
    sub_w.write(encode_subscribe(1, [(TOPIC.decode(), 1)]))
    while (await read_packet(sub_r))[0] != 0x90:
        pass
    pub_r, pub_w = await client(port, "store-cost-pub", clean=True)
    payload = bytes(size)
    got = 0

    async def receive() -> None:
        nonlocal got
        while got < n:
            first, body = await read_packet(sub_r)
            if first & 0xF0 == 0x30:
                tlen = (body[0] << 8) | body[1]
                sub_w.write(encode_puback((body[2 + tlen] << 8) | body[3 + tlen]))
                got += 1

    started = time.perf_counter()
    receiving = asyncio.ensure_future(receive())
    sent = acked = 0
    while acked < n:
        out = []
        while sent < n and sent - acked < window:
            out.append(publish_header(TOPIC, size, 1, False, False, sent % 65535 + 1) + payload)
            sent += 1
        if out:
            pub_w.write(b"".join(out))
        first, _body = await read_packet(pub_r)
        if first == 0x40:
            acked += 1
    await receiving
    elapsed = time.perf_counter() - started
    for writer in (sub_w, pub_w):
        writer.write(DISCONNECT)
        writer.close()
    return elapsed


def measure(name: str, args: list[str], n: int, window: int, size: int) -> dict:
    base = tempfile.mkdtemp(prefix="plexbench-store-")
    with open(f"{base}/plexmq.toml", "w") as f:
        f.write(f"max_queued_messages = {n}\n")  # the subscriber may lag: nothing dropped
    broker = RunningBroker(BrokerSpec("plexmq", "plexmq", workers=1,
                                      extra=[*args, "--data-dir", f"{base}/data", "--config", f"{base}/plexmq.toml"]),
                           base)
    try:
        router = next(p for p in psutil.Process(broker.pid).children(recursive=True) if process_name(p) == "router")
        before = cpu_seconds([router])
        elapsed = asyncio.run(stream(broker.port, n, window, size))
        cpu = cpu_seconds([router]) - before
    finally:
        broker.stop()
    return {"store": name, "msgs_per_s": round(n / elapsed), "router_us_per_msg": round(1e6 * cpu / n, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plexmq.bench.store_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--messages", type=int, default=20_000, help="QoS 1 messages per run (20000)")
    parser.add_argument("--window", type=int, default=100, help="unacknowledged PUBLISH (100)")
    parser.add_argument("-s", "--size", type=int, default=64, help="payload bytes (64)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each store, alternating (3)")
    parser.add_argument("--dsn", default="", help="a PostgreSQL to use (default: a private one)")
    parser.add_argument("--json", action="store_true")
    ns = parser.parse_args(argv)
    server = None
    if not ns.dsn:
        from plexmq.bench.postgres import PostgreSQL
        server = PostgreSQL()
    dsn = ns.dsn or server.dsn  # type: ignore[union-attr]  # one is set
    stores = {"sqlite normal": ["--sync", "normal"], "sqlite full": ["--sync", "full"], "postgresql": ["--store", dsn]}
    runs: dict[str, list[dict]] = {name: [] for name in stores}
    try:
        for _ in range(ns.rounds):
            for name, args in stores.items():
                runs[name].append(measure(name, args, ns.messages, ns.window, ns.size))
    finally:
        if server is not None:
            server.remove()
    result = {name: {"msgs_per_s": statistics.median(r["msgs_per_s"] for r in got),
                     "router_us_per_msg": statistics.median(r["router_us_per_msg"] for r in got),
                     "runs": [r["msgs_per_s"] for r in got]} for name, got in runs.items()}
    if ns.json:
        print(json.dumps(result))
    else:
        for name, r in result.items():
            print(f"{name:<14} {r['msgs_per_s']:>8,} msgs/s (runs {r['runs']}), router {r['router_us_per_msg']} us "
                  f"per message  [{ns.messages:,} QoS 1 to one persistent subscriber, window {ns.window}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
