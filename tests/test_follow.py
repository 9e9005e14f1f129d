"""A node's workers follow the active router (workers/follow.py): with a list of router endpoints, a
STANDBY answer sends the worker to the active router it names (else to the next in the list), a
silent router is left after 1.5 s, and the live sessions are registered again where it joins.

Real node processes on loopback; the routers are fake ones (a ZeroMQ ROUTER with the CURVE server
key, played by a thread: silent, answering every frame with BEAT as an active router's heartbeat
would, or with STANDBY) or real `plexmq serve --role router` processes.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
import zmq
import zmq.auth

from plexmq import wire
from plexmq.acceptor import config as cfg
from tests.cli import write
from tests.conftest import ROOT, free_port, wait_for
from tests.hosts import make_keys
from tests.mqtt import Client
from tests.steps import uid

START_LIMIT = 20.0


class FakeRouter(threading.Thread):
    """A ROUTER socket on loopback that records every frame a worker sends (`frames`: join, records)
    and answers per `mode`: "silent", "active" (a BEAT to each frame, after an empty BANS to a HELLO) or "standby" (STANDBY naming
    `active`, tagged seq 0 as a standby does)."""

    def __init__(self, keys: Path, mode: str = "silent", active: str = "") -> None:
        super().__init__(daemon=True)
        self.mode, self.active = mode, active
        self.frames: list[tuple[int, list[tuple[int, bytes, bytes]]]] = []
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.CURVE_SERVER, 1)
        secret = zmq.auth.load_certificate(str(keys / "server.key_secret"))[1]
        assert secret is not None
        self.sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
        self.endpoint = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"
        self.stopping = threading.Event()
        self.start()

    def run(self) -> None:
        seqs: dict[int, int] = {}
        while not self.stopping.is_set():
            if not self.sock.poll(50):
                continue
            identity, tag, frame = self.sock.recv_multipart()
            join, _seq = wire.LINK.unpack(tag)
            self.frames.append((join, list(wire.records(frame))))
            if self.mode == "active":
                seqs[join] = seqs.get(join, -1) + 1
                answer = wire.record(wire.BEAT, b"")
                if any(kind == wire.HELLO for kind, _h, _p in self.frames[-1][1]):  # a join learns the bans, as from a router
                    answer = wire.record(wire.BANS, wire.Bans(1, True, [], []).encode()) + answer
                self.sock.send_multipart((identity, wire.LINK.pack(join, seqs[join]), answer))
            elif self.mode == "standby":
                answer = wire.Standby("fake", self.active).encode()
                self.sock.send_multipart((identity, wire.LINK.pack(join, 0), wire.record(wire.STANDBY, answer)))
        self.sock.close()
        self.ctx.term()

    def hellos(self) -> list[wire.Hello]:
        return [wire.Hello.decode(header) for _join, records in list(self.frames)
                for kind, header, _payload in records if kind == wire.HELLO]

    def close(self) -> None:
        self.stopping.set()
        self.join()


class Process:
    """A `plexmq serve` child with its output in a file (no web console: 18083 is one port for all)."""

    def __init__(self, log_path: Path, *args: str) -> None:
        self.log_path = log_path
        self.log: IO[bytes] = open(log_path, "wb")  # noqa: SIM115  # closed by stop()
        self.proc = subprocess.Popen([sys.executable, "-m", "plexmq.acceptor", "serve", "--console-port", "-1", *args],
                                     cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_said(self, pattern: str, what: str) -> re.Match[str]:
        def said() -> re.Match[str] | None:
            assert self.proc.poll() is None, f"{what}: exited with {self.proc.returncode}:\n{self.output()}"
            return re.search(pattern, self.output())
        return wait_for(said, START_LIMIT, what)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    return make_keys(tmp_path / "keys")


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for process in reversed(started):
        process.stop()


@pytest.fixture
def fakes() -> Iterator[list[FakeRouter]]:
    started: list[FakeRouter] = []
    yield started
    for fake in started:
        if fake.is_alive():
            fake.close()


def start_node(processes: list[Process], tmp_path: Path, keys: Path, endpoints: list[str]) -> tuple[Process, int]:
    """A node with one worker joining the routers at `endpoints`, and the port it listens on."""
    node = Process(tmp_path / f"node{len(processes)}.log", "--role", "node", "--router", ",".join(endpoints),
                   "--router-curve-dir", str(keys), "--node-name", "n1", "--host", "127.0.0.1", "--port", "0",
                   "--workers", "1", "--metrics-port", "-1", "--data-dir", str(tmp_path / "node-data"))
    processes.append(node)
    port = int(node.wait_said(r"listening on [^ ]+:(\d+) ", "the node to listen").group(1))
    return node, port


def start_router(processes: list[Process], tmp_path: Path, keys: Path, endpoint: str) -> Process:
    """A real router (SQLite store) binding `endpoint`."""
    router = Process(tmp_path / f"router{len(processes)}.log", "--role", "router", "--router-bind", endpoint,
                     "--router-curve-dir", str(keys), "--metrics-port", "-1",
                     "--data-dir", str(tmp_path / f"router{len(processes)}-data"))
    processes.append(router)
    router.wait_said("router listening on tcp://", "the router to listen")
    return router


def test_a_node_takes_a_list_of_routers_each_checked_and_none_twice(tmp_path: Path, keys: Path) -> None:
    def load(routers: str) -> dict:
        return cfg.load(str(write(tmp_path, f'role = "node"\nrouter = "{routers}"\nrouter_curve_dir = "{keys}"\n')), {})

    assert cfg.router_endpoints(load("tcp://10.0.0.1:7883, tcp://[::1]:7883,tcp://r3:7883")["router"]) == \
        ["tcp://10.0.0.1:7883", "tcp://[::1]:7883", "tcp://r3:7883"]
    for bad, why in [("tcp://10.0.0.1:7883,tcp://*:7883", "'tcp://*:7883' is not one"),
                     ("tcp://10.0.0.1:7883,", "'' is not one"),
                     ("tcp://10.0.0.1:7883,ipc:///tmp/r.ipc", "'ipc:///tmp/r.ipc' is not one"),
                     ("tcp://10.0.0.1:7883,tcp://10.0.0.1:7883", "must name each router once")]:
        with pytest.raises(cfg.ConfigError, match=re.escape(why)) as err:
            load(bad)
        assert "key 'router'" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(cfg.ConfigError, match=re.escape("--router: must name each router once")):
        cfg.load(None, {"role": "node", "router": "tcp://a:1,tcp://a:1", "router_curve_dir": str(keys)})


def test_a_standby_sends_the_worker_to_the_active_router_it_names(tmp_path: Path, keys: Path,
                                                                  fakes: list[FakeRouter],
                                                                  processes: list[Process]) -> None:
    active = FakeRouter(keys, "active")
    silent = FakeRouter(keys)  # next in the list: passed over
    standby = FakeRouter(keys, "standby", active.endpoint)
    fakes += [active, silent, standby]
    node, _port = start_node(processes, tmp_path, keys, [standby.endpoint, silent.endpoint, active.endpoint])
    wait_for(active.hellos, START_LIMIT, "the worker's HELLO at the active router")
    assert standby.hellos() and not silent.frames
    assert f"router at {standby.endpoint} is a standby (active: {active.endpoint}): joining {active.endpoint}" \
        in node.output()


def test_a_standby_naming_a_router_not_in_the_list_sends_the_worker_to_the_next(tmp_path: Path, keys: Path,
                                                                               fakes: list[FakeRouter],
                                                                               processes: list[Process]) -> None:
    following = FakeRouter(keys, "active")
    standby = FakeRouter(keys, "standby", "tcp://192.0.2.1:7883")
    fakes += [following, standby]
    node, _port = start_node(processes, tmp_path, keys, [standby.endpoint, following.endpoint])
    wait_for(following.hellos, START_LIMIT, "the worker's HELLO at the next router")
    assert f"router at {standby.endpoint} is a standby (active: tcp://192.0.2.1:7883): joining {following.endpoint}" \
        in node.output()


def test_a_silent_router_is_left_after_1_5_s_and_a_round_of_silence_said_once(
        tmp_path: Path, keys: Path, fakes: list[FakeRouter], processes: list[Process]) -> None:
    first, second = FakeRouter(keys), FakeRouter(keys)
    fakes += [first, second]
    node, _port = start_node(processes, tmp_path, keys, [first.endpoint, second.endpoint])
    wait_for(second.hellos, START_LIMIT, "the worker's HELLO at the second router")
    assert f"router at {first.endpoint} silent for 1.5 s: trying {second.endpoint}" in node.output()
    wait_for(lambda: len(first.hellos()) >= 3, START_LIMIT, "two more rounds")  # neither answers: round after round
    log = node.output()
    assert log.count("no router of 2 answers as the active one; trying again") in (1, 2), log  # one per round, not per move
    assert log.count(f"silent for 1.5 s: trying {second.endpoint}") == 1, log
    assert "no answer from the router at" not in log, "the one-router warning is for one router"


def test_a_worker_waits_at_a_standby_naming_the_router_that_went_silent_until_it_takes_over(
        tmp_path: Path, keys: Path, fakes: list[FakeRouter], processes: list[Process]) -> None:
    """The active router dies: its lease has not yet lapsed, so the standby still names it. Going back
    to it would cost another 1.5 s of silence; the worker waits at the standby, joining it again every
    0.5 s, and stays there once it answers as the active router."""
    first = FakeRouter(keys, "active")
    second = FakeRouter(keys, "standby")
    fakes += [first, second]
    second.active = first.endpoint
    node, _port = start_node(processes, tmp_path, keys, [first.endpoint, second.endpoint])
    wait_for(first.hellos, START_LIMIT, "the worker's HELLO at the first router")
    first.mode = "silent"  # killed
    node.wait_said(rf"router at {re.escape(second.endpoint)} is a standby and the active one is "
                   rf"{re.escape(first.endpoint)}, silent here: waiting", "the worker to wait at the standby")
    wait_for(lambda: len(second.hellos()) >= 3, START_LIMIT, "joins sent again to the standby")
    hellos_at_first = len(first.hellos())
    second.mode = "active"  # it took the lease over
    joined = len(second.hellos())
    wait_for(lambda: len(second.frames) > joined + 2, START_LIMIT, "the worker's frames at the new active router")
    assert len(first.hellos()) == hellos_at_first, "the worker went back to the silent router"
    assert len(second.hellos()) <= joined + 1, "the worker kept joining the router that answers"


def test_a_worker_goes_back_to_a_router_silent_to_it_alone_after_waiting_3_s(
        tmp_path: Path, keys: Path, fakes: list[FakeRouter], processes: list[Process]) -> None:
    """A router silent to this node only keeps its lease (the standby names it for ever): after 3 s
    at the standby the worker tries it again."""
    first = FakeRouter(keys, "active")
    second = FakeRouter(keys, "standby")
    fakes += [first, second]
    second.active = first.endpoint
    node, _port = start_node(processes, tmp_path, keys, [first.endpoint, second.endpoint])
    wait_for(first.hellos, START_LIMIT, "the worker's HELLO at the first router")
    first.mode = "silent"
    node.wait_said("waiting for it to take over", "the worker to wait at the standby")
    hellos_at_first = len(first.hellos())
    first.mode = "active"  # back for this node (a healed partition)
    wait_for(lambda: len(first.hellos()) > hellos_at_first, START_LIMIT, "the worker to go back to the first router")
    assert f"trying again: {first.endpoint}" in node.output()


def test_the_live_sessions_are_registered_again_at_the_router_the_worker_follows(
        tmp_path: Path, keys: Path, fakes: list[FakeRouter], processes: list[Process]) -> None:
    first, second = FakeRouter(keys, "active"), FakeRouter(keys, "active")
    fakes += [first, second]
    _node, port = start_node(processes, tmp_path, keys, [first.endpoint, second.endpoint])
    wait_for(lambda: any(kind == wire.BANS_ACK for _join, records in first.frames for kind, _h, _p in records),
             START_LIMIT, "the worker to hold the bans")
    client = Client(port, f"follow-{uid()}")  # a clean 3.1.1 session: the worker, which has the bans, answers it itself
    try:
        wait_for(lambda: any(kind == wire.CONNECT for _join, records in first.frames for kind, _h, _p in records),
                 START_LIMIT, "the CONNECT at the first router")
        first.mode, first.active = "standby", second.endpoint  # the first steps down
        hello = wait_for(lambda: second.hellos(), START_LIMIT, "the worker's HELLO at the second router")[0]
        assert len(hello.live) == 1
        wait_for(lambda: any(kind == wire.CONNECT for _join, records in second.frames for kind, _h, _p in records),
                 START_LIMIT, "the session registered again at the second router")
        assert not client.disconnected.is_set()
    finally:
        client.client.loop_stop()
        client.client.disconnect()


def test_a_node_follows_a_real_router_and_its_client_goes_on(tmp_path: Path, keys: Path, fakes: list[FakeRouter],
                                                             processes: list[Process]) -> None:
    standby = FakeRouter(keys, "standby")  # names no active router: the worker tries the next
    fakes.append(standby)
    second = f"tcp://127.0.0.1:{free_port()}"
    router = start_router(processes, tmp_path, keys, second)
    node, port = start_node(processes, tmp_path, keys, [standby.endpoint, second])
    node.wait_said(rf"is a standby \(active: unknown\): joining {re.escape(second)}", "the node to leave the standby")
    topic = f"follow/{uid()}"
    client = Client(port, f"follow-{uid()}")
    try:
        assert client.subscribe(topic, 1) == [1]
        client.publish(topic, b"before", 1)
        assert client.get(10).payload == b"before"

        router.stop()  # the active router goes; another takes over where the standby was
        standby.close()
        start_router(processes, tmp_path, keys, standby.endpoint)
        node.wait_said(rf"router at {re.escape(second)} silent for 1.5 s: trying {re.escape(standby.endpoint)}",
                       "the node to leave the stopped router")

        def through() -> bool:
            client.publish(topic, b"after", 1)
            try:
                return client.get(1).payload == b"after"
            except Exception:  # queue.Empty: not routed yet (the worker may still be on its way)
                return False
        wait_for(through, START_LIMIT, "a message through the router the node followed")
        assert not client.disconnected.is_set(), "the client was disconnected"
    finally:
        client.client.loop_stop()
        client.client.disconnect()
