"""Start and stop the brokers that compare and sweep measure: plexmq, and mosquitto from its Debian package.

Each measurement gets a fresh broker on a free loopback port (so no queue or session of an earlier
scenario is left behind), with the soft open-file limit raised to the hard one as for plexmq.
"""

from __future__ import annotations

import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from plexmq.bench import runner
from plexmq.bench.monitor import BrokerMonitor
from plexmq.bench.plan import Options

ROOT = Path(__file__).resolve().parent.parent
MOSQUITTO = "/usr/sbin/mosquitto"
CONNECT = b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x00\x00\x00"  # CONNECT, clean session, empty client id


@dataclass
class BrokerSpec:
    name: str  # the column title: plexmq, mosquitto, mosquitto-nodelay, plexmq-w2, ...
    kind: str  # "plexmq", "nodes" (a router and two nodes: bench/topology.py) or "mosquitto"
    workers: int = 1
    nodelay: bool = False
    max_queued: int = 1000
    extra: list[str] = field(default_factory=list)  # more arguments for `plexmq serve`
    acl_file: str = ""  # an ACL (mosquitto's syntax, which both read) for anonymous clients
    # the store, kept by stop() so that a restart on it finds the sessions again: plexmq --data-dir,
    # mosquitto persistence in it (default: plexmq a fresh one that stop() removes, mosquitto none)
    data_dir: str = ""
    conf: str = ""  # more lines for mosquitto.conf (a bridge: bench/bridge.py)
    direct: bool = False  # kind "nodes": QoS 0 between them worker to worker (bench/topology.py --direct)


def _ephemeral_low() -> int:
    """The lowest port the kernel gives outgoing connections and bind(0) (Linux: 32768 unless set)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port free now, below the ephemeral range: a port named now and bound later (a broker, a
    router started after another) must not be one the kernel may give an outgoing connection meanwhile."""
    low = _ephemeral_low()
    for _ in range(100):
        port = random.randrange(10_000, low) if low > 11_000 else 0
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise RuntimeError("no free loopback port below the ephemeral range")


def _raise_nofile() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class RunningBroker:
    """A broker process we started; `stop()` ends it and everything under it."""

    def __init__(self, spec: BrokerSpec, log_dir: str, port: int = 0, wait: bool = True) -> None:
        """Start it (on `port`, or a free one) and, with `wait`, return once it answers a CONNECT."""
        self.spec = spec
        self.port = port or free_port()
        self.ports = [self.port]  # every port clients may connect to (one per node)
        self.log_path = os.path.join(log_dir, f"{spec.name}-{self.port}.log")
        self.own_data_dir: str | None = None
        if spec.kind == "plexmq":
            extra = list(spec.extra)
            if spec.data_dir:
                extra += ["--data-dir", spec.data_dir]
            if "--data-dir" not in extra and "--no-persistence" not in extra:
                # a store of its own, removed by stop(): never ./plexmq-data, never an earlier run's state
                self.own_data_dir = os.path.join(log_dir, f"{spec.name}-{self.port}.data")
                extra += ["--data-dir", self.own_data_dir]
            for port_option in ("--console-port", "--metrics-port"):  # their default ports are one for every broker
                if not any(arg.partition("=")[0] == port_option for arg in extra):  # on this host: none unless asked
                    extra += [port_option, "-1"]
            if spec.acl_file:
                conf = os.path.join(log_dir, f"{spec.name}-{self.port}.toml")
                with open(conf, "w") as f:
                    f.write(f'acl_file = "{spec.acl_file}"\nallow_anonymous = true\n')
                extra += ["--config", conf]
            cmd = [sys.executable, "-m", "plexmq.acceptor", "serve", "--port", str(self.port),
                   "--workers", str(spec.workers), *extra]
        elif spec.kind == "nodes":
            self.ports.append(free_port())
            cmd = [sys.executable, "-m", "plexmq.bench.topology", "--ports", ",".join(map(str, self.ports)),
                   "--workers", str(spec.workers), *(["--direct"] if spec.direct else []),
                   *(f"--node-arg={arg}" for arg in spec.extra)]
        else:
            conf = os.path.join(log_dir, f"{spec.name}-{self.port}.conf")
            with open(conf, "w") as f:
                f.write(mosquitto_conf(self.port, spec.nodelay, spec.max_queued, spec.acl_file, spec.data_dir) + spec.conf)
            cmd = [MOSQUITTO, "-c", conf]
        self.cmd = cmd
        with open(self.log_path, "ab") as log:  # append: a restart on the same port keeps the first log
            self.started = time.monotonic()
            self.started_wall = time.time()
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                         preexec_fn=_raise_nofile)  # noqa: PLW1509 (no threads here)
        if wait:
            self._wait_ready(30)
            self._wait_quiet(10)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _wait_quiet(self, timeout: float, window: float = 0.1, busy: float = 0.05) -> None:
        """Until the broker's processes use less than `busy` of a core over a `window`: the first CONNACK
        comes from the first worker ready, while the others and the router may still be starting, and
        a run's CPU must not include their start (it did: a fixed 0.5 s was not always enough)."""
        monitor = BrokerMonitor(self.proc.pid)
        deadline = time.monotonic() + timeout
        used = monitor.cpu_seconds()
        while time.monotonic() < deadline:
            time.sleep(window)
            now = monitor.cpu_seconds()
            if now - used < busy * window:
                return
            used = now

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.spec.name} exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(CONNECT)
                    if s.recv(4) == b"\x20\x02\x00\x00":
                        return
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.spec.name} did not accept MQTT on port {self.port} in {timeout} s")

    def log_tail(self, lines: int = 5) -> str:
        try:
            return " | ".join(Path(self.log_path).read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL the broker and every process under it at once (a crash, a power cut: nothing is
        closed in order, a kept store is what it was on disk); stop() then only reaps."""
        try:
            tree = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.Error:
            tree = []
        for proc in tree:
            try:
                proc.kill()
            except psutil.Error:
                pass
        self.proc.wait()

    def stop(self) -> None:
        try:
            tree = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            tree = []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for child in tree:  # anything the broker left behind
            try:
                child.kill()
            except psutil.Error:
                pass
        if self.own_data_dir:
            shutil.rmtree(self.own_data_dir, ignore_errors=True)


def mosquitto_conf(port: int, nodelay: bool, max_queued: int, acl_file: str = "", data_dir: str = "") -> str:
    lines = [f"listener {port} 127.0.0.1", "allow_anonymous true", f"max_queued_messages {max_queued}",
             "log_dest stderr", "log_type error", "log_type warning"]
    if data_dir:  # sessions saved at exit and read at start (autosave_interval's default 1800 s: a kill -9 loses them)
        lines += ["persistence true", f"persistence_location {data_dir.rstrip('/')}/"]
        if os.geteuid() == 0:  # as root it would run as user mosquitto, who cannot write our 0700 directories
            lines.append("user root")
    else:
        lines.append("persistence false")
    if nodelay:
        lines.append("set_tcp_nodelay true")
    if acl_file:
        lines.append(f"acl_file {acl_file}")
    return "\n".join(lines) + "\n"


def measure(spec: BrokerSpec, opts: Options, log_dir: str | None = None) -> dict:
    """Start the broker, run the scenario against it (its pid monitored), stop it; the report."""
    log_dir = log_dir or tempfile.mkdtemp(prefix="plexbench-")
    broker = RunningBroker(spec, log_dir)
    try:
        opts.port = broker.port
        opts.ports = broker.ports if len(broker.ports) > 1 else []
        opts.broker_pid = broker.pid
        result = runner.run(opts)
        if not broker.alive():
            result["notes"].append(f"BROKER DIED during the run: {broker.log_tail()}")
            result["ok"] = False
    finally:
        broker.stop()
    result["broker_name"] = spec.name
    result["broker_cmd"] = " ".join(broker.cmd)
    return result
