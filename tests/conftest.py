"""Fixtures that start the real broker (acceptor, router, workers) on a free loopback port."""

from __future__ import annotations

import http.server
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import psutil
import pytest

from plexmq.bench.brokers import free_port as free_port  # the tests' one free port, below the ephemeral range
from plexmq.process import named_worker

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from plexmq.bench.postgres import PostgreSQL

ROOT = Path(__file__).resolve().parent.parent


T = TypeVar("T")


def wait_for(predicate: Callable[[], T | None], timeout: float = 10.0, what: str = "condition") -> T:
    """Poll `predicate` until it is truthy; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


class Broker:
    """A running `plexmq serve` on a port it picked itself (`--port 0`, read back from its log line,
    so no other process can take the port between choosing and binding it)."""

    def __init__(self, log_path: Path, args: list[str], env: dict[str, str] | None = None,
                 prefix: tuple[str, ...] = (), new_session: bool = False, cwd: Path = ROOT) -> None:
        self.port = 0
        self.log_path = log_path
        self.log = open(log_path, "wb")  # noqa: SIM115  # the broker's output until stop() closes it
        if "--data-dir" not in args:  # each broker its own store, next to its log
            args = [*args, "--data-dir", str(log_path.with_suffix(".data"))]
        if "--metrics-port" not in args:  # brokers side by side: each its own metrics port
            args = [*args, "--metrics-port", "0"]
        if "--console-port" not in args:  # no console unless a test asks for one (18083 is one port for all)
            args = [*args, "--console-port", "-1"]
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "plexmq.acceptor", "serve", "--port", "0", *args],
            cwd=cwd, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=new_session)
        try:
            wait_for(self._ready, 20, "the broker to serve")
        except BaseException:
            self.stop()  # a broker that never served must not outlive the test
            raise

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"broker exited with {self.proc.returncode}:\n{self.output()}")
        if not self.port:
            found = re.search(rb"listening on [^ ]+:(\d+) ", self.log_path.read_bytes())
            if not found:
                return False
            self.port = int(found.group(1))
        workers = self.workers()
        if len(workers) < 1 or self.router() is None:
            return False
        # the router and each worker have their SIGHUP handlers (a reload a test sends is not missed)
        # and the router its endpoint: a worker answers a clean session's CONNECT before the router is up
        log = self.log_path.read_bytes()
        if b"router listening on " not in log or log.count(b" ready (pid ") < len(workers):
            return False
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x00\x00\x00")  # CONNECT, clean, empty id
                return s.recv(4)[:3] == b"\x20\x02\x00"  # any CONNACK: a broker with passwords answers 5
        except OSError:
            return False

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def children(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children()
        except psutil.NoSuchProcess:
            return []

    def workers(self) -> dict[int, psutil.Process]:
        """worker id -> process (forked from the acceptor, each names itself plexmq-w<id>)."""
        found = {}
        for child in self.children():
            try:
                found_id = named_worker(child.name())
            except psutil.Error:
                continue
            if found_id is not None:
                found[found_id] = child
        return found

    def router(self) -> psutil.Process | None:
        for child in self.children():
            try:
                if "plexmq.router" in child.cmdline():
                    return child
            except psutil.Error:
                continue
        return None

    def worker_of(self, client_port: int) -> int:
        """The id of the worker holding the connection whose client side uses `client_port`."""
        for worker_id, proc in self.workers().items():
            for c in proc.net_connections(kind="tcp"):
                if c.raddr and c.raddr.port == client_port:
                    return worker_id
        raise AssertionError(f"no worker holds the connection from port {client_port}")

    def worker_holding(self, client_port: int) -> int:
        """`worker_of`, waiting until the acceptor has handed the socket over."""
        def find() -> int | None:
            try:
                return self.worker_of(client_port) + 1  # +1: worker 0 must read as found
            except AssertionError:
                return None
        return int(wait_for(find, 20, "the socket to reach a worker")) - 1

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                for child in self.children():
                    child.kill()
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """One broker with two workers shared by the tests that leave it as they found it."""
    b = Broker(tmp_path_factory.mktemp("broker") / "broker.log", ["--workers", "2"])
    yield b
    b.stop()


@pytest.fixture
def start_broker(tmp_path: Path) -> Iterator[Callable[..., Broker]]:
    """Start a dedicated broker (for tests that kill or reconfigure it); stopped after the test."""
    started: list[Broker] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Broker:
        b = Broker(tmp_path / f"broker{len(started)}.log", list(args) or ["--workers", "2"], env)
        started.append(b)
        return b

    yield start
    for b in started:
        b.stop()


@pytest.fixture(scope="session")
def pg() -> Iterator[PostgreSQL]:
    """One private PostgreSQL server for the session (tests/postgres.py: a test takes a fresh
    database in it); skips the tests that ask for it where no server is installed."""
    from tests.postgres import session_server  # psycopg only where a test asks

    yield from session_server()


@pytest.fixture
def pg_dsn(pg: PostgreSQL) -> str:
    """A fresh database of this test's own in the session's server: its URL."""
    from tests.postgres import fresh_database

    return fresh_database(pg)


@pytest.fixture
def browser() -> Iterator:
    """Headless Chromium driven by selenium (tests/console_browser.py; the test skips without them)."""
    from tests.console_browser import chromium

    yield from chromium()


@pytest.fixture
def attacker() -> Iterator[tuple[str, Callable[[bytes], None]]]:
    """Another site on loopback (another port: another origin) for the console's forged-request tests
    (tests/console_browser.py `attack_page`): its URL and a setter of its page."""
    page = [b""]

    class Site(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802  http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(page[0])

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Site)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", lambda html: page.__setitem__(0, html)
    server.shutdown()


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local SparkSession for the pipeline tests (pyspark is imported only when a test asks)."""
    from plexmq.pipeline.session import spark_session

    with spark_session("local[2]", verbose=False) as session:
        # tiny data: few tasks, and no generated code, whose compiling costs more than it saves here
        session.conf.set("spark.sql.shuffle.partitions", "2")
        session.conf.set("spark.sql.codegen.wholeStage", "false")
        yield session


@pytest.fixture
def brokers() -> Iterator[list[Broker]]:
    """The brokers a test started with tests/bridging.py `serve`, stopped after it."""
    started: list[Broker] = []
    yield started
    for b in started:
        b.stop()
