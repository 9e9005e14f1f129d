"""The workers' link to the router over tcp:// (`router_bind`): CURVE-encrypted and open only to the
workers' client key, keys generated per start or read from `router_curve_dir`, restarts relink, a bad
endpoint or key directory stops startup with one line, and the ipc:// default keeps its 0700 directory."""

from __future__ import annotations

import os
import signal
import socket
import stat
from collections.abc import Callable
from pathlib import Path

import orjson
import psutil
import pytest
import zmq
import zmq.auth

from plexmq import wire
from plexmq.acceptor import config as cfg
from tests.cli import names_line, one_error_line, run, write
from tests.conftest import Broker, wait_for
from tests.link_peer import hello, link_peer
from tests.mqtt import Client
from tests.processes import config_of

KEYS = {"server_public", "server_secret", "client_public", "client_secret"}
REFUSED_WAIT = 2.0  # seconds a refused peer waits for an answer that must not come


# -- helpers -----------------------------------------------------------------------------------------


def free_port_on(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def tcp_broker(start_broker: Callable[..., Broker], tmp_path: Path, host: str = "127.0.0.1",
               extra: str = "") -> tuple[Broker, str]:
    """A broker with two workers whose link is tcp://host:<free port>; (broker, endpoint)."""
    endpoint = f"tcp://[{host}]:{free_port_on(host)}" if ":" in host else f"tcp://{host}:{free_port_on(host)}"
    path = write(tmp_path, f'router_bind = "{endpoint}"\n{extra}')
    return start_broker("--config", str(path), "--workers", "2"), endpoint


def link_port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def linked_over_tcp(b: Broker, port: int) -> bool:
    """The router listens on `port` and every worker holds an established connection to it."""
    router, workers = b.router(), b.workers()
    if router is None or len(workers) != 2:
        return False
    try:
        listening = any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in router.net_connections("tcp"))
        return listening and all(any(c.status == psutil.CONN_ESTABLISHED and c.raddr and c.raddr.port == port
                                     for c in w.net_connections("tcp")) for w in workers.values())
    except psutil.Error:
        return False


def on_two_workers(b: Broker) -> tuple[Client, Client]:
    """Two paho clients held by different workers (so their messages cross the router link)."""
    first = Client(b.port)
    held = b.worker_holding(first.client.socket().getsockname()[1])  # type: ignore[union-attr]  # connected: has a socket
    for _ in range(10):
        other = Client(b.port)
        if b.worker_holding(other.client.socket().getsockname()[1]) != held:  # type: ignore[union-attr]  # as above
            return first, other
        other.disconnect()
    raise AssertionError("10 clients in a row went to the same worker")


def crossing(b: Broker, topic: str) -> None:
    """A QoS 1 message from a client of one worker reaches a subscriber on the other."""
    sub, pub = on_two_workers(b)
    try:
        assert sub.subscribe(topic, 1) == [1]
        pub.publish(topic, b"across the link", qos=1)
        msg = sub.get()
        assert (msg.topic, msg.payload) == (topic, b"across the link")
    finally:
        sub.disconnect()
        pub.disconnect()


def probe(endpoint: str, curve: tuple[bytes, bytes, bytes] | None, wait: float) -> bytes | None:
    """Connect a DEALER as a worker would (curve: server public, client public, client secret; None:
    plain), send HELLO and a CONNECT, and return the router's first frame, or None after `wait` s."""
    with link_peer(endpoint, b"w99", curve) as peer:
        peer.send(0, hello(99), (wire.CONNECT, wire.Connect(1, "curve-probe", False, None, None, 0, False, 0, True, -1,
                                                            None).encode()))
        return peer.frame(wait)


def answered_session(frame: bytes | None) -> bool:
    return frame is not None and wire.SESSION in [kind for kind, _header, _payload in wire.records(frame)]


# -- the tcp:// link -----------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_messages_cross_the_curve_link_between_workers(start_broker: Callable[..., Broker], tmp_path: Path,
                                                       host: str) -> None:
    b, endpoint = tcp_broker(start_broker, tmp_path, host)
    wait_for(lambda: linked_over_tcp(b, link_port(endpoint)), 10, f"the router on {endpoint} and both workers linked")
    router = config_of(b.router())
    assert router["router_endpoint"] == endpoint
    assert set(router["router_curve"]) == KEYS
    assert len(b.workers()) == 2  # forked from the acceptor after it wrote that file: they link with its keys
    crossing(b, "curve/link")


def test_secret_keys_stay_out_of_the_log_and_in_a_0600_file(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    b, _endpoint = tcp_broker(start_broker, tmp_path, extra='log_level = "debug"\n')
    config = config_of(b.router())
    crossing(b, "curve/quiet")
    for name in ("server_secret", "client_secret"):
        assert config["router_curve"][name] not in b.output(), f"the {name} is in the log"
    path = config["config_path"]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, f"{path} is {oct(os.stat(path).st_mode)}"
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    with open(path, "rb") as f:
        assert orjson.loads(f.read())["router_curve"] == config["router_curve"]


def test_peers_without_the_client_key_get_nothing_and_the_broker_stays_up(start_broker: Callable[..., Broker],
                                                                         tmp_path: Path) -> None:
    b, endpoint = tcp_broker(start_broker, tmp_path)
    wait_for(lambda: linked_over_tcp(b, link_port(endpoint)), 10, "both workers linked")
    keys = {k: v.encode() for k, v in config_of(b.router())["router_curve"].items()}
    pids = {b.router().pid, *(w.pid for w in b.workers().values())}  # type: ignore[union-attr]  # the router is up
    stranger_public, stranger_secret = zmq.curve_keypair()

    assert probe(endpoint, None, REFUSED_WAIT) is None, "a plain (unencrypted) peer got an answer"
    assert probe(endpoint, (keys["server_public"], stranger_public, stranger_secret), REFUSED_WAIT) is None, \
        "a peer that knows the server key but not the client key got an answer"

    assert b.proc.poll() is None
    assert {b.router().pid, *(w.pid for w in b.workers().values())} == pids, "a process died"  # type: ignore[union-attr]  # as above
    crossing(b, "curve/after-strangers")
    assert "Traceback" not in b.output(), b.output()[-3000:]
    # the probe can tell: with the workers' keys the router answers the same frames
    assert answered_session(probe(endpoint, (keys["server_public"], keys["client_public"], keys["client_secret"]), 10)), \
        "the router did not answer a peer with the workers' keys"


def test_restarted_router_and_worker_link_again(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    """A restarted child gets the same keys: the new router binds the same port, the new worker connects."""
    b, endpoint = tcp_broker(start_broker, tmp_path)
    keys = config_of(b.router())["router_curve"]
    for kill in ("router", "worker"):
        old = b.router() if kill == "router" else b.workers()[0]
        assert old is not None
        os.kill(old.pid, signal.SIGKILL)
        wait_for(lambda: (new := b.router() if kill == "router" else b.workers().get(0)) is not None  # noqa: B023
                 and new.pid != old.pid, 10, f"a new {kill}")  # noqa: B023  # both waited for in this turn
        wait_for(lambda: linked_over_tcp(b, link_port(endpoint)), 10, f"the link after the {kill}'s restart")
        assert config_of(b.router())["router_curve"] == keys  # the file a new worker reads too (a forked one: no env of its own)
        crossing(b, f"curve/after-{kill}")


def test_sighup_keeps_the_link_and_its_keys(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    b, _endpoint = tcp_broker(start_broker, tmp_path)
    keys = config_of(b.router())["router_curve"]
    wait_for(lambda: b.output().count(" ready (pid ") == 2, 20, "both workers to be ready")
    b.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "SIGHUP: config reloaded; changed: nothing" in b.output(), 10, "the reload line")
    wait_for(lambda: b.output().count("reloaded its settings") == 3, 10, "router and workers to apply it")
    assert "needs a restart" not in b.output(), "an unchanged file reads as changed"
    with open(config_of(b.router())["config_path"], "rb") as f:
        assert orjson.loads(f.read())["router_curve"] == keys
    crossing(b, "curve/after-hup")


# -- keys from files -----------------------------------------------------------------------------------


def key_dir(tmp_path: Path) -> Path:
    where = tmp_path / "curve"
    where.mkdir()
    zmq.auth.create_certificates(where, "server")
    zmq.auth.create_certificates(where, "client")
    return where


def test_keys_from_router_curve_dir(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    where = key_dir(tmp_path)
    b, _endpoint = tcp_broker(start_broker, tmp_path, extra=f'router_curve_dir = "{where}"\n')
    server_public, server_secret = zmq.auth.load_certificate(where / "server.key_secret")
    client_public, client_secret = zmq.auth.load_certificate(where / "client.key_secret")
    assert config_of(b.router())["router_curve"] == {
        "server_public": server_public.decode(), "server_secret": server_secret.decode(),  # type: ignore[union-attr]  # key_secret files have both
        "client_public": client_public.decode(), "client_secret": client_secret.decode()}  # type: ignore[union-attr]  # as above
    crossing(b, "curve/from-files")


def test_bad_router_curve_dir_stops_startup(tmp_path: Path) -> None:
    where = key_dir(tmp_path)
    (where / "client.key_secret").unlink()
    endpoint = 'port = 0\nmetrics_port = -1\nrouter_bind = "tcp://127.0.0.1:1884"\n'
    message = one_error_line(run("serve", "--config", str(write(tmp_path, f'{endpoint}router_curve_dir = "{where}"\n'))))
    assert "router_curve_dir" in message and "client.key_secret" in message, message
    (where / "server.key").rename(where / "client.key_secret")  # a public key only
    message = one_error_line(run("serve", "--config", str(write(tmp_path, f'{endpoint}router_curve_dir = "{where}"\n'))))
    assert "router_curve_dir" in message and "no CURVE key pair" in message, message
    message = one_error_line(run("serve", "--config", str(write(tmp_path, f'router_curve_dir = "{where}"\n'))))
    assert "router_curve_dir" in message and "router_bind" in message, message


def test_a_router_bind_in_use_stops_startup_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        endpoint = f"tcp://127.0.0.1:{taken.getsockname()[1]}"
        result = run("serve", "--config", str(write(tmp_path, f'port = 0\nmetrics_port = -1\nrouter_bind = "{endpoint}"\n')))
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip("\n").splitlines()
    assert len(lines) == 1 and "router_bind" in lines[0] and "in use" in lines[0], result.stderr


# -- validation ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ['"ipc:///tmp/router.ipc"', '"tcp://127.0.0.1"', '"tcp://127.0.0.1:0"',
                                   '"tcp://*:5555"', '"tcp://127.0.0.1:70000"', '"udp://127.0.0.1:5555"',
                                   '"tcp://1.2.3.999:5555"', '"tcp://::1:5555"', '"tcp://[broker]:5555"',
                                   '"127.0.0.1:5555"', "5555"])
def test_bad_router_bind_stops_startup_with_one_line(tmp_path: Path, value: str) -> None:
    path = write(tmp_path, f"port = 0\nmetrics_port = -1\nrouter_bind = {value}\n")
    message = one_error_line(run("serve", "--config", str(path)))
    assert str(path) in message and "router_bind" in message, message
    assert names_line(message, path, 3), f"line 3 not named: {message}"


@pytest.mark.parametrize("value", ["tcp://127.0.0.1:5555", "tcp://0.0.0.0:5555", "tcp://192.0.2.10:5555",
                                   "tcp://[::1]:5555", "tcp://[2001:db8::1]:5555", "tcp://broker.example:5555"])
def test_tcp_endpoints_beyond_loopback_are_allowed(tmp_path: Path, value: str) -> None:
    """Workers on other hosts are the point: no authentication is needed, CURVE keeps strangers out."""
    assert cfg.load(str(write(tmp_path, f'router_bind = "{value}"\n')), {})["router_bind"] == value


def test_the_ipc_default_has_no_keys_and_a_private_directory(broker: Broker) -> None:
    config = config_of(broker.router())
    assert config["router_bind"] == "" and "router_curve" not in config
    assert config["router_endpoint"].startswith("ipc://")
    run_dir = os.path.dirname(config["router_endpoint"].removeprefix("ipc://"))
    assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700


# -- roles ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lines, names", [
    ('role = "router"\nrouter_curve_dir = "{keys}"\n', "router_bind"),
    ('role = "router"\nrouter_bind = "tcp://127.0.0.1:5555"\n', "router_curve_dir"),
    ('role = "node"\nrouter_curve_dir = "{keys}"\n', "router ="),
    ('role = "node"\nrouter = "tcp://127.0.0.1:5555"\n', "router_curve_dir"),
    ('role = "node"\nrouter = "tcp://127.0.0.1:5555"\nrouter_bind = "tcp://127.0.0.1:5556"\nrouter_curve_dir = "{keys}"\n',
     "router_bind"),
    ('router = "tcp://127.0.0.1:5555"\n', "role node"),
    ('role = "edge"\n', "role"),
    ('role = "node"\nrouter = "tcp://127.0.0.1:5555"\nrouter_curve_dir = "{keys}"\nnode_name = "a b"\n', "node_name"),
])
def test_a_role_whose_link_does_not_fit_stops_startup_with_one_line(tmp_path: Path, lines: str, names: str) -> None:
    keys = key_dir(tmp_path)
    message = one_error_line(run("serve", "--config", str(write(tmp_path, "port = 0\nmetrics_port = -1\n"
                                                                 + lines.format(keys=keys)))))
    assert names in message, message


def test_plexmq_keys_makes_private_pairs_once_that_a_role_can_load(tmp_path: Path) -> None:
    where = tmp_path / "keys"
    first = run("keys", str(where))
    assert first.returncode == 0 and "created the server and client key pairs" in first.stdout, first.stderr
    assert stat.S_IMODE(os.stat(where).st_mode) == 0o700
    secrets = {name: (where / f"{name}.key_secret").read_bytes() for name in ("server", "client")}
    assert all(stat.S_IMODE(os.stat(where / f"{name}.key_secret").st_mode) == 0o600 for name in secrets)
    again = run("keys", str(where))
    assert again.returncode == 0 and "there already" in again.stdout
    assert {name: (where / f"{name}.key_secret").read_bytes() for name in secrets} == secrets, "keys were replaced"
    node = cfg.load(str(write(tmp_path, f'role = "node"\nrouter = "tcp://10.0.0.1:7883"\nrouter_curve_dir = "{where}"\n')), {})
    assert node["role"] == "node" and cfg.curve_keys(node["router_curve_dir"])["client_public"]
