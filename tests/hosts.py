"""Hosts for multi-node tests: a router and nodes, each in a network namespace of its own.

Two Linux bridges in the root namespace join them: the front one carries the test's clients (the
root namespace has an address there) to the nodes' MQTT listeners and the router's metrics; the back
one carries only router <-> node links (the root namespace has no address there). Each namespace has a
veth pair into each bridge; cutting a node's back veth (its root end) is a silent cut: no RST, no FIN.
Names (namespaces, bridges, veths) carry a random suffix and the addresses a random 10.X.0.0/16, so
that two harnesses never collide. Nothing here reaches outside the machine.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from plexmq.acceptor.status import Samples, scrape
from tests.conftest import ROOT, wait_for
from tests.mqtt import RawClient
from tests.steps import uid

LINK_TIMEOUT = 2.0  # seconds of silence before the router takes a node's worker for dead
ROUTER_PORT = 5555  # router_bind's port, on the router's back address
METRICS_PORT = 9883  # the router's metrics, on its front address
MQTT_PORT = 1883  # each node's listener, on its front address
QUEUE = 20_000  # max_queued_messages: a stream to an offline session must not overflow its queue
START_LIMIT = 20.0  # seconds a host may take to serve (and a node to join)


def sh(*args: str) -> None:
    """Run one `ip` command; RuntimeError with the command and its stderr when it fails."""
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"`{' '.join(args)}` failed ({done.returncode}): {done.stderr.strip()}")


def make_keys(directory: Path) -> Path:
    """A CURVE key directory (server and client pairs) as router and nodes share it."""
    directory.mkdir(mode=0o700)
    subprocess.run([sys.executable, "-c", "import sys, zmq.auth as a; "
                    "[a.create_certificates(sys.argv[1], n) for n in ('server', 'client')]", str(directory)],
                   check=True, cwd=ROOT)
    return directory


def alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (an orphan's zombie may linger where PID 1 does not reap)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def free_prefix() -> str:
    """A random 10.X whose 10.X.0.0/16 no interface of the root namespace uses yet."""
    used = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    while True:
        prefix = f"10.{secrets.randbelow(200) + 40}"
        if f" {prefix}." not in used:
            return prefix


class Host:
    """One namespace and, once started, the `plexmq serve` running in it (its own process group)."""

    def __init__(self, net: Net, name: str, index: int) -> None:
        self.net, self.name = net, name
        self.ns = f"pmq{net.tag}-{name}"
        self.front_ip = f"{net.prefix}.1.{index}"
        self.back_ip = f"{net.prefix}.2.{index}"
        self.front_veth = f"pf{net.tag}{name}"  # root ends (<= 15 characters)
        self.back_veth = f"pb{net.tag}{name}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = net.tmp_path / f"{name}.log"
        self.starts = 0
        self.run_dir = net.tmp_path  # its run_dir once started (`start`)
        self.mark = 0  # where the latest start's log begins

    def create(self) -> None:
        sh("ip", "netns", "add", self.ns)
        self.net.namespaces.append(self.ns)
        for veth, bridge, ip, inner in ((self.front_veth, self.net.front, self.front_ip, "front"),
                                        (self.back_veth, self.net.back, self.back_ip, "back")):
            sh("ip", "link", "add", veth, "type", "veth", "peer", "name", inner, "netns", self.ns)
            self.net.links.append(veth)
            sh("ip", "link", "set", veth, "master", bridge, "up")
            sh("ip", "-n", self.ns, "addr", "add", f"{ip}/24", "dev", inner)
            sh("ip", "-n", self.ns, "link", "set", inner, "up")
        sh("ip", "-n", self.ns, "link", "set", "lo", "up")

    def start(self, *args: str, config: str = "") -> None:
        """`plexmq serve ARGS` in this namespace, logging to `log_path` (appended across restarts)."""
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} is already running"
        self.starts += 1
        conf = self.net.tmp_path / f"{self.name}.toml"
        run_dir = self.run_dir = self.net.tmp_path / f"{self.name}-run{self.starts}"
        console = "" if "console_port" in config else "console_port = -1\n"  # no console unless a test asks
        conf.write_text(f"link_timeout = {LINK_TIMEOUT}\nallow_anonymous = true\nrun_dir = \"{run_dir}\"\n"
                        f"max_queued_messages = {QUEUE}\n{console}{config}")
        with open(self.log_path, "ab") as log:
            log.write(f"---- start {self.starts}\n".encode())
            log.flush()
            self.mark = self.log_path.stat().st_size
            command = [sys.executable, "-m", "plexmq.acceptor", "serve", "--config", str(conf), *args]
            self.proc = subprocess.Popen(["ip", "netns", "exec", self.ns, *command], cwd=ROOT, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def since_start(self) -> str:
        """The log of the latest start."""
        return self.log_path.read_bytes()[self.mark:].decode(errors="replace")

    def check_running(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            raise AssertionError(f"{self.name} is not running (exit status {code}):\n{self.output()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL the whole host (acceptor and children at once) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            procs = self.processes()
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
            wait_for(lambda: not any(alive(p) for p in procs), 5, f"every process of {self.name} to be gone")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL for whatever of the process group outlives 10 s."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)  # `ip netns exec` exec'd: this is the acceptor
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # children of a killed acceptor keep its group
        except ProcessLookupError:
            pass
        self.proc.wait()

    def processes(self) -> list[psutil.Process]:
        """The acceptor and its descendants."""
        if self.proc is None:
            return []
        try:
            top = psutil.Process(self.proc.pid)
            return [top, *top.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def child(self, module: str) -> psutil.Process | None:
        """The acceptor's live child running `python -m MODULE`."""
        for proc in self.processes()[1:]:
            try:
                cmd = proc.cmdline()
                if module in cmd and cmd[cmd.index(module) - 1] == "-m" and alive(proc):
                    return proc
            except psutil.Error:
                continue
        return None

    def raw(self) -> RawClient:
        """A socket to this node's MQTT listener (not yet CONNECTed), from the root namespace."""
        return RawClient(MQTT_PORT, host=self.front_ip)

    def client(self, client_id: str = "", clean: bool = True, **kw: Any) -> RawClient:
        """A client CONNECTed (3.1.1) to this node."""
        c = self.raw()
        _present, code = c.connect(client_id or f"c-{uid()}", clean, **kw)
        assert code == 0, f"CONNACK {code} from {self.name}"
        return c

    def cut(self) -> None:
        """Take the back link down (router <-> this host): packets vanish, no RST."""
        sh("ip", "link", "set", self.back_veth, "down")

    def heal(self) -> None:
        sh("ip", "link", "set", self.back_veth, "up")


class Net:
    """The bridges, the namespaces and the processes of one test (or module); `close` removes all."""

    def __init__(self, tmp_path: Path, workers: int = 1) -> None:
        self.tmp_path = tmp_path
        self.workers = workers
        self.tag = secrets.token_hex(2)  # 4 hex digits: "pb" + tag + "router" is 12 characters
        self.prefix = free_prefix()
        self.front, self.back = f"pmqf{self.tag}", f"pmqb{self.tag}"
        self.namespaces: list[str] = []
        self.links: list[str] = []  # bridges and root ends of veths
        self.hosts: dict[str, Host] = {}
        self.keys = tmp_path / "keys"
        self.metrics_url = ""

    def open(self) -> None:
        """The keys and the two bridges (the root namespace's address on the front one)."""
        make_keys(self.keys)
        for bridge in (self.front, self.back):
            sh("ip", "link", "add", bridge, "type", "bridge")
            self.links.append(bridge)
            sh("ip", "link", "set", bridge, "up")
        sh("ip", "addr", "add", f"{self.prefix}.1.254/24", "dev", self.front)

    def host(self, name: str) -> Host:
        """The namespace `name`, made on first use (index 1 is the router's)."""
        if name not in self.hosts:
            h = self.hosts[name] = Host(self, name, len(self.hosts) + 1)
            h.create()
        return self.hosts[name]

    @property
    def router(self) -> Host:
        return self.host("router")

    @property
    def token_file(self) -> str:
        """The router's admin token: `plexmq clients` is told it, since another test's broker in another
        namespace may serve the same metrics port (the tool could not tell which of them is meant)."""
        return str(self.router.run_dir / f"admin-{METRICS_PORT}.token")

    @property
    def router_url(self) -> str:
        return f"tcp://{self.router.back_ip}:{ROUTER_PORT}"

    def start_router(self) -> Host:
        r = self.router
        r.start("--role", "router", "--router-bind", self.router_url, "--router-curve-dir", str(self.keys),
                "--data-dir", str(self.tmp_path / "router-data"), "--metrics-port", str(METRICS_PORT),
                config=f'metrics_host = "{r.front_ip}"\nsys_interval = 1\n')  # no command line option for it
        self.metrics_url = f"http://{r.front_ip}:{METRICS_PORT}"
        wait_for(lambda: self._router_ready(r), START_LIMIT, "the router to listen and serve metrics")
        return r

    def _router_ready(self, r: Host) -> bool:
        r.check_running()
        log = r.since_start()
        if "router listening on tcp://" not in log or "metrics on http://" not in log:
            return False
        try:
            scrape(self.metrics_url)
        except OSError:
            return False
        return True

    def start_node(self, name: str, keys: Path | None = None, join: bool = True, config: str = "") -> Host:
        """A node joining the router (with `keys`, default the router's; `config`: more TOML lines); with
        `join`, wait until the router's metrics show it up with all its workers."""
        n = self.host(name)
        n.start("--role", "node", "--router", self.router_url, "--router-curve-dir", str(keys or self.keys),
                "--node-name", name, "--host", n.front_ip, "--port", str(MQTT_PORT), "--workers", str(self.workers),
                "--metrics-port", "-1", "--data-dir", str(self.tmp_path / f"{name}-data"), config=config)

        def listening() -> bool:
            n.check_running()
            return "plexmq listening on" in n.since_start()

        wait_for(listening, START_LIMIT, f"{name} to listen")
        if join:
            self.wait_joined(name)
        return n

    def wait_joined(self, name: str, timeout: float = START_LIMIT) -> None:
        def joined() -> bool:
            self.hosts[name].check_running()
            m = self.metrics()
            return self.node_up(name, m) == 1 and self.value(m, "plexmq_node_workers", node=name) == self.workers
        wait_for(joined, timeout, f"{name} to be up in the router's metrics with {self.workers} workers")

    def metrics(self) -> Samples:
        return scrape(self.metrics_url)

    @staticmethod
    def value(samples: Samples, metric: str, **labels: str) -> float | None:
        """The one sample of `metric` whose labels include `labels` (None when there is none)."""
        found = [v for (name, got), v in samples.items()
                 if name == metric and set(labels.items()) <= set(got)]
        assert len(found) <= 1, f"{len(found)} samples of {metric} {labels}"
        return found[0] if found else None

    def node_up(self, name: str, samples: Samples | None = None) -> float | None:
        """plexmq_node_up of node `name` (None: the router never saw it)."""
        return self.value(self.metrics() if samples is None else samples, "plexmq_node_up", node=name)

    def nodes(self) -> set[str]:
        """Every node the router's metrics name."""
        return {dict(labels)["node"] for (name, labels) in self.metrics() if name == "plexmq_node_up"}

    def close(self) -> None:
        """Stop every process, then remove the veths, bridges and namespaces (whatever failed before)."""
        try:
            for h in self.hosts.values():  # all at once: each stop below then mostly waits for an exit under way
                if h.proc is not None and h.proc.poll() is None:
                    h.proc.send_signal(signal.SIGTERM)
            for h in self.hosts.values():
                h.stop()
        finally:
            self._remove()

    def _remove(self) -> None:
        for link in reversed(self.links):
            subprocess.run(["ip", "link", "del", link], capture_output=True)
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _can_make_namespaces() -> str | None:
    """None when this machine lets us make namespaces and bridges, else why not (command and stderr)."""
    probe = f"pmqprobe{secrets.token_hex(2)}"
    for cmd in (["ip", "netns", "add", probe], ["ip", "link", "add", probe, "type", "bridge"]):
        try:
            subprocess.run(cmd, check=True, capture_output=True, text=True)
        except FileNotFoundError:
            return f"`{' '.join(cmd)}`: no `ip` command"
        except subprocess.CalledProcessError as exc:
            return f"`{' '.join(cmd)}` failed: {exc.stderr.strip()}"
        finally:
            for undo in (["ip", "netns", "del", probe], ["ip", "link", "del", probe]):
                try:
                    subprocess.run(undo, capture_output=True)
                except OSError:
                    pass
    return None


def open_net(tmp_path: Path, nodes: Callable[[Net, str], str] | None = None,
             names: tuple[str, ...] = ("n1", "n2")) -> Iterator[Net]:
    """A router and nodes `names` (joined) for one test or module, each with the config lines `nodes`
    gives it (none by default); everything removed afterwards."""
    reason = _can_make_namespaces()
    if reason:
        pytest.skip(f"network namespaces unavailable: {reason}")
    net = Net(tmp_path)
    try:
        net.open()
        net.start_router()
        for name in names:  # side by side: all join while the last starts
            net.start_node(name, join=False, config=nodes(net, name) if nodes else "")
        for name in names:
            net.wait_joined(name)
        yield net
    finally:
        net.close()


@pytest.fixture
def net(tmp_path: Path) -> Iterator[Net]:
    """Dedicated hosts (a test that kills or cuts them)."""
    yield from open_net(tmp_path)


@pytest.fixture(scope="module")
def shared_net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Net]:
    """Hosts shared by the tests of a module that leave them as they found them."""
    yield from open_net(tmp_path_factory.mktemp("net"))

