"""Which connections the acceptor takes: network lists, max_connections and the per-address rate,
all decided before any MQTT byte is read (a refused socket is closed without a CONNACK)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from plexmq.mqtt import v4 as p
from tests.conftest import Broker, wait_for
from tests.mqtt import Client, RawClient
from tests.steps import from_address, uid


def refused(c: RawClient) -> bool:
    """True: the broker closed the socket without answering a CONNECT; False: it answered CONNACK."""
    try:
        c.send(p.encode_connect(f"adm-{uid()}"))
        first, _body = c.recv()
    except (AssertionError, ConnectionResetError, BrokenPipeError):
        return True
    assert first == 0x20
    return False


def served(c: RawClient) -> bool:
    return not refused(c)


def broker_with(tmp_path: Path, start_broker: Callable[..., Broker], text: str) -> Broker:
    config = tmp_path / "plexmq.toml"
    config.write_text(text)
    return start_broker("--workers", "2", "--config", str(config))


def test_network_lists(tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    b = broker_with(tmp_path, start_broker, 'allow_networks = ["127.0.0.0/24"]\ndeny_networks = ["127.0.0.9/32"]\n')
    assert served(from_address(b.port, "127.0.0.1"))
    assert refused(from_address(b.port, "127.0.0.9"))  # deny wins inside an allowed network
    assert refused(from_address(b.port, "127.0.1.1"))  # outside every allowed network
    wait_for(lambda: "refused a connection from 127.0.0.9 (denied network)" in b.output(), 5, "the refusal logged")


def test_max_connections(tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    b = broker_with(tmp_path, start_broker, "max_connections = 3\n")

    def one_more() -> RawClient | None:
        c = RawClient(b.port)
        return None if refused(c) else c

    # the startup probe's connection may still count for a moment: wait for room rather than assume it
    held = [wait_for(one_more, 5, "room for a connection") for _ in range(3)]
    assert one_more() is None
    held.pop().close()
    wait_for(one_more, 5, "room for one more once a client left")


def test_connection_rate_per_address(tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    b = broker_with(tmp_path, start_broker, "max_connection_rate = 2\n")
    outcomes = [refused(from_address(b.port, "127.0.0.3")) for _ in range(6)]
    assert outcomes[:2] == [False, False] and any(outcomes[2:]), outcomes  # a burst of 2, then 2 per second
    assert served(from_address(b.port, "127.0.0.4"))  # another address has its own allowance


def test_a_rate_below_one_per_second_admits_one_at_a_time(tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    """0.5: one connection every 2 s per address (every one was refused, also after a reload)."""
    b = broker_with(tmp_path, start_broker, "max_connection_rate = 0.5\n")
    assert served(from_address(b.port, "127.0.0.5"))
    assert refused(from_address(b.port, "127.0.0.5"))  # the next one is due in 2 s
    assert served(from_address(b.port, "127.0.0.6"))


def test_memory_limit_sheds_qos0_first(tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    b = broker_with(tmp_path, start_broker, "memory_limit = 1\n")  # always above it
    wait_for(lambda: b.output().count("sheds QoS 0 deliveries") == 2, 10, "both workers to shed")
    q0, q1, pub = Client(b.port, f"adm-q0-{uid()}"), Client(b.port, f"adm-q1-{uid()}"), Client(b.port)
    q0.subscribe("adm/shed", 0)
    q1.subscribe("adm/shed", 1)
    pub.publish("adm/shed", b"kept", qos=1)
    assert q1.get().payload == b"kept"
    assert q0.nothing()
    for c in (q0, q1, pub):
        c.disconnect()
