"""Supervision end to end: kills, signals and descriptor exhaustion against real broker processes.

Every broker here is dedicated (it gets killed); every wait is bounded and awaits an event.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest

from plexmq.mqtt import reasons
from plexmq.mqtt import v4 as p
from plexmq.process import CONFIG_ENV, named_worker
from tests.conftest import Broker, wait_for
from tests.mqtt import RawClient
from tests.processes import OwnBroker, alive, descendants
from tests.steps import ping

STOP_LIMIT = 5.0  # seconds every process may take to be gone
WILL = p.Will("proc/kwill/will/v", b"victim gone", 1, False)


# -- helpers -----------------------------------------------------------------------------------------


def spawned_by(acceptor_pid: int) -> list[psutil.Process]:
    """Every live process that an acceptor with this pid started: its router carries the pid in its
    config, wherever it was reparented to; its workers (forked, named plexmq-w<id>) while it is their parent
    (the tests take them as `descendants` before the acceptor goes)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if named_worker(proc.name()) is not None and proc.ppid() == acceptor_pid and alive(proc):
                found.append(proc)
                continue
            env = proc.environ()
        except psutil.Error:
            continue
        raw = env.get(CONFIG_ENV)
        if not raw:
            continue
        try:
            parent = orjson.loads(raw).get("parent_pid")
        except orjson.JSONDecodeError:
            continue
        if parent == acceptor_pid and alive(proc):
            found.append(proc)
    return found


def try_connect(port: int, client_id: str, timeout: float = 2.0) -> RawClient | None:
    """A connected client, or None when the broker closes or refuses the socket.

    A socket the broker neither serves nor closes within `timeout` fails the test."""
    try:
        c = RawClient(port, timeout)
    except OSError:
        return None
    try:
        present, code = c.connect(client_id)
        assert code == 0, f"CONNACK {code}"
        return c
    except TimeoutError:
        c.close()
        raise AssertionError(f"the broker neither served nor closed a new socket within {timeout} s") from None
    except (OSError, AssertionError):
        c.close()
        return None


def subscribe(c: RawClient, topic: str, qos: int = 1, packet_id: int = 1) -> None:
    c.send(p.encode_subscribe(packet_id, [(topic, qos)]))
    assert c.recv() == (0x90, bytes([packet_id >> 8, packet_id & 255, qos]))


def publish_qos1(c: RawClient, topic: str, payload: bytes, packet_id: int) -> None:
    c.send(p.encode_publish(topic.encode(), payload, 1, packet_id=packet_id))
    assert c.recv() == (0x40, packet_id.to_bytes(2, "big")), "no PUBACK"


def receive(c: RawClient, timeout: float = 5.0) -> tuple[str, bytes]:
    """The next PUBLISH (acknowledged when QoS 1) as (topic, payload)."""
    first, body = c.recv(timeout)
    assert first >> 4 == 3, f"expected PUBLISH, got {first:#x}"
    topic, packet_id, payload = p.decode_publish(first & 15, body)
    if (first >> 1) & 3 == 1:
        c.send(p.encode_puback(packet_id))
    return topic, payload


def roundtrip(port: int, topic: str, timeout: float = 1.0) -> bool:
    """A fresh subscriber and a fresh publisher exchange one QoS 1 message; False on any failure."""
    clients = []
    try:
        sub = RawClient(port, timeout)
        clients.append(sub)
        pub = RawClient(port, timeout)
        clients.append(pub)
        sub.connect("")
        pub.connect("")
        sub.send(p.encode_subscribe(1, [(topic, 1)]))
        if sub.recv(timeout) != (0x90, b"\x00\x01\x01"):
            return False
        pub.send(p.encode_publish(topic.encode(), b"again", 1, packet_id=1))
        if pub.recv(timeout) != (0x40, b"\x00\x01"):
            return False
        return receive(sub, timeout) == (topic, b"again")
    except (OSError, AssertionError):
        return False
    finally:
        for c in clients:
            c.close()


def _broker_side_inodes(b: Broker, by_port: dict[int, RawClient]) -> dict[int, RawClient]:
    """inode of the broker's end of each client's connection -> that client.

    `ss` asks the kernel (sock_diag) to filter by port; reading /proc/net/tcp instead, as psutil does
    for `Broker.worker_of`, takes seconds when a benchmark next door holds 100k connections."""
    inodes: dict[int, RawClient] = {}
    if shutil.which("ss"):
        out = subprocess.run(["ss", "-tnHe", "state", "established", f"( sport = :{b.port} )"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        for line in out.splitlines():
            fields = line.split()
            inode = re.search(r"\bino:(\d+)", line)
            client = by_port.get(int(fields[3].rsplit(":", 1)[1]))
            if client is not None and inode:
                inodes[int(inode.group(1))] = client
        return inodes
    broker_port = f":{b.port:04X}"
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            if fields[1].endswith(broker_port):
                client = by_port.get(int(fields[2].rsplit(":", 1)[1], 16))
                if client is not None:
                    inodes[int(fields[9])] = client
    return inodes


def holders(b: Broker, clients: list[RawClient]) -> dict[RawClient, int]:
    """Which worker holds each client's connection (one query for all of them)."""
    inodes = _broker_side_inodes(b, {c.local_port: c for c in clients})
    found: dict[RawClient, int] = {}
    for worker_id, proc in b.workers().items():
        try:
            fds = os.listdir(f"/proc/{proc.pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{proc.pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                client = inodes.get(int(target[8:-1]))
                if client is not None:
                    found[client] = worker_id
    missing = [c.local_port for c in clients if c not in found]
    assert not missing, f"no worker holds the connections from ports {missing}"
    return found


def connect_spread(b: Broker, prefix: str, per_worker: int = 2, limit: int = 16) -> dict[int, list[RawClient]]:
    """Connect clients until every worker holds at least `per_worker` of them."""
    held: dict[int, list[RawClient]] = {w: [] for w in b.workers()}
    made = 0
    while made < limit:
        batch = []
        for _ in range(per_worker * len(held)):
            c = RawClient(b.port)
            c.connect(f"{prefix}-{made}")
            made += 1
            batch.append(c)
        for c, worker_id in holders(b, batch).items():
            held.setdefault(worker_id, []).append(c)
        if all(len(cs) >= per_worker for cs in held.values()):
            return held
    raise AssertionError(f"{made} clients did not spread over the workers: "
                         f"{ {w: len(cs) for w, cs in held.items()} }")


def log_line(b: Broker, *needles: str) -> str | None:
    for line in b.output().splitlines():
        if all(n in line for n in needles):
            return line
    return None


def stopped_within(b: Broker, limit: float = STOP_LIMIT) -> tuple[int, float]:
    """(exit status, seconds) of the acceptor; fails when it outlives `limit`."""
    start = time.monotonic()
    try:
        code = b.proc.wait(limit)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the acceptor still runs {limit} s after the signal:\n{b.output()[-3000:]}") from None
    return code, time.monotonic() - start


def port_closed(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return True
    return False


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[Callable[..., OwnBroker]]:
    started: list[OwnBroker] = []

    def start(*args: str, **kw: Any) -> OwnBroker:
        b = OwnBroker(tmp_path / f"own{len(started)}.log", list(args) or ["--workers", "2"], **kw)
        started.append(b)
        return b

    yield start
    for b in started:
        b.stop()


@pytest.fixture
def no_orphans() -> Iterator[Callable[[Broker], None]]:
    """Remember the processes of a broker the test kills; whatever of them survives is killed after."""
    watched: list[tuple[int, list[psutil.Process]]] = []

    def watch(b: Broker) -> None:
        watched.append((b.proc.pid, descendants(b)))

    yield watch
    for acceptor_pid, procs in watched:
        for proc in {*procs, *spawned_by(acceptor_pid)}:
            if alive(proc):
                proc.kill()


# -- a worker dies ---------------------------------------------------------------------------------


def test_killed_worker_is_replaced_and_the_other_worker_keeps_its_clients(start_broker: Callable[..., Broker]) -> None:
    b = start_broker("--workers", "2")
    held = connect_spread(b, "kw")
    victim, survivor = 0, 1
    sub, pub = held[survivor][0], held[survivor][1]
    subscribe(sub, "proc/kw/t")
    old = b.workers()[victim]
    survivor_pid = b.workers()[survivor].pid

    os.kill(old.pid, signal.SIGKILL)

    for c in held[victim]:
        c.read_until_closed()
    new = wait_for(lambda: w if (w := b.workers().get(victim)) is not None and w.pid != old.pid else None, 5,
                   f"a new worker {victim}")
    assert b.workers()[survivor].pid == survivor_pid, "the surviving worker was restarted"
    line = wait_for(lambda: log_line(b, str(old.pid), "killed by SIGKILL"), 5, "the log line about the kill")
    assert f"worker {victim}" in line, line

    # the clients on the other worker never reconnected: the same sockets keep working
    ping(sub)
    publish_qos1(pub, "proc/kw/t", b"still here", 11)
    assert receive(sub) == ("proc/kw/t", b"still here")

    # new clients are served, by both workers, and messages cross between the new and the old worker
    fresh = [c for c in (try_connect(b.port, f"kw-new-{i}") for i in range(4)) if c is not None]
    assert len(fresh) == 4, "new clients were not served after the worker was replaced"
    on = holders(b, fresh)
    assert victim in on.values(), f"no new client went to the replacement worker: {on}"
    assert b.workers()[victim].pid == new.pid
    newcomer = next(c for c in fresh if on[c] == victim)
    subscribe(newcomer, "proc/kw/back")
    publish_qos1(pub, "proc/kw/back", b"to the new worker", 12)
    assert receive(newcomer) == ("proc/kw/back", b"to the new worker")
    publish_qos1(newcomer, "proc/kw/t", b"from the new worker", 13)
    assert receive(sub) == ("proc/kw/t", b"from the new worker")
    for c in [*fresh, *held[survivor]]:
        c.close()


def test_clients_of_a_killed_worker_leave_their_will_and_no_subscription(start_broker: Callable[..., Broker]) -> None:
    """A SIGKILLed worker's clients lost their socket: their wills go out, their subscriptions go away
    (the replacement's connections must not inherit them)."""
    b = start_broker("--workers", "2")
    held = connect_spread(b, "kwill")
    watcher, pub = held[1][0], held[1][1]  # both on the worker that survives
    subscribe(watcher, "proc/kwill/will/#")
    for _attempt in range(6):  # until the balancer puts the victim on worker 0
        victim = RawClient(b.port)
        victim.connect("kwill-victim", will=WILL)
        if holders(b, [victim])[victim] == 0:
            break
        victim.close()  # no DISCONNECT: its will goes out now
        assert receive(watcher) == ("proc/kwill/will/v", b"victim gone")
    assert holders(b, [victim])[victim] == 0, "the victim never landed on worker 0"
    subscribe(victim, "proc/kwill/stale")
    old_pid = b.workers()[0].pid

    os.kill(old_pid, signal.SIGKILL)

    assert receive(watcher) == ("proc/kwill/will/v", b"victim gone")
    wait_for(lambda: (w := b.workers().get(0)) is not None and w.pid != old_pid, 5, "a new worker 0")
    # enough new connections on the replacement that one of them reuses the victim's place there
    fresh = [try_connect(b.port, f"kwill-new-{i}") for i in range(24)]
    assert None not in fresh, "a new client was not served"
    on = holders(b, fresh)  # type: ignore[arg-type]  # no None: asserted above
    newcomers = [c for c, worker_id in on.items() if worker_id == 0]
    assert len(newcomers) >= 10, f"only {len(newcomers)} of 24 new clients went to the new worker"
    for c in newcomers:
        subscribe(c, "proc/kwill/marker")
    publish_qos1(pub, "proc/kwill/stale", b"for the dead subscriber", 1)
    publish_qos1(pub, "proc/kwill/marker", b"marker", 2)
    for c in newcomers:  # the stale message would come first (same publisher, same router turn order)
        assert receive(c) == ("proc/kwill/marker", b"marker")
    for c in [*newcomers, *on, *held[0], *held[1]]:
        c.close()


# -- the acceptor is stopped or killed ---------------------------------------------------------------


def test_sigterm_stops_every_process_within_5_s(start_broker: Callable[..., Broker],
                                                no_orphans: Callable[[Broker], None]) -> None:
    b = start_broker("--workers", "2")
    no_orphans(b)
    clients = connect_spread(b, "term", per_worker=1)
    v5_client = RawClient(b.port)
    assert v5_client.connect5("term-v5")[1] == 0
    children = descendants(b)
    assert len(children) == 3, f"expected a router and 2 workers: {children}"

    b.proc.send_signal(signal.SIGTERM)

    code, took = stopped_within(b)
    assert code == 0, f"exit status {code} after SIGTERM:\n{b.output()[-3000:]}"
    assert [c for c in children if alive(c)] == [], "children outlived the acceptor"
    assert spawned_by(b.proc.pid) == []
    for cs in clients.values():
        for c in cs:
            c.read_until_closed(1)
    last = v5_client.read_until_closed(1)  # its DISCONNECT (with the reason string), then EOF
    assert last[0] == 0xE0 and last[2] == reasons.SERVER_SHUTTING_DOWN, last
    closed = [int(n) for n in re.findall(r"worker-\d+\[\d+\]: closed (\d+) clients: broker shutting down", b.output())]
    assert len(closed) == 2 and sum(closed) == 3, b.output()[-3000:]  # one line per worker, not one per client
    assert port_closed(b.port)
    assert "Traceback" not in b.output(), b.output()[-3000:]
    said = [line for line in b.output().splitlines() if " WARNING " in line or " ERROR " in line]
    assert said == [], "a clean stop is no reason for a warning"


def test_sigkill_of_the_acceptor_leaves_no_orphan(start_broker: Callable[..., Broker],
                                                  no_orphans: Callable[[Broker], None]) -> None:
    b = start_broker("--workers", "2")
    no_orphans(b)
    clients = connect_spread(b, "orphan", per_worker=1)
    children = descendants(b)
    assert len(children) == 3, f"expected a router and 2 workers: {children}"

    b.proc.kill()
    b.proc.wait(5)

    wait_for(lambda: not any(alive(c) for c in children), STOP_LIMIT,
             f"the children to exit after the acceptor's SIGKILL: {[c for c in children if alive(c)]}")
    assert spawned_by(b.proc.pid) == []
    for cs in clients.values():
        for c in cs:
            c.read_until_closed(1)
    assert port_closed(b.port)


@pytest.mark.parametrize("target", ["process group", "acceptor"])
def test_ctrl_c_stops_everything(own_broker: Callable[..., OwnBroker], no_orphans: Callable[[Broker], None],
                                 target: str) -> None:
    """Ctrl-C in a terminal sends SIGINT to the whole foreground process group."""
    b = own_broker("--workers", "2", session=True)
    no_orphans(b)
    assert os.getpgid(b.proc.pid) == b.proc.pid
    children = descendants(b)
    assert len(children) == 3
    client = RawClient(b.port)
    client.connect("ctrl-c")

    if target == "process group":
        os.killpg(b.proc.pid, signal.SIGINT)
    else:
        b.proc.send_signal(signal.SIGINT)

    stopped_within(b)
    assert [c for c in children if alive(c)] == [], "children outlived the acceptor"
    assert spawned_by(b.proc.pid) == []
    client.read_until_closed(1)
    assert port_closed(b.port)
    assert "Traceback" not in b.output(), b.output()[-3000:]


# -- the router dies ---------------------------------------------------------------------------------


def test_killed_router_is_restarted_and_clients_are_served_within_5_s(start_broker: Callable[..., Broker]) -> None:
    b = start_broker("--workers", "2")
    assert roundtrip(b.port, "proc/router/before")
    old = b.router()
    assert old is not None
    worker_pids = {w: proc.pid for w, proc in b.workers().items()}

    killed_at = time.monotonic()
    os.kill(old.pid, signal.SIGKILL)

    new = wait_for(lambda: r if (r := b.router()) is not None and r.pid != old.pid else None, STOP_LIMIT, "a new router")
    left = STOP_LIMIT - (time.monotonic() - killed_at)
    wait_for(lambda: roundtrip(b.port, "proc/router/after"), max(left, 0.1),
             "a publish/subscribe round trip through the new router")
    took = time.monotonic() - killed_at
    assert took <= STOP_LIMIT, f"the first round trip after the router's death succeeded only after {took:.1f} s"
    now = b.router()
    assert now is not None and now.pid == new.pid
    assert {w: proc.pid for w, proc in b.workers().items()} == worker_pids, "workers were restarted"
    wait_for(lambda: log_line(b, str(old.pid), "killed by SIGKILL"), 5, "the log line about the router's death")
    # and not only once: a second round trip across the (possibly) other worker
    assert all(roundtrip(b.port, f"proc/router/more/{i}") for i in range(3))


# -- out of file descriptors -------------------------------------------------------------------------


def test_workers_refuse_sockets_cleanly_when_out_of_descriptors(own_broker: Callable[..., OwnBroker]) -> None:
    soft, hard = 100, 150
    b = own_broker("--workers", "2", nofile=(soft, hard))
    for proc in [psutil.Process(b.proc.pid), *descendants(b)]:
        assert proc.rlimit(psutil.RLIMIT_NOFILE) == (hard, hard), \
            f"{proc.cmdline()} did not raise its soft limit to the hard limit it was given"
    pids = {proc.pid for proc in descendants(b)}

    accepted: list[RawClient] = []
    refused = 0
    first_refusal = last_refusal = 0.0
    for i in range(2 * hard + 20):  # more than two workers can hold under 150 descriptors each
        c = try_connect(b.port, f"fd-{i}")
        if c is None:
            refused += 1
            last_refusal = time.monotonic()
            first_refusal = first_refusal or last_refusal
        else:
            accepted.append(c)
    assert refused, f"all {len(accepted)} connections were accepted under a limit of {hard} descriptors"
    assert len(accepted) >= 20, f"only {len(accepted)} connections were served"

    # the broker survived: same processes, the served clients still work, messages still flow
    assert b.proc.poll() is None
    assert {proc.pid for proc in descendants(b)} == pids, "a process died and was replaced"
    for c in accepted[:: max(len(accepted) // 10, 1)]:
        ping(c)
    subscribe(accepted[0], "proc/fd/t")
    publish_qos1(accepted[-1], "proc/fd/t", b"full house", 1)
    assert receive(accepted[0]) == ("proc/fd/t", b"full house")

    # the refusal is logged, at most about once a second by each process
    wait_for(lambda: re.search(r"refus", b.output(), re.I), 5, "a log line about refused sockets")
    per_process: dict[str, int] = {}
    for line in b.output().splitlines():
        if re.search(r"refus", line, re.I):
            who = re.search(r"\[(\d+)\]", line)
            per_process[who.group(1) if who else line] = per_process.get(who.group(1) if who else line, 0) + 1
    allowed = int(last_refusal - first_refusal) + 2
    assert max(per_process.values()) <= allowed, \
        f"{refused} refusals in {last_refusal - first_refusal:.1f} s logged {per_process} times per process"

    # once some connections close there is room again
    for c in accepted[20:40]:
        c.close()
    newcomer = wait_for(lambda: try_connect(b.port, "fd-newcomer", 1.0), 5, "a new client served after others closed")
    subscribe(newcomer, "proc/fd/again")
    publish_qos1(accepted[0], "proc/fd/again", b"room again", 2)
    assert receive(newcomer) == ("proc/fd/again", b"room again")
    assert b.proc.poll() is None and {proc.pid for proc in descendants(b)} == pids
    assert "Traceback" not in b.output(), b.output()[-3000:]
    newcomer.close()
    for c in accepted:
        c.close()


def test_a_forked_worker_keeps_none_of_the_acceptors_descriptors(start_broker: Callable[..., Broker]) -> None:
    """A worker is forked from the acceptor: it must not hold the acceptor's listeners (a listener a reload
    closes would stay bound), its lock on the data dir, or the other workers' channels; and it names itself."""
    b = start_broker("--workers", "2")
    old = b.workers()[0]
    old.send_signal(signal.SIGKILL)  # a restarted worker is forked from the acceptor's running loop
    new = wait_for(lambda: w if (w := b.workers().get(0)) is not None and w.pid != old.pid else None, 10, "a new worker 0")
    wait_for(lambda: b.output().count(" ready (pid ") == 3, 10, "the new worker to be ready")
    for worker_id, proc in b.workers().items():
        assert proc.name() == f"plexmq-w{worker_id}"
        listening = [c for c in proc.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN]
        assert listening == [], f"worker {worker_id} holds a listener: {listening}"
        assert not [f.path for f in proc.open_files() if f.path.endswith("plexmq.lock")]
        channels = [c for c in proc.net_connections(kind="unix") if c.type == socket.SOCK_SEQPACKET]
        assert len(channels) == 1, f"worker {worker_id} holds other workers' channels: {channels}"  # its own only
    assert new.pid == b.workers()[0].pid
