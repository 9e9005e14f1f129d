"""A bridge across a link cut for real: plexmq in this namespace, a mosquitto remote in a network
namespace of its own joined by a veth pair (as tests/hosts.py joins hosts), the link set down (no FIN,
no RST: the bridge learns of it from its keepalive) while QoS 1 messages are published here, then set up
again: every message arrives, in order, and the log says each change of state with its reason."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from plexmq.bench.brokers import MOSQUITTO, mosquitto_conf
from tests.bridging import bridged, serve
from tests.conftest import Broker, wait_for
from tests.hosts import free_prefix, sh
from tests.mqtt import Client

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip") or not os.path.exists(MOSQUITTO),
                                reason="needs root, ip (network namespaces) and Debian's mosquitto")

PORT = 1883  # the remote's, in its own namespace


class Remote:
    """A mosquitto in a namespace of its own, reached from here through a veth pair whose root end
    (`veth`) the test sets down and up."""

    def __init__(self, tmp_path: Path) -> None:
        tag = secrets.token_hex(3)
        self.ns, self.veth, peer = f"pmqbr{tag}", f"pbr{tag}", f"pbrn{tag}"
        prefix = free_prefix()
        self.here, self.ip = f"{prefix}.0.1", f"{prefix}.0.2"
        sh("ip", "netns", "add", self.ns)
        sh("ip", "link", "add", self.veth, "type", "veth", "peer", "name", peer)
        sh("ip", "link", "set", peer, "netns", self.ns)
        sh("ip", "addr", "add", f"{self.here}/24", "dev", self.veth)
        sh("ip", "link", "set", self.veth, "up")
        for args in (("addr", "add", f"{self.ip}/24", "dev", peer), ("link", "set", peer, "up"), ("link", "set", "lo", "up")):
            sh("ip", "netns", "exec", self.ns, "ip", *args)
        (tmp_path / "remote-data").mkdir()
        conf = tmp_path / "remote.conf"
        conf.write_text(mosquitto_conf(PORT, False, 10_000, data_dir=str(tmp_path / "remote-data"))
                        .replace(f"listener {PORT} 127.0.0.1", f"listener {PORT}"))
        self.log = tmp_path / "remote.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(["ip", "netns", "exec", self.ns, MOSQUITTO, "-c", str(conf)], stdout=log,
                                         stderr=subprocess.STDOUT)
        wait_for(self._serves, 10, "mosquitto to listen in its namespace")

    def _serves(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()
        try:
            socket.create_connection((self.ip, PORT), timeout=1).close()
        except OSError:
            return False
        return True

    def sub(self, *args: str) -> str:
        """mosquitto_sub inside the namespace, as client `watcher` whose session mosquitto keeps: its output."""
        done = subprocess.run(["ip", "netns", "exec", self.ns, "mosquitto_sub", "-p", str(PORT), "-i", "watcher", "-c",
                               "-q", "1", "-t", "data/#", *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        subprocess.run(["ip", "link", "del", self.veth], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[Remote]:
    found = Remote(tmp_path)
    yield found
    found.close()


def test_a_link_cut_and_restored_loses_nothing(tmp_path: Path, remote: Remote,
                                                brokers: list[Broker]) -> None:  # noqa: F811  the fixture
    b = serve(brokers, tmp_path, f'[bridges.cloud]\naddress = ["{remote.ip}:{PORT}"]\nkeepalive = 2\n'
              'out = [{filter = "data/#"}]\n')
    bridged(b)
    remote.sub("-E")  # subscribed, its session kept, gone
    sh("ip", "link", "set", remote.veth, "down")
    publisher = Client(b.port, "publisher")
    for i in range(100):
        publisher.publish("data/x", str(i), qos=1)
    wait_for(lambda: "bridge cloud: remote down: no answer for" in b.output(), 30, "the bridge to see the link cut")
    sh("ip", "link", "set", remote.veth, "up")
    wait_for(lambda: b.output().count("bridge cloud: remote up") == 2, 60, "the bridge back over the link")
    assert remote.sub("-C", "100", "-W", "30").split() == [str(i) for i in range(100)]
    said = [line.split("bridge cloud: ", 1)[1] for line in b.output().splitlines() if "bridge cloud: remote" in line]
    assert said[0].startswith("remote up") and said[-1].startswith("remote up")
    assert said[1].startswith("remote down: no answer for") and "(keepalive 2 s); reconnecting" in said[1]
