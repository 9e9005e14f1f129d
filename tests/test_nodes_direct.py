"""Nodes' workers that send each other QoS 0 messages themselves (issue 35: `direct_bind`), in network
namespaces as tests/test_nodes.py runs them: n1 and n2 each bind a direct endpoint on their back
address, n3 none. A QoS 0 message from n1 to a subscriber on n2 goes straight from worker to worker
(it arrives with the router stopped, over a TCP connection to n2's direct port); one to n3, and every
QoS 1 one, crosses the router; a node whose direct endpoint cannot be reached is shunned and its
messages cross the router again."""

from __future__ import annotations

import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from plexmq.acceptor import config as cfg
from tests.conftest import wait_for
from tests.hosts import Net, make_keys, open_net, sh
from tests.mqtt import RawClient
from tests.steps import publish, receive, subscribe, sync, uid

DIRECT_PORT = 7000


def direct_bind(net: Net, name: str) -> str:
    """n1 and n2 bind a direct endpoint on their back address, n3 none."""
    return f'direct_bind = "tcp://{net.host(name).back_ip}:{DIRECT_PORT}"\n' if name != "n3" else ""


def open_direct_net(tmp_path: Path) -> Iterator[Net]:
    yield from open_net(tmp_path, direct_bind, ("n1", "n2", "n3"))


@pytest.fixture(scope="module")
def direct_net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Net]:
    yield from open_direct_net(tmp_path_factory.mktemp("direct"))


@pytest.fixture
def own_direct_net(tmp_path: Path) -> Iterator[Net]:
    """Dedicated hosts (a test that cuts a path between two nodes)."""
    yield from open_direct_net(tmp_path)


def router_process(net: Net) -> psutil.Process:
    router = net.router.child("plexmq.router")
    assert router is not None
    return router


def pair(net: Net, src: str, dst: str) -> tuple[str, RawClient, RawClient]:
    """A topic, its QoS 0 subscriber on `dst` and a publisher on `src` whose worker has nothing on its way
    through the router (a QoS 1 message, which crosses it, acknowledged and delivered)."""
    topic = f"direct/{uid()}"
    sub = net.host(dst).client()
    assert subscribe(sub, 1, [(topic, 1)]) == [1]
    pub = net.host(src).client()
    publish(pub, topic, b"warm", 1)
    assert [m.payload for m in receive(sub, count=1)] == [b"warm"]
    return topic, sub, pub


def connections(net: Net, name: str, to: str) -> list[str]:
    """The established TCP connections from namespace `name` to address:port `to`."""
    done = subprocess.run(["ip", "netns", "exec", net.host(name).ns, "ss", "-Htn", "state", "established", "dst", to],
                          capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def test_direct_bind_is_a_reachable_address_of_a_node(tmp_path: Path) -> None:
    keys = make_keys(tmp_path / "keys")
    node = f'role = "node"\nrouter = "tcp://10.0.0.1:7883"\nrouter_curve_dir = "{keys}"\nworkers = 4\n'
    conf = tmp_path / "plexmq.toml"
    conf.write_text(f'{node}direct_bind = "tcp://10.0.0.2:7000"\n')
    assert cfg.load(str(conf), {})["direct_bind"] == "tcp://10.0.0.2:7000"
    for bad, why in [(f'{node}direct_bind = "tcp://0.0.0.0:7000"\n', "not a wildcard"),
                     (f'{node}direct_bind = "ipc:///tmp/x"\n', "not a wildcard"),
                     (f'{node}direct_bind = "tcp://10.0.0.2:65533"\n', "its port + workers (4) passes 65535"),
                     ('direct_bind = "tcp://10.0.0.2:7000"\n', "only for role node")]:
        conf.write_text(bad)
        with pytest.raises(cfg.ConfigError, match=re.escape(why)) as err:
            cfg.load(str(conf), {})
        assert "direct_bind" in str(err.value) and "\n" not in str(err.value)


def test_a_qos0_message_goes_from_one_nodes_worker_to_the_others_without_the_router(direct_net: Net) -> None:
    topic, sub, pub = pair(direct_net, "n1", "n2")
    router = router_process(direct_net)
    router.send_signal(signal.SIGSTOP)
    try:
        payloads = [b"m%d" % i for i in range(50)]
        for payload in payloads:
            publish(pub, topic, payload, 0)
        assert [m.payload for m in receive(sub, payloads=payloads)] == payloads
    finally:
        router.send_signal(signal.SIGCONT)
    assert connections(direct_net, "n1", f"{direct_net.host('n2').back_ip}:{DIRECT_PORT}")
    publish(pub, topic, b"qos1", 1)  # QoS 1 between nodes crosses the router
    assert [(m.payload, m.qos) for m in receive(sub, count=1)] == [(b"qos1", 1)]
    assert sync(sub) == [], "a message came twice"
    for c in (sub, pub):
        c.close()


def test_a_node_without_a_direct_endpoint_gets_its_messages_through_the_router(direct_net: Net) -> None:
    topic, sub, pub = pair(direct_net, "n1", "n3")
    payloads = [b"m%d" % i for i in range(50)]
    for payload in payloads:
        publish(pub, topic, payload, 0)
    assert [m.payload for m in receive(sub, payloads=payloads)] == payloads
    assert not connections(direct_net, "n1", direct_net.host("n3").back_ip)
    assert sync(sub) == []
    for c in (sub, pub):
        c.close()


def test_a_node_whose_direct_endpoint_cannot_be_reached_gets_its_messages_through_the_router(own_direct_net: Net) -> None:
    """n1 cannot reach n2 (a blackhole route in n1's namespace; both still reach the router): what it
    sent n2 directly is dropped (QoS 0), it says so once PATIENCE passed, and every later message to
    n2 crosses the router, in order."""
    net = own_direct_net
    sh("ip", "-n", net.host("n1").ns, "route", "add", "blackhole", f"{net.host('n2').back_ip}/32")
    topic, sub, pub = pair(net, "n1", "n2")
    publish(pub, topic, b"lost", 0)
    wait_for(lambda: "its node's messages cross the router" in net.host("n1").since_start(), 10,
             "n1 to shun n2's worker")
    payloads = [b"m%d" % i for i in range(50)]
    for payload in payloads:
        publish(pub, topic, payload, 0)
    got = [m.payload for m in receive(sub, payloads=payloads)]
    assert [x for x in got if x != b"lost"] == payloads
    for c in (sub, pub):
        c.close()
