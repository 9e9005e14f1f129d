"""`python -m plexmq.bench.reconnect` (or `plexmq bench reconnect`): a reconnect storm. N idle clients
are connected, the broker is restarted on the same port and data dir, and every client comes back as
a device does; the time until all have their CONNACK again.

Per broker (`--brokers`, each its own fresh broker on a free loopback port and a data dir of its own):
1. N clients with stable ids (<prefix><i>) connect, at most --max-pending handshakes in flight per
   generator process, and stay idle (a PINGREQ every keepalive/2);
2. the broker is stopped: SIGTERM as a service restart sends it (plexmq: to the acceptor, which stops
   its children), or with --kill SIGKILL of every process of the broker at once;
3. it is started again on the same port with the same data dir. Every client that saw its connection
   close reconnects after a delay uniform in [0, --jitter] s; a refused, failed or timed-out attempt
   is tried again after a backoff (--backoff doubling to --backoff-max, each delay drawn from its upper
   half), without limit on the handshakes in flight: the devices do not coordinate;
4. the times from the new broker's start, from its port's listening and from its first CONNACK until
   the last client's CONNACK; the broker's CPU over them (every process of its tree), the
   generator's own, and how many CONNACKs said session present.

The generator: forked processes (`limits.procs_needed` for the open-file limit, source addresses
127.0.0.x past half the port range), each one epoll loop over plain non-blocking sockets: a client is
a few integers and a socket, its timers one heap per process, never a task or a callback object each.
Exit status: 0 every broker measured had all N back (and, --persistent, every session resumed); 1 otherwise.
"""

from __future__ import annotations

import argparse
import errno
import heapq
import json
import multiprocessing as mp
import os
import random
import select
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection, wait
from time import monotonic
from typing import cast

import psutil

from plexmq.bench import compare, limits, wire
from plexmq.bench.brokers import RunningBroker
from plexmq.bench.client import PINGREQ
from plexmq.bench.connector import CONNACK, DISCONNECT, PINGRESP, start_connect
from plexmq.bench.monitor import BrokerMonitor, cpu_seconds
from plexmq.mqtt.framing import MalformedPacket, frame

IDLE, CONNECTING, HANDSHAKE, READY = range(4)  # IDLE: not connected, waiting for its (re)connect time
STATS_EVERY = 0.5  # seconds between a generator process's counters to the controller
SWEEP_EVERY = 0.25  # seconds between checks of attempts past --connect-timeout
CPU_EVERY = 0.1  # seconds between samples of the broker's CPU after its restart
MAX_PACKET = 1 << 16
IN, OUT = select.EPOLLIN, select.EPOLLOUT
# sock_diag (linux/inet_diag.h): the listening sockets, asked of the kernel
NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, NLM_F_DUMP, NLMSG_ERROR, NLMSG_DONE = 4, 20, 1, 0x300, 2, 3
TCP_LISTEN = 10
NL_HDR = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
DIAG_REQ = struct.Struct("=BBBBI48s")  # inet_diag_req_v2: family, protocol, ext, pad, states, a zero inet_diag_sockid
SPORT = struct.Struct(">H")


@dataclass
class Plan:
    clients: int = 100_000
    procs: int = 0  # generator processes; 0: the cores, more where the open-file limit needs them
    protocol: int = 4
    persistent: bool = False  # 3.1.1 clean session 0 (5.0: clean start 0 and a session expiry)
    keepalive: int = 60
    jitter: float = 1.0
    backoff: float = 0.1
    backoff_max: float = 2.0
    connect_timeout: float = 10.0
    max_pending: int = 64  # handshakes in flight per process while the clients first connect
    prefix: str = "reconnect-"
    kill: bool = False
    timeout: float = 300.0  # seconds each phase (first connect, coming back) may take
    host: str = "127.0.0.1"
    port: int = 0
    source_addrs: int = -1
    sources: list[str] = field(default_factory=list)


# -- one generator process ----------------------------------------------------------------------


class Fleet:
    """The clients [first, first + n) of one generator process, in one epoll loop."""

    def __init__(self, plan: Plan, index: int, first: int, n: int, pipe: Connection) -> None:
        self.plan, self.index, self.first, self.n, self.pipe = plan, index, first, n, pipe
        self.address = (plan.host, plan.port)
        self.sources = plan.sources
        self.rng = random.Random(index * 7919 + first)
        self.connects = [wire.connect(plan.protocol, f"{plan.prefix}{first + i}", not plan.persistent, plan.keepalive)
                         for i in range(n)]
        self.socks: list[socket.socket | None] = [None] * n
        self.state = bytearray(n)
        self.fails = bytearray(n)  # failed attempts in a row (capped), for the backoff
        self.started = [0.0] * n  # when the current attempt began
        self.pinged = [0.0] * n  # when the client last sent something (its CONNECT or a PINGREQ)
        self.back = bytearray(n)  # connected again since the restart, and still
        self.bufs: dict[int, bytes] = {}  # a packet's start that came without its end
        self.by_fd: dict[int, int] = {}
        self.inflight: set[int] = set()
        self.queue: deque[int] = deque()  # waiting for a slot of max_pending (first connect only)
        self.timers: list[tuple[float, int]] = []
        self.limit = plan.max_pending
        self.epoll = select.epoll()
        self.armed = False  # the broker is about to restart: drops and CONNACKs from here on are the storm's
        self.running = True
        self.c: dict = {"connected": 0, "connect_attempts": 0, "connect_failed": 0, "connect_errors": {},
                        "t_connect0": 0.0, "t_connected": 0.0, "dropped_early": 0, "pings": 0, "pongs": 0,
                        "protocol_errors": 0, "notes": [],
                        # the storm (after "arm")
                        "dropped": 0, "attempts": 0, "failed": 0, "errors": {}, "back": 0, "present": 0,
                        "absent": 0, "redropped": 0, "failed_before_start": 0,
                        "t_first_drop": 0.0, "t_last_failed": 0.0, "t_first_back": 0.0, "t_all_back": 0.0}

    # -- one client's attempt, step by step

    def begin(self, i: int) -> None:
        if self.limit and len(self.inflight) >= self.limit:
            self.queue.append(i)
            return
        now = monotonic()
        self.state[i] = CONNECTING
        self.started[i] = now
        self.inflight.add(i)
        self.c["attempts" if self.armed else "connect_attempts"] += 1
        sources = self.sources
        try:
            sock, err = start_connect(self.address, sources[(self.first + i) % len(sources)] if sources else None)
        except OSError as exc:
            self.fail(i, errno.errorcode.get(exc.errno or 0, type(exc).__name__))
            return
        self.socks[i] = sock
        fd = sock.fileno()
        self.by_fd[fd] = i
        if err == 0:
            self.epoll.register(fd, IN)
            self.send_connect(i, sock)
        elif err == errno.EINPROGRESS:
            self.epoll.register(fd, OUT)
        else:
            self.fail(i, errno.errorcode.get(err, str(err)))

    def writable(self, i: int, sock: socket.socket) -> None:
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            self.fail(i, errno.errorcode.get(err, str(err)))
            return
        self.epoll.modify(sock.fileno(), IN)
        self.send_connect(i, sock)

    def send_connect(self, i: int, sock: socket.socket) -> None:
        self.state[i] = HANDSHAKE
        try:
            sock.send(self.connects[i])
        except OSError as exc:
            self.fail(i, errno.errorcode.get(exc.errno or 0, "send_failed"))
            return
        self.pinged[i] = monotonic()

    def readable(self, i: int, sock: socket.socket) -> None:
        try:
            data = sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.closed(i, errno.errorcode.get(exc.errno or 0, "recv_failed"))
            return
        if not data:
            self.closed(i, "closed_by_broker")
            return
        if i in self.bufs:
            data = self.bufs.pop(i) + data
        pos = 0
        level = self.plan.protocol
        try:
            while pos < len(data):
                found = frame(data, pos, MAX_PACKET)
                if found is None:
                    self.bufs[i] = data[pos:]
                    return
                first, start, pos = found
                kind = first & 0xF0
                if first == PINGRESP and self.state[i] == READY:
                    self.c["pongs"] += 1
                elif kind == CONNACK and self.state[i] == HANDSHAKE:
                    present, code = wire.connack(level, first & 0x0F, data[start:pos])
                    if code:
                        self.fail(i, f"connack_{code:#04x}")
                        return
                    self.ready(i, present)
                elif kind == DISCONNECT:
                    code = wire.disconnect_reason(level, first & 0x0F, data[start:pos])
                    self.closed(i, f"disconnect_{code:#04x}")
                    return
                else:
                    raise MalformedPacket(f"unexpected packet (first byte {first:#04x})")
        except MalformedPacket as exc:
            self.c["protocol_errors"] += 1
            if len(self.c["notes"]) < 5:
                self.c["notes"].append(f"protocol error: {exc}")
            self.closed(i, "protocol_error")

    def ready(self, i: int, present: bool) -> None:
        now = monotonic()
        self.state[i] = READY
        self.inflight.discard(i)
        self.fails[i] = 0
        c = self.c
        c["connected"] += 1
        if self.armed:
            c["present" if present else "absent"] += 1
            self.back[i] = 1
            c["back"] += 1
            c["t_first_back"] = c["t_first_back"] or now
            if c["back"] == self.n and not c["t_all_back"]:
                c["t_all_back"] = now
                self.report("back")
        elif c["connected"] == self.n and not c["t_connected"]:
            c["t_connected"] = now
            self.limit = 0  # from now on a (re)connect starts when it is due, however many are in flight
            self.report("connected")
        self.refill()

    def release(self, i: int) -> None:
        """Close the client's socket; it is IDLE until its timer starts it again."""
        sock, self.socks[i] = self.socks[i], None
        if sock is not None:
            self.by_fd.pop(sock.fileno(), None)
            sock.close()  # which also takes it out of the epoll set
        self.bufs.pop(i, None)
        self.state[i] = IDLE

    def fail(self, i: int, kind: str) -> None:
        """An attempt that got no CONNACK: counted by cause, tried again after the backoff."""
        c = self.c
        errors = c["errors" if self.armed else "connect_errors"]
        errors[kind] = errors.get(kind, 0) + 1
        c["failed" if self.armed else "connect_failed"] += 1
        c["t_last_failed"] = monotonic()
        self.inflight.discard(i)
        self.release(i)
        fails = self.fails[i] = min(self.fails[i] + 1, 30)
        delay = min(self.plan.backoff * 2 ** (fails - 1), self.plan.backoff_max)
        heapq.heappush(self.timers, (monotonic() + self.rng.uniform(delay / 2, delay), i))
        self.refill()

    def closed(self, i: int, kind: str) -> None:
        if self.state[i] != READY:
            self.fail(i, kind)
            return
        c = self.c
        c["connected"] -= 1
        self.release(i)
        if self.armed:
            c["dropped"] += 1
            c["t_first_drop"] = c["t_first_drop"] or monotonic()
            if self.back[i]:  # it had come back already: it needs to once more
                self.back[i] = 0
                c["back"] -= 1
                c["redropped"] += 1
        else:
            c["dropped_early"] += 1
        heapq.heappush(self.timers, (monotonic() + self.rng.uniform(0, self.plan.jitter), i))

    def refill(self) -> None:
        while self.queue and (not self.limit or len(self.inflight) < self.limit):
            self.begin(self.queue.popleft())

    # -- the loop

    def report(self, kind: str) -> None:
        self.pipe.send((kind, self.index, self.c))

    def command(self) -> None:
        while self.pipe.poll():
            cmd = self.pipe.recv()
            if cmd == "connect":
                self.c["t_connect0"] = monotonic()
                self.queue.extend(range(self.n))
                self.refill()
            elif cmd == "arm":
                self.armed = True
                self.report("armed")
            elif cmd == "started":  # the broker is starting again: the failures until now were refusals of none
                self.c["failed_before_start"] = self.c["failed"]
            elif cmd == "finish":
                self.running = False

    def sweep(self, now: float) -> None:
        """Attempts past the connect timeout fail; idle clients due a PINGREQ get one."""
        limit = now - self.plan.connect_timeout
        for i in [i for i in self.inflight if self.started[i] < limit]:
            self.fail(i, "connect_timeout" if self.state[i] == CONNECTING else "handshake_timeout")

    def ping(self, now: float) -> None:
        due = now - self.plan.keepalive / 2
        state, pinged, socks = self.state, self.pinged, self.socks
        for i in range(self.n):
            if state[i] == READY and pinged[i] < due:
                sock = socks[i]
                try:
                    sock.send(PINGREQ)  # type: ignore[union-attr]  # READY: it has its socket
                    self.c["pings"] += 1
                except OSError:
                    pass  # its reader sees the close
                pinged[i] = now

    def run(self) -> None:
        epoll, by_fd, socks, state, timers = self.epoll, self.by_fd, self.socks, self.state, self.timers
        pipe_fd = self.pipe.fileno()
        epoll.register(pipe_fd, IN)
        next_stats = next_sweep = next_ping = monotonic()
        while self.running:
            now = monotonic()
            wake = min(next_sweep, next_stats, timers[0][0] if timers else next_sweep)
            for fd, events in epoll.poll(max(0.0, wake - now), 1024):
                if fd == pipe_fd:
                    self.command()
                    continue
                i = by_fd.get(fd, -1)
                sock = socks[i] if i >= 0 else None
                if sock is None:
                    continue
                if state[i] == CONNECTING:
                    self.writable(i, sock)
                elif events & (IN | select.EPOLLERR | select.EPOLLHUP):
                    self.readable(i, sock)
            now = monotonic()
            while timers and timers[0][0] <= now:
                _, i = heapq.heappop(timers)
                if state[i] == IDLE:
                    self.begin(i)
            if now >= next_sweep:
                self.sweep(now)
                next_sweep = now + SWEEP_EVERY
            if now >= next_ping:
                self.ping(now)
                next_ping = now + 1.0
            if now >= next_stats:
                self.report("stats")
                next_stats = now + STATS_EVERY
        for sock in socks:
            if sock is not None:
                sock.close()
        self.report("final")


def generate(plan: Plan, index: int, first: int, n: int, pipe: Connection) -> None:
    """A generator process's body (forked)."""
    try:
        Fleet(plan, index, first, n, pipe).run()
    except KeyboardInterrupt:
        pass


# -- the controller -----------------------------------------------------------------------------


class Storm:
    """The generator processes of one broker's run, and the counters they report."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        ctx = mp.get_context("fork")
        self.pipes: list[Connection] = []
        self.children: list[mp.process.BaseProcess] = []
        self.latest: dict[int, dict] = {}
        self.events: dict[str, dict[int, dict]] = {}
        for k in range(plan.procs):
            first = k * plan.clients // plan.procs
            n = (k + 1) * plan.clients // plan.procs - first
            ours, theirs = ctx.Pipe()
            child = ctx.Process(target=generate, name=f"reconnect-{k}", daemon=True, args=(plan, k, first, n, theirs))
            child.start()
            theirs.close()
            self.pipes.append(ours)
            self.children.append(child)
        self.procs = [psutil.Process(c.pid) for c in self.children]

    def send(self, cmd: str) -> None:
        for pipe in self.pipes:
            pipe.send(cmd)

    def pump(self, timeout: float) -> None:
        for pipe in cast(list[Connection], wait(self.pipes, timeout)):
            try:
                while pipe.poll():
                    kind, index, counters = pipe.recv()
                    self.latest[index] = counters
                    self.events.setdefault(kind, {})[index] = counters
            except EOFError:
                self.pipes.remove(pipe)

    def all(self, kind: str) -> bool:
        return len(self.events.get(kind, {})) == self.plan.procs

    def wait(self, kind: str, timeout: float, tick: Callable[[], None]) -> bool:
        """Pump until every process said `kind`; False at the timeout or if they died."""
        deadline = monotonic() + timeout
        while not self.all(kind):
            if monotonic() > deadline or not self.pipes:
                return False
            self.pump(min(0.05, max(deadline - monotonic(), 0)))
            tick()
        return True

    def total(self, key: str, kind: str | None = None) -> int:
        rows = self.latest if kind is None else self.events.get(kind, {})
        return sum(c[key] for c in rows.values())

    def errors(self, key: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.latest.values():
            for kind, n in c[key].items():
                out[kind] = out.get(kind, 0) + n
        return out

    def cpu(self) -> float:
        return cpu_seconds(self.procs)

    def close(self) -> None:
        if self.pipes:
            self.send("finish")
            deadline = monotonic() + 10
            while not self.all("final") and self.pipes and monotonic() < deadline:
                self.pump(0.1)
        for child in self.children:
            child.join(5)
            if child.is_alive():
                child.kill()


def listens(port: int) -> bool:
    """Whether a TCP socket of this machine listens on `port` (IPv4), asked of the kernel (sock_diag
    over netlink, listening sockets only: its cost does not grow with the connections)."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
        body = DIAG_REQ.pack(socket.AF_INET, socket.IPPROTO_TCP, 0, 0, 1 << TCP_LISTEN, b"")
        nl.send(NL_HDR.pack(NL_HDR.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + body)
        while data := nl.recv(65536):
            pos = 0
            while pos + NL_HDR.size <= len(data):
                length, kind, _, _, _ = NL_HDR.unpack_from(data, pos)
                if kind in (NLMSG_DONE, NLMSG_ERROR):
                    return False
                # inet_diag_msg: family, state, timer, retrans, then its inet_diag_sockid, the source port first
                if SPORT.unpack_from(data, pos + NL_HDR.size + 4)[0] == port:
                    return True
                pos += (length + 3) & ~3
    return False


def watch_listening(port: int, out: dict, stop: threading.Event) -> None:
    """out["t_listening"]: when the broker's port is first in LISTEN, asked every 2 ms. (Why not a
    connect: a refusal, an accept and a SYN dropped from a full accept queue are told apart only by
    a timeout, and on a busy machine a probe's timeout passes before it even runs.)"""
    while not stop.is_set():
        try:
            if listens(port):
                out["t_listening"] = monotonic()
                return
        except OSError as exc:  # no sock_diag here: the time from listening is not known
            out["error"] = str(exc)
            return
        time.sleep(0.002)


def measure(name: str, plan: Plan, workers: int, extra: list[str], log_dir: str, say: Callable[[str], None]) -> dict:
    """One broker: start it, connect the clients, restart it, time the storm."""
    s = compare.spec(name, workers, 1000, extra)
    data_dir = os.path.join(log_dir, f"{name}.data")
    os.makedirs(data_dir, exist_ok=True)
    s.data_dir = data_dir
    r: dict = {"broker_name": name, "workers": workers if s.kind == "plexmq" else None, "plan": asdict(plan),
               "notes": [], "ok": False}
    broker = RunningBroker(s, log_dir)
    storm: Storm | None = None
    stop = threading.Event()
    try:
        plan.port = broker.port
        r["broker_cmd"] = " ".join(broker.cmd)
        storm = Storm(plan)
        progress = Progress(storm, plan, say)
        # 1. connect
        gen0, t0 = storm.cpu(), monotonic()
        storm.send("connect")
        progress.phase = "connecting"
        if not storm.wait("connected", plan.timeout, progress.tick):
            r["notes"].append(f"only {storm.total('connected'):,} of {plan.clients:,} clients connected "
                              f"within {plan.timeout:g} s: no restart")
            return r
        connected = storm.events["connected"]
        t_connect0 = min(c["t_connect0"] for c in connected.values())
        connect_s = max(c["t_connected"] for c in connected.values()) - t_connect0
        r.update(connected_before=storm.total("connected", "connected"), connect_s=round(connect_s, 3),
                 connect_rate=round(plan.clients / connect_s) if connect_s else None,
                 connect_failed=storm.total("connect_failed"), connect_errors=storm.errors("connect_errors"),
                 generator_connect_cpu_pct=round((storm.cpu() - gen0) / (monotonic() - t0) * 100, 1))
        progress.sleep(0.5)  # every CONNECT registered with the router
        # 2. stop
        storm.send("arm")
        if not storm.wait("armed", 30, progress.tick):
            r["notes"].append("the generator processes did not take the restart")
            return r
        progress.phase = "stopping"
        t_stop = monotonic()
        if plan.kill:
            broker.kill()
        broker.stop()
        r["stop_s"] = round(monotonic() - t_stop, 3)
        r["stop_status"] = broker.proc.returncode
        # 3. start again, on the same port and data dir
        gen0 = storm.cpu()
        broker = RunningBroker(s, log_dir, port=plan.port, wait=False)
        t_start = broker.started
        storm.send("started")
        monitor = BrokerMonitor(broker.pid)
        marks: dict = {}
        threading.Thread(target=watch_listening, args=(plan.port, marks, stop), daemon=True).start()
        samples = [(t_start, 0.0)]
        progress.phase = "restarted"
        deadline = t_start + plan.timeout
        next_cpu = monotonic()
        while not storm.all("back") and monotonic() < deadline and storm.pipes:
            storm.pump(0.02)
            if monotonic() >= next_cpu:
                samples.append((monotonic(), monitor.cpu_seconds()))
                next_cpu += CPU_EVERY
            progress.tick()
        t_end = monotonic()
        broker_cpu = monitor.cpu_seconds()
        gen_cpu = storm.cpu() - gen0
        samples.append((t_end, broker_cpu))
        stop.set()
        storm.pump(0.3)  # the last stats: anything dropped again at once
        progress.done()
        r.update(report(storm, plan, t_start, marks.get("t_listening"), t_end, samples, gen_cpu))
        if "error" in marks:
            r["notes"].append(f"cannot tell when the port listens: {marks['error']}")
        if not broker.alive():
            r["notes"].append(f"THE BROKER EXITED: {broker.log_tail()}")
            r["ok"] = False
        return r
    finally:
        stop.set()
        if storm is not None:
            storm.close()
        broker.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def report(storm: Storm, plan: Plan, t_start: float, t_listening: float | None, t_end: float,
           samples: list[tuple[float, float]], gen_cpu: float) -> dict:
    """The storm's numbers (times in seconds from the new broker's start unless said otherwise)."""
    n = plan.clients
    back = storm.total("back")
    all_back = storm.all("back")
    t_all = max(c["t_all_back"] for c in storm.events["back"].values()) if all_back else None
    firsts = [c["t_first_back"] for c in storm.latest.values() if c["t_first_back"]]
    t_first = min(firsts) if firsts else None
    if t_first is not None:  # a CONNACK went out: something listened (the watcher polls every 5 ms)
        t_listening = min(t_listening or t_first, t_first)
    drops = [c["t_first_drop"] for c in storm.latest.values() if c["t_first_drop"]]
    t_failed = max((c["t_last_failed"] for c in storm.latest.values()), default=0.0) or None
    broker_cpu = samples[-1][1]
    # the broker's CPU when its first CONNACK went out: the last sample before it (its start's cost)
    start_cpu = max((cpu for t, cpu in samples if t_first is not None and t <= t_first), default=0.0)
    wall = (t_all or t_end) - t_start

    def since(t: float | None, origin: float | None) -> float | None:
        return round(t - origin, 3) if t is not None and origin is not None else None

    serving = t_all - t_first if t_all is not None and t_first is not None else None
    listening_window = t_all - t_listening if t_all is not None and t_listening is not None else None
    out = {
        "clients": n, "back": back, "dropped": storm.total("dropped"), "redropped": storm.total("redropped"),
        "first_drop_before_start_s": round(t_start - min(drops), 3) if drops else None,
        "listening_s": since(t_listening, t_start), "first_connack_s": since(t_first, t_start),
        "all_back_s": since(t_all, t_start), "all_back_from_listening_s": since(t_all, t_listening),
        "all_back_from_first_connack_s": since(t_all, t_first),
        "reconnect_rate": round(n / listening_window) if listening_window else None,
        "attempts": storm.total("attempts"), "failed": storm.total("failed"),
        "failed_before_start": storm.total("failed_before_start"), "errors": storm.errors("errors"),
        "last_failed_s": since(t_failed, t_start),
        "session_present": storm.total("present"), "session_absent": storm.total("absent"),
        "broker_cpu_s": round(broker_cpu, 3), "broker_start_cpu_s": round(start_cpu, 3),
        "broker_cpu_pct": round(broker_cpu / wall * 100, 1) if wall > 0 else None,
        "broker_us_per_reconnect": round((broker_cpu - start_cpu) / n * 1e6, 1) if n and t_first is not None else None,
        "generator_cpu_s": round(gen_cpu, 3),
        "generator_cpu_pct": round(gen_cpu / wall * 100, 1) if wall > 0 else None,
        "procs": plan.procs, "pings": storm.total("pings"), "pongs": storm.total("pongs"),
        "protocol_errors": storm.total("protocol_errors"),
    }
    notes = [note for c in storm.latest.values() for note in c["notes"]]
    if not all_back:
        notes.append(f"NOT ALL BACK: {back:,} of {n:,} within {plan.timeout:g} s of the start")
    out["serving_rate"] = round(n / serving) if serving else None  # from the first CONNACK
    early = storm.total("dropped_early")
    if early:
        notes.append(f"{early:,} clients were dropped before the restart (and reconnected)")
    if out["redropped"]:
        notes.append(f"{out['redropped']:,} clients were dropped again after they had come back")
    present, absent = storm.total("present"), storm.total("absent")
    sessions_ok = not (plan.persistent and absent)
    if not sessions_ok:
        notes.append(f"SESSIONS LOST: {absent:,} CONNACKs after the restart said no session present"
                     + (" (SIGKILL: mosquitto writes its sessions at exit and every autosave_interval)" if plan.kill else ""))
    if not plan.persistent and present:
        notes.append(f"{present:,} CONNACKs of clean sessions said session present")
    out["notes"] = notes
    out["ok"] = all_back and sessions_ok and not out["protocol_errors"]
    return out


class Progress:
    """A progress line on stderr once a second."""

    def __init__(self, storm: Storm, plan: Plan, say: Callable[[str], None]) -> None:
        self.storm, self.plan, self.say = storm, plan, say
        self.phase = "starting"
        self.last = 0.0

    def tick(self) -> None:
        now = monotonic()
        if now - self.last < 1.0:
            return
        self.last = now
        st = self.storm
        line = f"   {self.phase:<11} connected {st.total('connected') if st.latest else 0:,}/{self.plan.clients:,}"
        if self.phase == "restarted":
            line += f"  back {st.total('back'):,}  failed attempts {st.total('failed'):,}"
        self.say(line)

    def sleep(self, seconds: float) -> None:
        deadline = monotonic() + seconds
        while monotonic() < deadline:
            self.storm.pump(min(0.05, max(deadline - monotonic(), 0)))
            self.tick()

    def done(self) -> None:
        self.last = 0.0
        self.tick()


# -- the table ------------------------------------------------------------------------------------

METRICS = [  # (label, key, digits)
    ("clients back", "back", 0),
    ("all back s (from start)", "all_back_s", 3),
    ("listening s (from start)", "listening_s", 3),
    ("first CONNACK s (from start)", "first_connack_s", 3),
    ("all back s (from listening)", "all_back_from_listening_s", 3),
    ("all back s (from first CONNACK)", "all_back_from_first_connack_s", 3),
    ("reconnects/s (from listening)", "reconnect_rate", 0),
    ("attempts", "attempts", 0),
    ("failed attempts", "failed", 0),
    ("of them before the start", "failed_before_start", 0),
    ("session present", "session_present", 0),
    ("broker cpu s (start to all back)", "broker_cpu_s", 2),
    ("broker cpu s (start to first CONNACK)", "broker_start_cpu_s", 2),
    ("broker cpu µs/reconnect (after first CONNACK)", "broker_us_per_reconnect", 1),
    ("broker cpu % (start to all back)", "broker_cpu_pct", 0),
    ("generator cpu % (start to all back)", "generator_cpu_pct", 0),
    ("stop s (signal to exit)", "stop_s", 3),
    ("first connect s", "connect_s", 3),
    ("first connect/s", "connect_rate", 0),
]


def table(results: dict[str, dict], plan: Plan) -> str:
    names = list(results)
    header = ["metric", *names, *(f"{names[0]}/{o}" for o in names[1:])]
    rows = [header]
    for label, key, digits in METRICS:
        values = [None if "skipped" in results[nm] else results[nm].get(key) for nm in names]
        cells = [label, *("-" if v is None else f"{v:,.{digits}f}" for v in values)]
        cells += [f"{values[0] / v:.2f}x" if values[0] is not None and v else "-" for v in values[1:]]
        rows.append(cells)
    rows.append(["result", *(results[nm].get("skipped") or ("OK" if results[nm]["ok"] else "NOT OK") for nm in names),
                 *("" for _ in names[1:])])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    title = (f"reconnect storm: {plan.clients:,} clients, MQTT {wire.NAMES[plan.protocol]}, "
             f"{'persistent sessions' if plan.persistent else 'clean sessions'}, jitter {plan.jitter:g} s, "
             f"backoff {plan.backoff:g}..{plan.backoff_max:g} s, {plan.procs} generator processes, "
             f"restart by {'SIGKILL' if plan.kill else 'SIGTERM'}")
    notes = [f"{nm}: {note}" for nm in names for note in results[nm].get("notes", [])]
    return "\n".join([title, *lines, *notes])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plexmq.bench.reconnect", description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--clients", type=int, default=100_000, help="idle clients (100000)")
    parser.add_argument("--brokers", default="plexmq,mosquitto", help="comma-separated, first is the base (plexmq,mosquitto)")
    parser.add_argument("--workers", type=int, default=8, help="plexmq workers (8, as idle100k; more if N needs them)")
    parser.add_argument("--plexmq-arg", action="append", default=[], help="extra argument for plexmq serve")
    parser.add_argument("-V", "--protocol", type=int, choices=wire.LEVELS, default=4,
                        help="MQTT protocol level of the clients: 4 = 3.1.1 (default), 5 = 5.0")
    parser.add_argument("--persistent", action="store_true",
                        help="persistent sessions (3.1.1 clean session 0; 5.0 clean start 0 and a session expiry): "
                             "each CONNACK after the restart should say session present")
    parser.add_argument("-k", "--keepalive", type=int, default=60, help="keepalive s; a PINGREQ every k/2 (60)")
    parser.add_argument("--jitter", type=float, default=1.0, help="a dropped client waits uniform [0, J] s (1.0)")
    parser.add_argument("--backoff", type=float, default=0.1, help="first retry delay after a failed attempt (0.1 s)")
    parser.add_argument("--backoff-max", type=float, default=2.0, help="the retry delay doubles up to this (2.0 s)")
    parser.add_argument("--connect-timeout", type=float, default=10.0,
                        help="an attempt without CONNACK this long fails and is retried (10 s)")
    parser.add_argument("--max-pending", type=int, default=64, help="handshakes in flight per process, first connect (64)")
    parser.add_argument("--kill", action="store_true", help="SIGKILL every process of the broker instead of SIGTERM")
    parser.add_argument("--procs", type=int, default=0, help="generator processes (default: cores, more for fds)")
    parser.add_argument("--source-addrs", type=int, default=-1,
                        help="bind to N source addresses 127.0.0.2..; -1 auto past half the port range, 0 never")
    parser.add_argument("--client-prefix", default="reconnect-", help="client ids are <prefix><i> (reconnect-)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds for the first connect, and for all to come back after the restart (300)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON (table to stderr)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    ns = parser.parse_args(argv)
    if ns.clients < 1 or ns.jitter < 0 or ns.backoff <= 0 or ns.backoff_max < ns.backoff or ns.keepalive < 1:
        parser.error("--clients and --keepalive must be positive, --jitter >= 0, 0 < --backoff <= --backoff-max")
    fd_limit = limits.raise_fd_limit()
    procs = max(ns.procs or os.cpu_count() or 1, limits.procs_needed(ns.clients, fd_limit))
    plan = Plan(clients=ns.clients, procs=min(procs, ns.clients), protocol=ns.protocol, persistent=ns.persistent,
                keepalive=ns.keepalive, jitter=ns.jitter, backoff=ns.backoff, backoff_max=ns.backoff_max,
                connect_timeout=ns.connect_timeout, max_pending=ns.max_pending, prefix=ns.client_prefix,
                kill=ns.kill, timeout=ns.timeout, source_addrs=ns.source_addrs)
    plan.sources, notes = limits.source_addresses(plan.host, plan.clients, plan.source_addrs)

    def say(text: str) -> None:
        if not ns.quiet:
            print(text, file=sys.stderr, flush=True)

    for note in notes:
        say(f"note: {note}")
    log_dir = tempfile.mkdtemp(prefix="plexbench-reconnect-")
    results: dict[str, dict] = {}
    for name in ns.brokers.split(","):
        workers = compare.plexmq_workers("", plan.clients, ns.workers)
        s = compare.spec(name, workers, 1000, ns.plexmq_arg)
        why = "cannot: plexmq-nodes is not supported here" if s.kind == "nodes" else compare.cannot(s, plan.clients)
        say(f"== {name}{': ' + why if why else ''}")
        if why:
            results[name] = {"skipped": why}
            continue
        try:
            results[name] = measure(name, plan, workers, ns.plexmq_arg, log_dir, say)
        except RuntimeError as exc:
            results[name] = {"skipped": f"failed: {exc}"}
            say(f"   failed: {exc}")
    text = table(results, plan)
    if ns.json:
        print(text, file=sys.stderr)
        print(json.dumps({"log_dir": log_dir, "sources": plan.sources, "results": results}, indent=1))
    else:
        print(text)
    measured = [r for r in results.values() if "skipped" not in r]
    if all(r["ok"] for r in measured):
        shutil.rmtree(log_dir, ignore_errors=True)
    else:
        say(f"broker logs: {log_dir}")
    return 0 if measured and all(r["ok"] for r in measured) else 1


if __name__ == "__main__":
    sys.exit(main())
