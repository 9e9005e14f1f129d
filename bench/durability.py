"""`python -m plexmq.bench.durability`: what 10,000 offline persistent sessions with 100 queued messages each
cost plexmq, and how fast it serves again after a restart.

Phases, against a broker it starts itself on a free loopback port with a fresh data dir:
1. sessions: N clients connect with clean session 0 and stable ids (<prefix><i>), subscribe QoS 1 to
   their topic (<topic>/<i>, or one topic per --per-topic sessions), and disconnect;
2. fill: one publisher per shard (--publishers) publishes M QoS 1 messages to each topic of its shard,
   pipelined (--window unacknowledged each). A PUBACK leaves the broker only once the message is in
   the store, so when the last PUBACK is in, N x M messages are queued on disk;
3. measure: the router's RSS (psutil, the process whose command line has `-m router`) and the size of
   the data dir (plexmq.db, -wal, -shm);
4. restart: SIGTERM (timed until the broker has exited), start it again on the same port and data
   dir, and time from the start until a persistent client (session 0) has its CONNACK and its first
   queued message; it then takes all M of them (PUBACK each) and checks their order.

Every message's payload starts with (session, sequence), so the probe can tell what it got.
Exit status: 0 the run went through and the probe got its M messages in order; 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import struct
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import psutil

from plexmq.bench.brokers import BrokerSpec, RunningBroker
from plexmq.bench.monitor import cpu_seconds, process_name
from plexmq.mqtt.v4 import (
    MalformedPacket,
    decode_connack,
    encode_connect,
    encode_puback,
    encode_subscribe,
    frame,
    publish_header,
)

PAYLOAD = struct.Struct(">II")  # session index, sequence number (then zero filler)
DISCONNECT = b"\xe0\x00"
MAX_PACKET = 1 << 20
CHUNK = 256  # PUBLISH packets per write


@dataclass
class Plan:
    sessions: int = 10_000
    messages: int = 100
    size: int = 64
    per_topic: int = 1  # sessions subscribed to one topic; 1 = every session its own topic
    publishers: int = 10
    window: int = 1000
    concurrency: int = 200  # session handshakes in flight
    prefix: str = "durab-"
    topic_prefix: str = "durab"
    host: str = "127.0.0.1"
    port: int = 0

    @property
    def topics(self) -> int:
        return -(-self.sessions // self.per_topic)

    def client_id(self, i: int) -> str:
        return f"{self.prefix}{i}"

    def topic(self, t: int) -> str:
        return f"{self.topic_prefix}/{t}"


# -- a few packets over asyncio streams --------------------------------------------------------


async def read_packet(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """(first byte, body) of the next packet."""
    head = await reader.readexactly(2)
    first, length, shift, byte = head[0], 0, 0, head[1]
    while True:
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
        if shift > 21:
            raise MalformedPacket("remaining length too long")
        byte = (await reader.readexactly(1))[0]
    return first, await reader.readexactly(length) if length else b""


async def open_session(plan: Plan, i: int, sem: asyncio.Semaphore, counts: dict[str, int]) -> None:
    """Connect with clean session 0, subscribe QoS 1, disconnect: an offline persistent session."""
    async with sem:
        reader, writer = await asyncio.open_connection(plan.host, plan.port)
        try:
            writer.write(encode_connect(plan.client_id(i), False, 60))
            first, body = await read_packet(reader)
            if first != 0x20 or decode_connack(0, body)[1] != 0:
                counts["refused"] += 1
                return
            writer.write(encode_subscribe(1, [(plan.topic(i // plan.per_topic), 1)]))
            first, body = await read_packet(reader)
            if first != 0x90 or body[2:] != b"\x01":
                counts["suback_not_qos1"] += 1
                return
            writer.write(DISCONNECT)
            counts["ok"] += 1
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass


class Publisher(asyncio.Protocol):
    """One shard's QoS 1 PUBLISHes: M rounds over its topics (so every topic's messages go out in
    sequence order), at most `window` unacknowledged, up to CHUNK packets per write."""

    def __init__(self, plan: Plan, shard: int) -> None:
        self.topics = [(t * plan.per_topic, plan.topic(t).encode()) for t in range(shard, plan.topics, plan.publishers)]
        self.total = len(self.topics) * plan.messages
        self.filler = bytes(plan.size - PAYLOAD.size)
        self.window = plan.window
        self.next = 0
        self.unacked: set[int] = set()
        self.acked = 0
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        loop = asyncio.get_running_loop()
        self.connack: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport

    def connection_lost(self, exc: Exception | None) -> None:
        for fut in (self.connack, self.done):
            if not fut.done():
                fut.set_exception(ConnectionError(f"publisher connection lost after {self.acked} PUBACKs: {exc}"))

    def pump(self) -> None:
        topics, n, unacked, pack, filler = self.topics, len(self.topics), self.unacked, PAYLOAD.pack, self.filler
        size = PAYLOAD.size + len(filler)
        while self.next < self.total and len(unacked) < self.window:
            out = []
            stop = min(self.total, self.next + CHUNK, self.next + self.window - len(unacked))
            for k in range(self.next, stop):
                pid = k % 65535 + 1
                first_session, topic = topics[k % n]
                unacked.add(pid)
                out.append(publish_header(topic, size, 1, False, False, pid))
                out.append(pack(first_session, k // n))
                out.append(filler)
            self.next = stop
            self.transport.write(b"".join(out))  # type: ignore[union-attr]  # connected
        if self.acked == self.total and not self.done.done():
            self.done.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self.buf:
            data, self.buf = self.buf + data, b""
        pos = 0
        while pos < len(data):
            found = frame(data, pos, MAX_PACKET)
            if found is None:
                break
            first, start, pos = found
            if first == 0x20:
                if not self.connack.done():
                    self.connack.set_result(None)
            elif first == 0x40:
                pid = (data[start] << 8) | data[start + 1]
                if pid in self.unacked:
                    self.unacked.discard(pid)
                    self.acked += 1
            else:
                raise MalformedPacket(f"publisher: unexpected packet {first:#04x}")
        self.buf = data[pos:]
        if self.connack.done():
            self.pump()


async def fill(plan: Plan) -> dict:
    loop = asyncio.get_running_loop()
    t0 = time.monotonic()
    pubs = []
    for k in range(min(plan.publishers, plan.topics)):
        pub = Publisher(plan, k)
        await loop.create_connection(lambda pub=pub: pub, plan.host, plan.port)  # type: ignore[misc]  # pub: bound now
        pub.transport.write(encode_connect(f"{plan.prefix}pub{k}", True, 60))  # type: ignore[union-attr]  # connected
        pubs.append(pub)
    await asyncio.gather(*(p.connack for p in pubs))
    t_build = time.monotonic()
    for p in pubs:
        p.pump()
    await asyncio.gather(*(p.done for p in pubs))
    elapsed = time.monotonic() - t_build
    for p in pubs:
        p.transport.write(DISCONNECT)  # type: ignore[union-attr]  # connected
        p.transport.close()  # type: ignore[union-attr]  # connected
    published = sum(p.acked for p in pubs)
    return {"published": published, "fill_s": round(elapsed, 2), "fill_rate": round(published / elapsed),
            "build_s": round(t_build - t0, 2)}


async def make_sessions(plan: Plan) -> dict:
    sem = asyncio.Semaphore(plan.concurrency)
    counts = {"ok": 0, "refused": 0, "suback_not_qos1": 0}
    t0 = time.monotonic()
    results = await asyncio.gather(*(open_session(plan, i, sem, counts) for i in range(plan.sessions)),
                                   return_exceptions=True)
    elapsed = time.monotonic() - t0
    errors = [r for r in results if isinstance(r, BaseException)]
    return {"sessions_ok": counts["ok"], "sessions_refused": counts["refused"],
            "sessions_suback_not_qos1": counts["suback_not_qos1"], "sessions_errors": len(errors),
            "sessions_error": repr(errors[0]) if errors else None, "sessions_s": round(elapsed, 2),
            "sessions_rate": round(plan.sessions / elapsed)}


async def probe(plan: Plan, t0: float, timeout: float) -> dict:
    """Session 0 comes back: time to CONNACK and to its first queued message (from t0, the broker's start);
    then all its M messages, acknowledged, checked in order."""
    deadline = t0 + timeout
    attempts = 0
    t_tcp = None
    while True:
        attempts += 1
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(plan.host, plan.port), 1.0)
            break
        except (TimeoutError, OSError):
            if time.monotonic() > deadline:
                return {"error": f"no TCP connection in {timeout} s"}
            await asyncio.sleep(0.01)
    t_tcp = time.monotonic() - t0
    out: dict = {"probe_connect_attempts": attempts, "tcp_accepted_s": round(t_tcp, 3)}
    try:
        writer.write(encode_connect(plan.client_id(0), False, 60))
        first, body = await asyncio.wait_for(read_packet(reader), deadline - time.monotonic())
        if first != 0x20:
            return {**out, "error": f"expected CONNACK, got {first:#04x}"}
        present, code = decode_connack(0, body)
        out.update(connack_s=round(time.monotonic() - t0, 3), session_present=present, connack_code=code)
        seqs: list[int] = []
        dups = 0
        while len(seqs) < plan.messages:
            first, body = await asyncio.wait_for(read_packet(reader), deadline - time.monotonic())
            if first & 0xF0 != 0x30:
                continue
            tlen = (body[0] << 8) | body[1]
            pid = (body[2 + tlen] << 8) | body[3 + tlen]
            session, seq = PAYLOAD.unpack_from(body, 4 + tlen)
            if not seqs and not dups:
                out["first_message_s"] = round(time.monotonic() - t0, 3)
            if first & 0x08:
                dups += 1
            if session != 0:
                return {**out, "error": f"a message of session {session} reached session 0"}
            seqs.append(seq)
            writer.write(encode_puback(pid))
        out.update(all_messages_s=round(time.monotonic() - t0, 3), probe_received=len(seqs), probe_dup_flag=dups,
                   probe_in_order=seqs == list(range(plan.messages)))
        writer.write(DISCONNECT)
    except TimeoutError:
        out["error"] = f"timed out after {timeout} s"
    except (OSError, asyncio.IncompleteReadError, MalformedPacket) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        writer.close()
    return out


# -- the broker side ----------------------------------------------------------------------------


def router_of(broker: RunningBroker) -> psutil.Process | None:
    try:
        children = psutil.Process(broker.pid).children(recursive=True)
    except psutil.Error:
        return None
    for child in children:
        if process_name(child) == "router":
            return child
    return None


def rss_mb(broker: RunningBroker) -> dict:
    """Router RSS and the whole broker's, in MB."""
    router, total = router_of(broker), 0
    try:
        for proc in [psutil.Process(broker.pid), *psutil.Process(broker.pid).children(recursive=True)]:
            total += proc.memory_info().rss
        router_rss = router.memory_info().rss if router else 0
    except psutil.Error:
        return {"router": None, "broker": None}
    return {"router": round(router_rss / 2**20, 1), "broker": round(total / 2**20, 1)}


def disk(data_dir: str) -> dict:
    sizes: dict[str, float] = {}
    for suffix in ("", "-wal", "-shm"):
        path = os.path.join(data_dir, "plexmq.db" + suffix)
        sizes["db" + suffix.replace("-", "_")] = os.path.getsize(path) if os.path.exists(path) else 0
    sizes["total_mb"] = round(sum(sizes.values()) / 2**20, 1)
    return sizes


# log lines of a start, and what their time (from the start) is called in the result
MARKS = (("plexmq listening on", "log_acceptor_listening_s"),  # after the acceptor's check of the store
         ("persistent sessions,", "log_router_loaded_s"),  # the router has read the store
         ("ready (pid", "log_worker_ready_s"))
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")


def stop_lines(broker: RunningBroker) -> list[str]:
    """What the broker logged from SIGTERM on (which process stopped when, any it had to kill)."""
    try:
        with open(broker.log_path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    start = max((i for i, line in enumerate(lines) if line.endswith(": stopping")), default=len(lines))
    return [line[11:] for line in lines[start:]][:20]  # without the date


def restart_log(broker: RunningBroker, offset: int) -> dict:
    """From the log of the restart (after `offset`): what the router says it loaded, and when (seconds
    from the start) the acceptor, the router and the first worker said they were ready."""
    try:
        with open(broker.log_path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return {}
    out: dict = {}
    found = re.findall(r"(\d+) persistent sessions, (\d+) queued or unacknowledged messages", text)
    if found:
        out.update(loaded_sessions=int(found[-1][0]), loaded_messages=int(found[-1][1]))
    for line in text.splitlines():
        stamp = LOG_TIME.match(line)
        if not stamp:
            continue
        for needle, key in MARKS:
            if needle in line and key not in out:
                wall = time.mktime(time.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S")) + int(stamp.group(2)) / 1000
                out[key] = round(wall - broker.started_wall, 3)
    return out


def run(plan: Plan, workers: int, extra: list[str], data_dir: str | None, timeout: float, say) -> dict:
    import uvloop

    base = tempfile.mkdtemp(prefix="plexbench-durab-")
    own = data_dir is None
    data_dir = data_dir or os.path.join(base, "data")
    spec = BrokerSpec("plexmq", "plexmq", workers=workers, extra=[*extra, "--data-dir", data_dir])
    result: dict = {"plan": asdict(plan), "workers": workers, "broker_args": extra, "data_dir": data_dir}
    broker = None
    try:
        broker = RunningBroker(spec, base)
        plan.port = broker.port
        result["broker_cmd"] = " ".join(broker.cmd)
        result["first_start_s"] = round(time.monotonic() - broker.started, 3)
        result["rss_empty_mb"] = rss_mb(broker)
        say(f"broker on port {plan.port}; creating {plan.sessions:,} persistent sessions")
        result.update(uvloop.run(make_sessions(plan)))
        time.sleep(1.0)  # let the router take every GONE
        result["rss_sessions_mb"] = rss_mb(broker)
        say(f"  {result['sessions_ok']:,} sessions in {result['sessions_s']} s; "
            f"router {result['rss_sessions_mb']['router']} MB. Publishing {plan.sessions * plan.messages:,} messages")
        router = router_of(broker)
        cpu_before = cpu_seconds([router]) if router is not None else 0.0
        result.update(uvloop.run(fill(plan)))
        if router is not None:  # what the store costs the router per message kept (the fill is all QoS 1 to stored sessions)
            result["fill_router_cpu_s"] = round(cpu_seconds([router]) - cpu_before, 2)
            result["fill_router_us_per_msg"] = round(1e6 * result["fill_router_cpu_s"] / max(result["published"], 1), 1)
        time.sleep(1.0)
        result["rss_filled_mb"] = rss_mb(broker)
        result["disk_filled"] = disk(data_dir)
        say(f"  {result['published']:,} acknowledged in {result['fill_s']} s ({result['fill_rate']:,}/s); router "
            f"{result['rss_filled_mb']['router']} MB, store {result['disk_filled']['total_mb']} MB. Restarting")
        t = time.monotonic()
        broker.stop()
        result["stop_s"] = round(time.monotonic() - t, 3)
        result["stop_status"] = broker.proc.returncode
        result["stop_log"] = stop_lines(broker)
        result["disk_stopped"] = disk(data_dir)
        offset = os.path.getsize(broker.log_path)
        broker = RunningBroker(spec, base, port=plan.port, wait=False)
        result.update(uvloop.run(probe(plan, broker.started, timeout)))
        result.update(restart_log(broker, offset))
        time.sleep(0.5)
        result["rss_restarted_mb"] = rss_mb(broker)
        if not broker.alive():
            result["error"] = f"the restarted broker exited: {broker.log_tail()}"
    finally:
        if broker is not None:
            broker.stop()
        expected = plan.sessions * plan.messages
        result["ok"] = bool(
            not result.get("error") and result.get("sessions_ok") == plan.sessions
            and result.get("published") == expected and result.get("probe_in_order") and result.get("session_present")
            and result.get("loaded_messages") == expected and result.get("loaded_sessions") == plan.sessions)
        if own:
            shutil.rmtree(data_dir, ignore_errors=True)
        if result["ok"]:
            shutil.rmtree(base, ignore_errors=True)
        else:
            result["log_dir"] = base  # the broker's log, for what went wrong
    return result


def table(r: dict) -> str:
    p = r["plan"]

    def mb(d: dict | None) -> str:
        return f"router {d['router']} MB, whole broker {d['broker']} MB" if d else "-"

    d, s = r.get("disk_filled", {}), r.get("disk_stopped", {})
    rows = [
        ("load", (f"{p['sessions']:,} persistent sessions x {p['messages']} QoS 1 messages of {p['size']} B "
                 f"({p['sessions'] * p['messages']:,}), {p['per_topic']} session(s) per topic, "
                 f"{p['publishers']} publishers, window {p['window']}")),
        ("broker", r.get("broker_cmd", "-")),
        ("first start", f"{r.get('first_start_s', '-')} s to a CONNACK (empty store)"),
        ("sessions", f"{r.get('sessions_ok', 0):,} in {r.get('sessions_s', '-')} s "
                     f"({r.get('sessions_rate', 0):,}/s), refused {r.get('sessions_refused', 0)}, "
                     f"errors {r.get('sessions_errors', 0)} {r.get('sessions_error') or ''}".rstrip()),
        ("fill", f"{r.get('published', 0):,} acknowledged in {r.get('fill_s', '-')} s ({r.get('fill_rate', 0):,}/s); "
                 f"router CPU {r.get('fill_router_cpu_s', '-')} s, {r.get('fill_router_us_per_msg', '-')} us per message"),
        ("rss empty", mb(r.get("rss_empty_mb"))),
        ("rss sessions", mb(r.get("rss_sessions_mb"))),
        ("rss filled", mb(r.get("rss_filled_mb"))),
        ("disk filled", (f"{d.get('total_mb', '-')} MB (db {d.get('db', 0):,} B, wal {d.get('db_wal', 0):,} B, "
                        f"shm {d.get('db_shm', 0):,} B)")),
        ("stop", (f"SIGTERM to exit {r.get('stop_s', '-')} s (status {r.get('stop_status', '-')}); disk after "
                 f"{s.get('total_mb', '-')} MB (db {s.get('db', 0):,} B, wal {s.get('db_wal', 0):,} B)")),
        ("stop log", " | ".join(line.split(" INFO ")[-1].split(" WARNING ")[-1] for line in r.get("stop_log", [])) or "-"),
        ("restart", (f"TCP accepted {r.get('tcp_accepted_s', '-')} s, CONNACK {r.get('connack_s', '-')} s "
                    f"(session present {r.get('session_present', '-')}), first queued message "
                    f"{r.get('first_message_s', '-')} s, all {p['messages']} {r.get('all_messages_s', '-')} s "
                    f"(in order: {r.get('probe_in_order', '-')})")),
        ("restart log", (f"acceptor checked the store and listens {r.get('log_acceptor_listening_s', '-')} s, "
                        f"router loaded {r.get('log_router_loaded_s', '-')} s, worker ready "
                        f"{r.get('log_worker_ready_s', '-')} s")),
        ("loaded", f"{r.get('loaded_sessions', '-'):,} sessions, {r.get('loaded_messages', '-'):,} messages"
         if "loaded_sessions" in r else "-"),
        ("rss restarted", mb(r.get("rss_restarted_mb"))),
    ]
    if r.get("error"):
        rows.append(("error", r["error"]))
    if r.get("log_dir"):
        rows.append(("broker log", r["log_dir"]))
    rows.append(("result", "OK" if r["ok"] else "NOT OK"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plexmq.bench.durability", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--sessions", type=int, default=10_000, help="offline persistent sessions (10000)")
    parser.add_argument("-m", "--messages", type=int, default=100, help="QoS 1 messages queued per session (100)")
    parser.add_argument("-s", "--size", type=int, default=64, help=f"payload bytes, >= {PAYLOAD.size} (64)")
    parser.add_argument("--per-topic", type=int, default=1,
                        help="sessions subscribed to each topic (1: every session its own topic)")
    parser.add_argument("--publishers", type=int, default=10, help="publishers, one per shard of the topics (10)")
    parser.add_argument("--window", type=int, default=1000, help="unacknowledged PUBLISH per publisher (1000)")
    parser.add_argument("--concurrency", type=int, default=200, help="session handshakes in flight (200)")
    parser.add_argument("--workers", type=int, default=1, help="plexmq workers (1)")
    parser.add_argument("--broker-arg", action="append", default=[], help="extra argument for plexmq serve "
                        "(e.g. --broker-arg=--sync --broker-arg=full)")
    parser.add_argument("--data-dir", help="use (and keep) this data dir; default: a fresh temporary one, removed")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds the restarted broker has to serve")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (table to stderr)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    ns = parser.parse_args(argv)
    if ns.size < PAYLOAD.size:
        parser.error(f"--size must be at least {PAYLOAD.size}")
    if not 1 <= ns.window <= 65535:
        parser.error("--window must be 1 to 65535 (packet identifiers)")
    if min(ns.sessions, ns.messages, ns.per_topic, ns.publishers, ns.concurrency) < 1:
        parser.error("counts must be positive")
    plan = Plan(sessions=ns.sessions, messages=ns.messages, size=ns.size, per_topic=ns.per_topic,
                publishers=ns.publishers, window=ns.window, concurrency=ns.concurrency)

    def say(text: str) -> None:
        if not ns.quiet:
            print(text, file=sys.stderr, flush=True)

    t0 = time.monotonic()
    result = run(plan, ns.workers, ns.broker_arg, ns.data_dir, ns.timeout, say)
    result["wall_s"] = round(time.monotonic() - t0, 1)
    result["date"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    text = table(result)
    if ns.json:
        print(text, file=sys.stderr)
        print(json.dumps(result, indent=1))
    else:
        print(text)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
