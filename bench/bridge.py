"""`python -m plexmq.bench.bridge`: a bridge's throughput to a remote mosquitto, plexmq's beside mosquitto's own.

Each run starts a fresh remote (Debian's mosquitto on a free loopback port) and a fresh local broker bridged
to it: plexmq with a `[bridges.remote]` out rule `bench/#` at the run's QoS, or mosquitto with `connection
remote` / `topic bench/# out QOS`, both speaking `--protocol` to the remote (3.1.1 by default, as a mosquitto
bridge does unless told; at 5.0 the remote's Receive Maximum, 20, bounds either). A subscriber on the remote
takes `bench/#` at that QoS; once a probe has crossed the bridge, one publisher on the local broker sends `-n`
messages (QoS 1: at most `--window` unacknowledged). Reported per (broker, QoS): msgs/s from the first PUBLISH
to the last arrival on the remote, messages lost, duplicated and out of order, and the local side's CPU per
message: every process of the local plexmq (acceptor, router, worker, bridge; the bridge alone beside it), or
the local mosquitto's one process (its bridge included). The remote's and the clients' CPU are not counted.
Brokers alternate, `--rounds` times; the summary takes medians. mosquitto here keeps its bridge's queue in
memory only (persistence false); plexmq journals its bridge's session, so that it survives kill -9: `--memory`
adds plexmq with `--no-persistence` to the rotation, like for like.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable

import psutil

from plexmq.bench.brokers import BrokerSpec, RunningBroker
from plexmq.bench.durability import DISCONNECT, read_packet
from plexmq.bench.failover import client
from plexmq.bench.monitor import BrokerMonitor, cpu_seconds
from plexmq.mqtt.framing import frame
from plexmq.mqtt.v4 import decode_publish, encode_puback, encode_subscribe, publish_header

TOPIC = b"bench/stream"
PROBE = b"bench/probe"
SEQ = struct.Struct(">I")
KINDS = ("plexmq", "mosquitto")
# --memory's third broker: plexmq with --no-persistence, its bridge's queue in memory only, as mosquitto's
# is here (persistence false); plexmq's default journals it to survive kill -9 of any of its processes
MEMORY = "plexmq-memory"
BRIDGE_WAIT = 30.0  # seconds for the bridge to carry its first probe
PROTOCOLS = {"3.1.1": "mqttv311", "5.0": "mqttv50"}  # --protocol -> mosquitto's bridge_protocol_version
QUIET = 5.0  # seconds without an arrival after the last PUBLISH: the rest is lost
MAX_PACKET = 1 << 20


def local_spec(kind: str, remote_port: int, qos: int, n: int, protocol: str, log_dir: str) -> BrokerSpec:
    """The local broker, bridged to the remote in MQTT `protocol`, with room to queue every message (none
    dropped there)."""
    if kind in ("plexmq", MEMORY):
        conf = os.path.join(log_dir, f"bridge-{remote_port}.toml")
        with open(conf, "w") as f:
            f.write(f'max_queued_messages = {n}\n[bridges.remote]\naddress = ["127.0.0.1:{remote_port}"]\n'
                    f'protocol = "{protocol}"\nout = [{{filter = "bench/#", qos = {qos}}}]\n')
        return BrokerSpec("plexmq", "plexmq", extra=["--config", conf, *(["--no-persistence"] if kind == MEMORY else [])])
    return BrokerSpec("mosquitto", "mosquitto", max_queued=n,
                      conf=f"connection remote\naddress 127.0.0.1:{remote_port}\ntopic bench/# out {qos}\n"
                           f"bridge_protocol_version {PROTOCOLS[protocol]}\ncleansession true\nnotifications false\n")


def local_cpu(pid: int) -> Callable[[], tuple[float, float]]:
    """CPU seconds so far of the local broker's tree, and of its bridge process (plexmq's; 0 for mosquitto)."""
    monitor = BrokerMonitor(pid)

    def read() -> tuple[float, float]:
        tree = monitor.tree()
        return cpu_seconds(tree), cpu_seconds([p for p in tree if _is_bridge(p)])

    return read


def _is_bridge(proc: psutil.Process) -> bool:
    try:
        return "plexmq.acceptor.bridges" in proc.cmdline()
    except psutil.Error:
        return False


async def stream(local_port: int, remote_port: int, qos: int, n: int, window: int, size: int,
                 cpu: Callable[[], tuple[float, float]]) -> dict:
    """Publish `n` on the local broker, count them on the remote: the run's figures."""
    sub_r, sub_w = await client(remote_port, "bridge-bench-sub", clean=True)
    sub_w.write(encode_subscribe(1, [("bench/#", qos)]))
    while (await asyncio.wait_for(read_packet(sub_r), 10))[0] != 0x90:
        pass
    pub_r, pub_w = await client(local_port, "bridge-bench-pub", clean=True)
    seqs: list[int] = []
    last = 0.0
    probed, done = asyncio.Event(), asyncio.Event()

    async def receive() -> None:
        nonlocal last
        pending = bytearray()
        while True:
            acks, before = [], len(seqs)
            for first, body in await read_packets(sub_r, pending):
                if first & 0xF0 != 0x30:
                    continue
                topic, pid, payload = decode_publish(first & 0x0F, body)
                if pid:
                    acks.append(encode_puback(pid))
                if topic.encode() != TOPIC:
                    probed.set()
                    continue
                seqs.append(SEQ.unpack_from(payload)[0])
            sub_w.write(b"".join(acks))
            if len(seqs) > before:
                last = time.perf_counter()
            if len(seqs) >= n:
                done.set()

    receiving = asyncio.ensure_future(receive())
    try:
        deadline = time.monotonic() + BRIDGE_WAIT
        while not probed.is_set():  # the bridge may still be connecting: probe until one crosses
            if time.monotonic() > deadline:
                raise TimeoutError(f"no probe crossed the bridge within {BRIDGE_WAIT:g} s")
            pub_w.write(publish_header(PROBE, 0, 0, False, False, 0))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(probed.wait(), 0.2)
        cpu_before, bridge_before = cpu()
        padding = bytes(max(0, size - SEQ.size))
        started = time.perf_counter()
        if qos == 0:
            for start in range(0, n, 100):
                pub_w.write(b"".join(publish_header(TOPIC, SEQ.size + len(padding), 0, False, False, 0)
                                     + SEQ.pack(i) + padding for i in range(start, min(n, start + 100))))
                await pub_w.drain()
        else:
            sent = acked = 0
            pending = bytearray()
            while acked < n:
                out = []
                while sent < n and sent - acked < window:
                    out.append(publish_header(TOPIC, SEQ.size + len(padding), 1, False, False, sent % 65535 + 1)
                               + SEQ.pack(sent) + padding)
                    sent += 1
                if out:
                    pub_w.write(b"".join(out))
                packets = await asyncio.wait_for(read_packets(pub_r, pending), QUIET)
                acked += sum(1 for first, _body in packets if first == 0x40)
        published = time.perf_counter()
        while not done.is_set() and time.perf_counter() - max(last, published) < QUIET:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 0.5)
        cpu_after, bridge_after = cpu()
    finally:
        receiving.cancel()
        for writer in (sub_w, pub_w):
            writer.write(DISCONNECT)
            writer.close()
    distinct = len(set(seqs))
    elapsed = last - started if seqs else 0.0
    return {"qos": qos, "messages": n, "received": distinct, "lost": n - distinct, "duplicates": len(seqs) - distinct,
            "out_of_order": sum(1 for a, b in zip(seqs, seqs[1:], strict=False) if b < a),
            "seconds": round(elapsed, 3), "msgs_per_s": round(distinct / elapsed) if elapsed > 0 else 0,
            "local_us_per_msg": round(1e6 * (cpu_after - cpu_before) / n, 1),
            "bridge_us_per_msg": round(1e6 * (bridge_after - bridge_before) / n, 1)}


async def read_packets(reader: asyncio.StreamReader, pending: bytearray) -> list[tuple[int, bytes]]:
    """The whole packets of the next read (at least one), as (first byte, body); the rest of the read
    stays in `pending`. One await per read, not per packet: the client must not be what the bench measures."""
    packets: list[tuple[int, bytes]] = []
    while not packets:
        data = await reader.read(1 << 16)
        if not data:
            raise EOFError("the broker closed the connection")
        pending += data
        pos = 0
        while (found := frame(pending, pos, MAX_PACKET)) is not None:
            first, start, pos = found
            packets.append((first, bytes(pending[start:pos])))
        del pending[:pos]
    return packets


def measure(kind: str, qos: int, n: int, window: int, size: int, protocol: str, log_dir: str) -> dict:
    """One run on a fresh remote and a fresh local broker, both stopped after it."""
    remote = RunningBroker(BrokerSpec("remote", "mosquitto", max_queued=n), log_dir)
    try:
        local = RunningBroker(local_spec(kind, remote.port, qos, n, protocol, log_dir), log_dir)
        try:
            result = asyncio.run(stream(local.port, remote.port, qos, n, window, size, local_cpu(local.pid)))
        finally:
            local.stop()
    finally:
        remote.stop()
    return {"broker": kind, "protocol": protocol, **result}


def summary(runs: list[dict]) -> dict:
    """Per QoS: each broker's median msgs/s and CPU, plexmq's ratio (and plexmq-memory's, where it ran),
    and whether the goal holds (plexmq at least twice mosquitto's bridge throughput, and 0 lost at QoS 1)."""
    out: dict = {}
    for qos in sorted({r["qos"] for r in runs}):
        row: dict = {}
        for kind in dict.fromkeys(r["broker"] for r in runs):
            mine = [r for r in runs if r["broker"] == kind and r["qos"] == qos]
            row[kind] = {"msgs_per_s": round(statistics.median(r["msgs_per_s"] for r in mine)),
                         "local_us_per_msg": statistics.median(r["local_us_per_msg"] for r in mine),
                         "lost": sum(r["lost"] for r in mine)}
        base = row["mosquitto"]["msgs_per_s"]
        row["ratio"] = round(row["plexmq"]["msgs_per_s"] / base, 2) if base else None
        if MEMORY in row:
            row["memory_ratio"] = round(row[MEMORY]["msgs_per_s"] / base, 2) if base else None
        row["goal_met"] = bool(row["ratio"] and row["ratio"] >= 2 and (qos == 0 or row["plexmq"]["lost"] == 0))
        out[f"qos{qos}"] = row
    return out


def table(runs: list[dict], summed: dict) -> str:
    lines = [f"{'broker':<13} {'qos':>3} {'messages':>8} {'msgs/s':>8} {'lost':>6} {'dup':>5} {'disorder':>8} "
             f"{'local us/msg':>12} {'bridge us/msg':>13}"]
    for r in runs:
        bridge = f"{r['bridge_us_per_msg']:>13}" if r["broker"] != "mosquitto" else f"{'-':>13}"
        lines.append(f"{r['broker']:<13} {r['qos']:>3} {r['messages']:>8,} {r['msgs_per_s']:>8,} {r['lost']:>6,} "
                     f"{r['duplicates']:>5,} {r['out_of_order']:>8,} {r['local_us_per_msg']:>12} {bridge}")
    for name, row in summed.items():
        lines.append(f"{name}: plexmq {row['plexmq']['msgs_per_s']:,} msgs/s, mosquitto {row['mosquitto']['msgs_per_s']:,} "
                     f"msgs/s (medians): ratio {row['ratio']}, goal (>= 2x, 0 lost at QoS 1) "
                     f"{'met' if row['goal_met'] else 'NOT met'}"
                     + (f"; plexmq-memory {row[MEMORY]['msgs_per_s']:,} msgs/s: ratio {row['memory_ratio']}"
                        if MEMORY in row else ""))
    lines.append("local us/msg: CPU of every local plexmq process (bridge included) or of the local mosquitto; "
                 "bridge us/msg: plexmq's bridge process alone")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plexmq.bench.bridge", description=__doc__.split("\n\n")[0])
    parser.add_argument("--qos0-messages", type=int, default=20_000, help="QoS 0 messages per run (20000)")
    parser.add_argument("--qos1-messages", type=int, default=10_000, help="QoS 1 messages per run (10000)")
    parser.add_argument("--window", type=int, default=100, help="QoS 1: unacknowledged PUBLISH (100)")
    parser.add_argument("-s", "--size", type=int, default=64, help="payload bytes (64)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each broker and QoS, alternating (1)")
    parser.add_argument("--memory", action="store_true",
                        help=f"also {MEMORY}: plexmq with --no-persistence, the bridge's queue in memory as mosquitto's")
    parser.add_argument("--protocol", choices=tuple(PROTOCOLS), default="3.1.1",
                        help="what both bridges speak to the remote (3.1.1, mosquitto's default for a bridge)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (table to stderr)")
    ns = parser.parse_args(argv)
    if min(ns.qos0_messages, ns.qos1_messages, ns.window, ns.rounds) < 1:
        parser.error("message counts, --window and --rounds must be at least 1")
    log_dir = tempfile.mkdtemp(prefix="plexbench-bridge-")
    counts = {0: ns.qos0_messages, 1: ns.qos1_messages}
    runs = [measure(kind, qos, counts[qos], ns.window, ns.size, ns.protocol, log_dir)
            for _ in range(ns.rounds) for qos in counts for kind in (*KINDS, *([MEMORY] if ns.memory else []))]
    summed = summary(runs)
    text = table(runs, summed)
    if ns.json:
        print(text, file=sys.stderr)
        print(json.dumps({"runs": runs, "summary": summed, "log_dir": log_dir}))
    else:
        print(text)
    failed = any(r["received"] == 0 or (r["qos"] and r["lost"]) for r in runs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
