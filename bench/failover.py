"""`python -m plexmq.bench.failover`: how long a failover of the router takes, and what it costs QoS 1.

Two routers (`--role router`, each its own process group: a "host") share one PostgreSQL store; one
node lists both. A persistent QoS 1 subscriber and a QoS 1 publisher (`--rate` messages a second)
stay connected to the node throughout. Each run kill -9s the whole group of the active router (the
lease row in PostgreSQL names it), then times
- `takeover`: until the lease row has the next epoch (the standby holds it), and
- `resumed`: until the subscriber gets the first message published after the kill (the node has
  joined the new active router and what the publisher sent meanwhile flows),
then starts the killed router again (it comes back as a standby) and waits for the stream to be
steady before the next run. At the end the publisher stops and every acknowledged message must
reach the subscriber: `lost` (acknowledged, never delivered) must be 0; `duplicates` are copies the
subscriber got more than once (QoS 1 allows them).

PostgreSQL: `--dsn` of a server you run, or (default) a private one from the Debian package
(plexmq/bench/postgres.py; needs root).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

from plexmq.acceptor.keys import ensure
from plexmq.bench.brokers import free_port
from plexmq.bench.durability import DISCONNECT, read_packet
from plexmq.mqtt.v4 import decode_connack, encode_connect, encode_puback, encode_subscribe, publish_header

SEQ = struct.Struct(">Id")  # sequence number, publish time (time.time())
TOPIC = b"failover/stream"
QUEUE = 20_000  # max_queued_messages: the backlog of a failover must not overflow the subscriber's queue
READY_WAIT = 30.0  # seconds a router, the node or a takeover may take before the run fails


@dataclass
class Stream:
    """The publisher's and the subscriber's view of one QoS 1 stream."""

    acked: set[int] = field(default_factory=set)
    got: dict[int, float] = field(default_factory=dict)  # sequence -> first arrival (time.time())
    copies: int = 0
    sent: int = 0


class Routers:
    """The two router "hosts" and the node, as process groups; the lease row says who is active."""

    def __init__(self, dsn: str, lease: float, workers: int, base: str) -> None:
        self.dsn, self.base = dsn, base
        self.keys = os.path.join(base, "keys")
        ensure(self.keys)
        self.links = {name: f"tcp://127.0.0.1:{free_port()}" for name in ("ra", "rb")}
        self.port = free_port()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.lease = lease
        self.workers = workers

    def _serve(self, name: str, *args: str, config: str = "") -> None:
        conf = os.path.join(self.base, f"{name}.toml")
        with open(conf, "w") as f:
            f.write(f'run_dir = "{os.path.join(self.base, name + "-run")}"\nmax_queued_messages = {QUEUE}\n{config}')
        log = open(os.path.join(self.base, f"{name}.log"), "ab")  # noqa: SIM115  # the child holds it
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "plexmq.acceptor", "serve", "--config", conf, "--router-curve-dir", self.keys,
             "--metrics-port", "-1", "--console-port", "-1", *args],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def start_router(self, name: str) -> None:
        self._serve(name, "--role", "router", "--router-bind", self.links[name], "--store", self.dsn,
                    "--data-dir", os.path.join(self.base, name + "-data"),
                    config=f'router_lease = {self.lease}\nrouter_name = "{name}"\n')

    def start_node(self) -> None:
        self._serve("node", "--role", "node", "--router", ",".join(self.links.values()), "--node-name", "n1",
                    "--port", str(self.port), "--workers", str(self.workers))

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

    def holder(self) -> tuple[str, int] | None:
        """(the active router's name, its epoch) from the lease row; None before the first lease or
        while the database does not answer."""
        try:
            with psycopg.connect(self.dsn, connect_timeout=2, autocommit=True) as db:
                row = db.execute("SELECT holder, epoch FROM router_lease WHERE id = 1 AND expires > now()").fetchone()
        except psycopg.Error:
            return None
        return (row[0], row[1]) if row else None


async def until(predicate: Callable[[], object], limit: float, what: str, check: Callable[[], None] = lambda: None) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {limit:g} s")
        await asyncio.sleep(0.01)


async def client(port: int, client_id: str, clean: bool) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    deadline = time.monotonic() + READY_WAIT
    while True:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(encode_connect(client_id, clean, 60))
            first, body = await asyncio.wait_for(read_packet(reader), 5)
            if first == 0x20 and decode_connack(0, body)[1] == 0:
                return reader, writer
            writer.close()
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{client_id}: no CONNACK within {READY_WAIT:g} s")
        await asyncio.sleep(0.1)


async def subscribe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stream: Stream) -> None:
    writer.write(encode_subscribe(1, [(TOPIC.decode(), 1)]))
    while True:
        first, body = await read_packet(reader)
        if first & 0xF0 != 0x30:
            continue
        tlen = (body[0] << 8) | body[1]
        pid = (body[2 + tlen] << 8) | body[3 + tlen]
        seq, _sent_at = SEQ.unpack_from(body, 4 + tlen)
        writer.write(encode_puback(pid))
        if seq in stream.got:
            stream.copies += 1
        else:
            stream.got[seq] = time.time()


async def publish(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stream: Stream, rate: float,
                  stop: asyncio.Event, window: int = 200) -> None:
    """QoS 1 at `rate` a second, at most `window` unacknowledged (the publisher waits, as a device would)."""
    pending: dict[int, int] = {}  # packet id -> sequence number

    async def acks() -> None:
        while True:
            first, body = await read_packet(reader)
            if first == 0x40:
                seq = pending.pop((body[0] << 8) | body[1], None)
                if seq is not None:
                    stream.acked.add(seq)

    reading = asyncio.ensure_future(acks())
    due = time.monotonic()
    while not stop.is_set():
        if (wait := due - time.monotonic()) > 0:
            await asyncio.sleep(wait)
        if len(pending) >= window:
            await asyncio.sleep(0.005)
            due = time.monotonic()  # a device that waited does not burst to catch up afterwards
            continue
        due += 1 / rate
        seq = stream.sent
        pid = seq % 65535 + 1
        pending[pid] = seq
        writer.write(publish_header(TOPIC, SEQ.size, 1, False, False, pid) + SEQ.pack(seq, time.time()))
        stream.sent += 1
    await until(lambda: not pending, READY_WAIT, "PUBACK for every message sent")
    reading.cancel()


async def measure(routers: Routers, runs: int, rate: float) -> dict:
    for name in routers.links:
        routers.start_router(name)
    await until(routers.holder, READY_WAIT, "active router")
    routers.start_node()
    stream = Stream()
    sub = await client(routers.port, "failover-sub", clean=False)
    pub = await client(routers.port, "failover-pub", clean=True)
    receiving = asyncio.ensure_future(subscribe(*sub, stream))
    stop = asyncio.Event()
    publishing = asyncio.ensure_future(publish(*pub, stream, rate, stop))
    takeovers, resumptions = [], []

    def check() -> None:  # a client task that died says why, instead of a wait that times out
        for task in (receiving, publishing):
            if task.done() and task.exception() is not None:
                raise RuntimeError(f"a client failed: {task.exception()!r}")

    try:
        for _ in range(runs):
            await until(lambda: len(stream.got) > stream.sent - rate / 2 and stream.sent > rate, READY_WAIT,
                        "a steady stream", check)
            active = routers.holder()
            assert active is not None
            name, epoch = active
            killed_at, first_after = time.time(), stream.sent
            routers.kill(name)

            def taken(epoch: int = epoch) -> bool:
                holder = routers.holder()
                return holder is not None and holder[1] > epoch

            def flowing(after: int = first_after) -> bool:
                return any(s >= after for s in list(stream.got)[-50:])

            await until(taken, READY_WAIT, "takeover")
            takeovers.append(time.time() - killed_at)
            await until(flowing, READY_WAIT, "a message published after the kill")
            resumptions.append(min(t for s, t in stream.got.items() if s >= first_after) - killed_at)
            routers.start_router(name)  # it comes back as the standby
            await asyncio.sleep(1.0)  # let the next holder renew before the next kill
        stop.set()
        await publishing
        await until(lambda: stream.acked <= stream.got.keys(), READY_WAIT, "every acknowledged message")
    finally:
        receiving.cancel()
        for _, writer in (sub, pub):
            writer.write(DISCONNECT)
            writer.close()
    lost = len(stream.acked - stream.got.keys())
    return {"runs": runs, "rate": rate, "sent": stream.sent, "acked": len(stream.acked), "lost": lost,
            "duplicates": stream.copies,
            "takeover_s": {"median": round(statistics.median(takeovers), 2), "max": round(max(takeovers), 2)},
            "resumed_s": {"median": round(statistics.median(resumptions), 2), "max": round(max(resumptions), 2)},
            "lease_s": routers.lease}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plexmq.bench.failover", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="kill -9 runs (10)")
    parser.add_argument("--rate", type=float, default=500.0, help="QoS 1 messages a second (500)")
    parser.add_argument("--lease", type=float, default=2.0, help="router_lease, seconds (2)")
    parser.add_argument("--workers", type=int, default=1, help="the node's workers (1)")
    parser.add_argument("--dsn", default="", help="a PostgreSQL to use (default: a private one)")
    parser.add_argument("--json", action="store_true")
    ns = parser.parse_args(argv)
    base = tempfile.mkdtemp(prefix="plexbench-failover-")
    server = None
    if not ns.dsn:
        from plexmq.bench.postgres import PostgreSQL
        server = PostgreSQL()
    routers = Routers(ns.dsn or server.dsn, ns.lease, ns.workers, base)  # type: ignore[union-attr]  # one is set
    try:
        result = asyncio.run(measure(routers, ns.runs, ns.rate))
    finally:
        routers.stop()
        if server is not None:
            server.remove()
    print(json.dumps(result) if ns.json else
          f"{result['runs']} kill -9 of the active router at {result['rate']:g} QoS 1 msgs/s, lease "
          f"{result['lease_s']:g} s: takeover median {result['takeover_s']['median']} s, max "
          f"{result['takeover_s']['max']} s; messages flowing again after median {result['resumed_s']['median']} s, "
          f"max {result['resumed_s']['max']} s; {result['acked']} acknowledged, lost {result['lost']}, "
          f"duplicates {result['duplicates']} (logs in {base})")
    return 0 if result["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
