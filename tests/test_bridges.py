"""Bridges (acceptor/bridges): a real plexmq bridged to a real mosquitto (Debian's, on a free port with
a config of its own) or to another plexmq, both directions, the remote stopped and restarted with
QoS 1 messages waiting, kill -9 of the bridge process and of the router with a queue waiting (0
acknowledged lost), QoS 2 exactly once across reconnects, no echo between two brokers bridged both ways,
and the config's errors."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from plexmq.acceptor import config as cfg
from plexmq.acceptor.bridges.flow import MAPPED, Flow
from plexmq.acceptor.bridges.link import Link, Login
from plexmq.acceptor.bridges.rules import first, parse
from plexmq.bench.brokers import MOSQUITTO, mosquitto_conf
from plexmq.mqtt import v4 as p4
from plexmq.mqtt.framing import frame
from plexmq.mqtt.kinds import PUBLISH
from tests.bridging import bridged, serve
from tests.cli import metrics_url, names_line, write
from tests.conftest import ROOT, Broker, free_port, wait_for
from tests.mqtt import Client, RawClient
from tests.pki import make_pki

pytestmark = pytest.mark.skipif(not os.path.exists(MOSQUITTO), reason="needs Debian's mosquitto")


class Mosquitto:
    """A private mosquitto on a free loopback port, its sessions kept on disk across `stop` and `start`."""

    def __init__(self, tmp_path: Path, listener: str = "") -> None:
        """`listener`: more lines for its listener (TLS)."""
        self.port = free_port()
        self.conf = tmp_path / "mosquitto.conf"
        (tmp_path / "mosquitto-data").mkdir()
        self.conf.write_text(mosquitto_conf(self.port, False, 10_000, data_dir=str(tmp_path / "mosquitto-data")) + listener)
        self.log = tmp_path / "mosquitto.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stdout=log, stderr=subprocess.STDOUT)
        wait_for(self._serves, 10, "mosquitto to listen")

    def _serves(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, self.log.read_text()
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()  # TLS or not: it listens
        except OSError:
            return False
        return True

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: it saves its sessions first
            self.proc.wait(10)
        self.proc = None


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Mosquitto]:
    found = Mosquitto(tmp_path)
    yield found
    found.stop()


def bridge_process(b: Broker) -> psutil.Process:
    return wait_for(lambda: next((c for c in b.children() if "plexmq.acceptor.bridges" in c.cmdline()), None), 10, "the bridge")


def watcher(port: int, topic: str, qos: int = 1) -> Client:
    """A 3.1.1 subscriber of `topic` at `qos` whose session the broker keeps (client id `watcher`)."""
    client = Client(port, "watcher", clean=False)
    client.subscribe(topic, qos)
    return client


def received(client: Client, count: int) -> list[str]:
    return [client.get(timeout=30).payload.decode() for _ in range(count)]


def test_out_and_in_through_a_mosquitto(tmp_path: Path, mosquitto: Mosquitto, brokers: list[Broker]) -> None:
    """Local sensors/# goes out as site1/sensors/#, remote cmd/site1/# comes in as cmd/#, retained flags
    kept; the bridge logs in with its token though the broker asks for passwords and a tenant; no
    other client may take its client id; `plexmq bridges` and /metrics show it."""
    (tmp_path / "users.pw").write_text("")
    (tmp_path / "users.pw").chmod(0o600)
    tenant_port = free_port()
    b = serve(brokers, tmp_path, f'password_file = "{tmp_path / "users.pw"}"\ntenant_required = true\n'
              f'[tenants.acme]\nlisteners = ["mqtt://127.0.0.1:{tenant_port}"]\nallow_anonymous = true\n'
              f'[bridges.cloud]\naddress = ["127.0.0.1:{mosquitto.port}"]\ntenant = "acme"\n'
              'out = [{filter = "sensors/#", prefix = "site1/"}]\n'
              'in = [{filter = "cmd/site1/#", strip = "cmd/site1/", prefix = "cmd/"}]\n')
    bridged(b)
    remote = watcher(mosquitto.port, "site1/#")
    local = Client(tenant_port, "local-sub")
    local.subscribe("cmd/#", 1)
    Client(tenant_port, "local-pub").publish("sensors/temp", b"21.5", qos=1, retain=True)
    message = remote.get(timeout=10)
    assert (message.topic, message.payload) == ("site1/sensors/temp", b"21.5")
    late = Client(mosquitto.port, "late")  # retained there too (a live 3.1.1 delivery carries no retain flag)
    late.subscribe("site1/#", 1)
    message = late.get(timeout=10)
    assert (message.topic, message.retain) == ("site1/sensors/temp", True)
    Client(mosquitto.port, "remote-pub").publish("cmd/site1/valve", b"open", qos=1)
    message = local.get(timeout=10)
    assert (message.topic, message.payload, message.qos) == ("cmd/valve", b"open", 1)
    raw = RawClient(b.port)
    assert raw.connect5("plexmq-bridge-cloud", password=b"guess")[1] == 0x86  # bad user name or password
    row = listed(tmp_path, ["0", "0", "1", "1", "0"])
    assert row[0] == "cloud" and row[-1] == "connected"
    wanted = ('plexmq_bridge_connected{bridge="cloud"} 1.0', 'plexmq_bridge_messages_sent_total{bridge="cloud"} 1.0',
              'plexmq_bridge_messages_received_total{bridge="cloud"} 1.0', 'plexmq_bridge_held_messages{bridge="cloud"} 0.0',
              'plexmq_bridge_queued_messages{bridge="cloud"} 0.0')
    scraped = ""

    def shown() -> bool:  # the router reads the bridge's figures once a second, after `plexmq bridges` may
        nonlocal scraped
        scraped = urllib.request.urlopen(metrics_url(b) + "/metrics", timeout=10).read().decode()
        return all(line in scraped for line in wanted)

    try:
        wait_for(shown, 10, "the bridge's figures on /metrics")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; missing: {[line for line in wanted if line not in scraped]}") from None


def listed(tmp_path: Path, counts: list[str]) -> list[str]:
    """`plexmq bridges --config` for broker a's first bridge, once its queued, held, sent, received and
    dropped are `counts` (the bridge and the router write their figures once a second): its row, split."""
    last: list[str] = []

    def row() -> list[str] | None:
        listing = subprocess.run([sys.executable, "-m", "plexmq.acceptor", "bridges", "--config", str(tmp_path / "a.toml")],
                                 cwd=ROOT, capture_output=True, text=True, timeout=30)
        assert listing.returncode == 0, listing.stderr
        last[:] = listing.stdout.splitlines()[1].split()
        return last if last[3:8] == counts else None

    try:
        return wait_for(row, 10, f"queued, held, sent, received, dropped: {counts}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last: {last}") from None


def queued_while_remote_down(tmp_path: Path, mosquitto: Mosquitto, brokers: list[Broker], rule: str,
                             count: int, qos: int = 1) -> tuple[Broker, Client]:
    """A broker bridging `data/#` out (with `rule`'s more keys) to `mosquitto`, which has a session for
    the bridge's remote topics (at `qos`) and is then stopped, and `count` messages at `qos` acknowledged
    meanwhile: the broker and their publisher."""
    b = serve(brokers, tmp_path, f'[bridges.cloud]\naddress = ["127.0.0.1:{mosquitto.port}"]\n'
              f'out = [{{filter = "data/#"{", " + rule if rule else ""}}}]\n')
    bridged(b)
    watcher(mosquitto.port, "site1/#" if "site1" in rule else "data/#", qos).disconnect()
    mosquitto.stop()
    wait_for(lambda: "bridge cloud: remote down" in b.output(), 30, "the bridge to see the remote gone")
    publisher = Client(b.port, "publisher")
    for i in range(count):
        publisher.publish("data/x", str(i), qos=qos)
    return b, publisher


def test_the_remote_stopped_and_back_gets_every_message_in_order(tmp_path: Path, mosquitto: Mosquitto,
                                                                 brokers: list[Broker]) -> None:
    """1,100 QoS 1 messages acknowledged locally while the remote is down (more than the bridge holds
    at once, 1,000: its session's window, above max_inflight; the rest wait in its session on the
    router, as `plexmq bridges`, /metrics and $SYS say) all reach it, in order, once it is back."""
    b, _publisher = queued_while_remote_down(tmp_path, mosquitto, brokers, 'prefix = "site1/"', 1100)
    assert listed(tmp_path, ["100", "1000", "0", "0", "0"])[8:10] == ["remote", "down:"]
    scraped = urllib.request.urlopen(metrics_url(b) + "/metrics", timeout=10).read().decode()
    assert 'plexmq_bridge_queued_messages{bridge="cloud"} 100.0' in scraped
    assert 'plexmq_bridge_connected{bridge="cloud"} 0.0' in scraped
    operator = Client(b.port, "operator")
    operator.subscribe("$SYS/broker/bridges/#")
    figures: dict[str, str] = {}

    def said() -> bool:  # the latest figures, as $SYS publishes them each sys_interval
        message = operator.get(timeout=10)
        figures[message.topic] = message.payload.decode()
        return len(figures) == 5 and figures["$SYS/broker/bridges/cloud/state"].startswith("remote down: ") and \
            figures["$SYS/broker/bridges/cloud/queued"] == "100"
    wait_for(said, 30, "$SYS to say the remote down with 100 queued")
    assert {topic: figures[f"$SYS/broker/bridges/cloud/{topic}"] for topic in ("sent", "received", "dropped")} \
        == {"sent": "0", "received": "0", "dropped": "0"}
    mosquitto.start()
    assert received(watcher(mosquitto.port, "site1/#"), 1100) == [str(i) for i in range(1100)]


def test_qos_2_both_ways_through_a_mosquitto_restarted_arrives_exactly_once(tmp_path: Path, mosquitto: Mosquitto,
                                                                             brokers: list[Broker]) -> None:
    """QoS 2 rules: 50 messages acknowledged locally while the remote is down reach it once each, in order,
    at QoS 2 when it is back; one published there at QoS 2 comes in at QoS 2."""
    b, _publisher = queued_while_remote_down(tmp_path, mosquitto, brokers, "qos = 2", 50, qos=2)
    mosquitto.start()
    remote = watcher(mosquitto.port, "data/#", 2)
    got = [remote.get(timeout=30) for _ in range(50)]
    assert [(m.payload.decode(), m.qos) for m in got] == [(str(i), 2) for i in range(50)]
    assert remote.nothing(1.0)
    assert listed(tmp_path, ["0", "0", "50", "0", "0"])[-1] == "connected"


class Accepted(RawClient):
    """The remote broker's end of a bridge's connection, played by the test byte by byte."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf = sock, b""

    def log_in(self, session_present: bool) -> None:
        first, _body = self.recv(30)
        assert first == 0x10, f"expected CONNECT, got {first:#x}"
        self.send(p4.encode_connack(session_present, 0))

    def next(self, kind: int) -> bytes:
        """The body of the next packet of type `kind`, past PINGREQs; AssertionError on any other."""
        while True:
            first, body = self.recv(30)
            if first != 0xC0:
                assert first >> 4 == kind, f"expected packet type {kind}, got {first:#x}"
                return body


def test_qos_2_stays_exactly_once_across_reconnects(tmp_path: Path, brokers: list[Broker]) -> None:
    """A remote played by the test: the link dies after its PUBREC and the bridge's PUBREL; back with its
    session, it gets the PUBREL again, not the PUBLISH. Inbound, a PUBLISH the remote sends again after
    the bridge's PUBREC (lost with the link) gets the PUBREC again and is not passed on twice."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(30)
    b = serve(brokers, tmp_path, f'[bridges.cloud]\naddress = ["127.0.0.1:{server.getsockname()[1]}"]\n'
              'protocol = "3.1.1"\nout = [{filter = "data/#", qos = 2}]\nin = [{filter = "cmd/#", qos = 2}]\n')
    first = Accepted(server.accept()[0])
    first.log_in(False)
    first.next(8)  # the bridge's SUBSCRIBE to cmd/#
    first.send(p4.encode_suback(1, [2]))
    bridged(b)
    local = Client(b.port, "local-sub")
    local.subscribe("cmd/#", 2)
    Client(b.port, "publisher").publish("data/x", b"one", qos=2)
    topic, packet_id, payload = p4.decode_publish(0x04, first.next(3))
    assert (topic, payload) == ("data/x", b"one")
    first.send(p4.encode_pubrec(packet_id))
    assert p4.decode_packet_id(2, first.next(6), 2) == packet_id  # PUBREL
    first.send(p4.encode_publish(b"cmd/valve", b"open", 2, packet_id=7))
    assert p4.decode_packet_id(0, first.next(5), 0) == 7  # PUBREC: passed on here
    first.close()  # no PUBCOMP, no PUBREL
    again = Accepted(server.accept()[0])
    again.log_in(True)
    again.next(8)
    again.send(p4.encode_suback(1, [2]))
    assert p4.decode_packet_id(2, again.next(6), 2) == packet_id  # the PUBREL again, not the PUBLISH
    again.send(p4.encode_pubcomp(packet_id))
    again.send(p4.encode_publish(b"cmd/valve", b"open", 2, dup=True, packet_id=7))  # its PUBREC was "lost"
    assert p4.decode_packet_id(0, again.next(5), 0) == 7
    again.send(p4.encode_pubrel(7))
    assert p4.decode_packet_id(0, again.next(7), 0) == 7  # PUBCOMP
    Client(b.port, "publisher").publish("data/x", b"two", qos=2)
    assert p4.decode_publish(0x04, again.next(3))[2] == b"two"  # not "one" again
    message = local.get(timeout=10)
    assert (message.topic, message.payload, message.qos) == ("cmd/valve", b"open", 2)
    assert local.nothing(1.0)
    again.close()
    server.close()


def test_kill_9_of_the_bridge_and_the_router_loses_nothing_acknowledged(tmp_path: Path, mosquitto: Mosquitto,
                                                                        brokers: list[Broker]) -> None:
    b, publisher = queued_while_remote_down(tmp_path, mosquitto, brokers, "", 200)
    bridge_process(b).kill()
    wait_for(lambda: b.output().count("bridge cloud: local up") >= 2, 30, "the bridge restarted")
    router = b.router()
    assert router is not None
    router.send_signal(signal.SIGKILL)
    wait_for(lambda: b.output().count("router started (pid") >= 2, 30, "the router restarted")
    publisher.publish("data/x", "200", qos=1)  # acknowledged by the new router
    mosquitto.start()
    remote = watcher(mosquitto.port, "data/#")
    got: dict[str, None] = {}  # each once at least, in order of first arrival (a message resent may repeat)
    while len(got) < 201:
        got[remote.get(timeout=30).payload.decode()] = None
    assert list(got) == [str(i) for i in range(201)]


def test_two_plexmq_bridged_both_ways_do_not_echo(tmp_path: Path, brokers: list[Broker]) -> None:
    """No Local on both sides: what the bridge publishes on one broker never comes back to it."""
    remote = serve(brokers, tmp_path, "", "b")
    b = serve(brokers, tmp_path, f'[bridges.peer]\naddress = ["127.0.0.1:{remote.port}"]\n'
              'out = [{filter = "t/#"}]\nin = [{filter = "t/#"}]\n')
    bridged(b, "peer")
    here, there = Client(b.port, "here"), Client(remote.port, "there")
    here.subscribe("t/#", 1)
    there.subscribe("t/#", 1)
    Client(b.port, "pub-here").publish("t/a", b"from a", qos=1)
    Client(remote.port, "pub-there").publish("t/b", b"from b", qos=1)
    assert sorted(m.payload for m in (here.get(), here.get())) == [b"from a", b"from b"]
    assert sorted(m.payload for m in (there.get(), there.get())) == [b"from a", b"from b"]
    assert here.nothing(1.0) and there.nothing(0.2)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl tool is not installed")
def test_tls_with_a_client_certificate(tmp_path: Path, brokers: list[Broker]) -> None:
    """A mosquitto that requires a client certificate: the bridge with one in its [tls] table gets
    through (its CA checked, the server name verified), one without is refused and says so."""
    pki = make_pki(tmp_path)
    remote = Mosquitto(tmp_path, f"cafile {pki.ca}\ncertfile {pki.server_cert}\nkeyfile {pki.server_key}\n"
                                 "require_certificate true\n")
    try:
        tls = f'cafile = "{pki.ca}"\nserver_name = "localhost"\n'
        b = serve(brokers, tmp_path, f'[bridges.cloud]\naddress = ["127.0.0.1:{remote.port}"]\n'
                  'out = [{filter = "data/#"}]\n[bridges.cloud.tls]\n' + tls +
                  f'certfile = "{pki.client_cert}"\nkeyfile = "{pki.client_key}"\n'
                  f'[bridges.bare]\naddress = ["127.0.0.1:{remote.port}"]\nout = [{{filter = "x/#"}}]\n'
                  '[bridges.bare.tls]\n' + tls)
        bridged(b)
        wait_for(lambda: "bridge bare: remote down" in b.output(), 30, "the bridge without a certificate refused")
        subscriber = Client(remote.port, "tls-sub", tls=pki.tls(client=True))
        subscriber.subscribe("data/#", 1)
        Client(b.port, "publisher").publish("data/secure", b"sealed", qos=1)
        assert subscriber.get(timeout=10).payload == b"sealed"
    finally:
        remote.stop()


ERRORS = [
    ('[bridges.cloud]\nout = [{filter = "a/#"}]\n', "needs address", 1),
    ('[bridges.cloud]\naddress = ["h:1883"]\n', "needs an out or in rule", 1),
    ('port = 1\n[bridges.cloud]\naddress = ["nohost"]\nout = [{filter = "a/#"}]\n', "bridges.cloud.address", 3),
    ('[bridges.cloud]\naddress = ["h:1883"]\n\nout = [{filter = "a/#", qos = 3}]\n', "bridges.cloud.out[0]': qos", 4),
    ('[bridges.cloud]\naddress = ["h:1883"]\nin = [{filter = "a/#"}, {filter = "a/+x"}]\n', "in[1]': filter", 3),
    ('[bridges.cloud]\naddress = ["h:1883"]\nout = [{filter = "a/#", strip = "b/"}]\n', "strip 'b/'", 3),
    ('[bridges.cloud]\naddress = ["h:1883"]\nout = [{filter = "a/#", rewrite = "a"}]\n', "rewrite must be", 3),
    ('[bridges.cloud]\naddress = ["h:1883"]\nout = [{filter = "a/#", pefix = "x/"}]\n', "unknown key 'pefix'", 3),
    ('[bridges.cloud]\naddress = ["h:1883"]\nprotocol = "3"\nout = [{filter = "a/#"}]\n', "bridges.cloud.protocol", 3),
    ('[bridges.cloud]\naddress = ["h:1883"]\nout = [{filter = "a/#"}]\ntenant = "acme"\n', "no tenant 'acme'", 4),
    ('[bridges.cloud]\naddress = ["h:1883"]\nout = [{filter = "a/#"}]\n[bridges.cloud.tls]\ncafile = "/nonexistent"\n',
     "[bridges.cloud.tls]", 4),
    ('[bridges.cloud]\naddress = ["h:1883"]\nout = [{filter = "a/#"}]\n[bridges.cloud.tls]\nca = "x"\n',
     "unknown key 'bridges.cloud.tls.ca'", 5),
    ('[bridges."a b"]\naddress = ["h:1883"]\n', "bridge name 'a b'", 1),
]


@pytest.mark.parametrize("text,said,line", ERRORS)
def test_config_errors_name_file_line_and_key(tmp_path: Path, text: str, said: str, line: int) -> None:
    path = write(tmp_path, text)
    with pytest.raises(cfg.ConfigError) as err:
        cfg.load(str(path), {})
    message = str(err.value)
    assert said in message, message
    assert names_line(message, path, line), f"line {line} not named: {message}"


def test_rules_map_topics() -> None:
    out = (parse({"filter": "sensors/#", "rewrite": "sensors/=site1/s/"}), parse({"filter": "#", "prefix": "all/"}))
    assert [first(out, topic).topic(topic) for topic in ("sensors/a/b", "other")] == ["site1/s/a/b", "all/other"]  # type: ignore[union-attr]
    assert first((parse({"filter": "x/#", "strip": "x/"}),), "x/") is None  # nothing left of the topic



def test_a_link_takes_a_read_s_packets_in_one_await_and_leaves_what_follows_the_connack() -> None:
    """A peer that answers CONNECT with CONNACK and two PUBLISHes in one write (a kept session's queue):
    the CONNACK logs in, both PUBLISHes come from the next `packets` together."""
    async def run() -> list[tuple[int, int, bytes]]:
        async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(1024)  # the CONNECT
            writer.write(p4.encode_connack(True, 0) + p4.encode_publish(b"a", b"1", 1, False, False, 1)
                         + p4.encode_publish(b"b", b"2", 1, False, False, 2))
            await reader.read(1024)  # until the link closes

        server = await asyncio.start_server(peer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        link = await Link.open("127.0.0.1", port, Login("t", 4, False, 0))
        try:
            assert link.session_present
            return await asyncio.wait_for(link.packets(), 10)
        finally:
            link.close()
            server.close()

    assert [(kind, p4.decode_publish(flags, body)) for kind, flags, body in asyncio.run(run())] == \
        [(PUBLISH, ("a", 1, b"1")), (PUBLISH, ("b", 2, b"2"))]


def test_a_flow_maps_each_topic_by_its_rule_and_remembers_a_bounded_number() -> None:
    """More topics than a flow remembers (MAPPED), each sent on under its rule's topic, over a real
    socket pair (Link); one no rule fits is dropped."""
    topics = [f"s/{i}" for i in range(MAPPED + 10)] + ["other"]

    async def run() -> tuple[list[str], Flow]:
        near, far = socket.socketpair()
        link = Link(*await asyncio.open_connection(sock=near), 4, 0)
        flow = Flow("t", (parse({"filter": "s/#", "rewrite": "s/=site/"}),))
        flow.destination_up(link)
        for topic in topics:
            flow.take(0, 0, topic, b"x", {})
        link.close()
        await link.writer.wait_closed()
        data = bytearray()
        while chunk := far.recv(1 << 16):
            data += chunk
        far.close()
        sent, pos = [], 0
        while (found := frame(data, pos, 1 << 20)) is not None:
            first_byte, start, pos = found
            sent.append(p4.decode_publish(first_byte & 0x0F, bytes(data[start:pos]))[0])
        return sent, flow

    sent, flow = asyncio.run(run())
    assert sent == [f"site/{i}" for i in range(MAPPED + 10)] and flow.dropped == 1 and len(flow.mapped) <= MAPPED


def test_the_readme_example_runs_as_printed(tmp_path: Path, mosquitto: Mosquitto, brokers: list[Broker]) -> None:
    """README's Bridges config and commands, with free ports for 1884 (mosquitto) and 1883 (plexmq); the
    message is retained, so the subscriber gets it whether it subscribed before or after."""
    readme = (ROOT / "README.md").read_text().split("## Bridges", 1)[1]
    config, commands = re.findall(r"```(?:toml|sh)\n(.*?)```", readme, re.DOTALL)[:2]
    b = serve(brokers, tmp_path, config.replace(":1884", f":{mosquitto.port}"))
    bridged(b)
    lines = [shlex.split(line, comments=True) for line in commands.splitlines()]
    assert lines[0][:3] == ["mosquitto", "-p", "1884"] and lines[1][:2] == ["plexmq", "serve"]
    ports = {"1884": str(mosquitto.port), "1883": str(b.port)}
    sub, pub = ([ports.get(arg, arg) for arg in line if arg != "&"] for line in lines[2:4])
    watching = subprocess.Popen([*sub, "-C", "1", "-W", "30"], stdout=subprocess.PIPE, text=True)
    subprocess.run(pub, check=True, timeout=30)
    assert watching.communicate(timeout=40)[0] == "site1/sensors/t 21.5\n"


def bridge_table(name: str, port: int, prefix: str) -> str:
    return (f'[bridges.{name}]\naddress = ["127.0.0.1:{port}"]\nclient_id = "{name}-id"\n'
            f'out = [{{filter = "data/#", prefix = "{prefix}/"}}]\n')


def reload_broker(b: Broker) -> None:
    """`plexmq reload --pid`."""
    reloaded = subprocess.run([sys.executable, "-m", "plexmq.acceptor", "reload", "--pid", str(b.proc.pid)],
                              cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert reloaded.returncode == 0, reloaded.stderr


def test_a_reload_adds_changes_and_removes_one_bridge_leaving_the_others_connected(tmp_path: Path,
                                                                                   brokers: list[Broker]) -> None:
    """Bridge `keep` keeps its connections (mosquitto saw its client id connect once, plexmq's log says
    it came up once) while a reload changes `change`, removes `gone` and adds `added`."""
    remote = Mosquitto(tmp_path, "log_type notice\n")  # "New client connected ... as ID" lines
    try:
        b = serve(brokers, tmp_path, bridge_table("keep", remote.port, "keep") +
                  bridge_table("change", remote.port, "old") + bridge_table("gone", remote.port, "gone"))
        for name in ("keep", "change", "gone"):
            bridged(b, name)
        write(tmp_path, f'run_dir = "{tmp_path / "a-run"}"\n' + bridge_table("keep", remote.port, "keep") +
              bridge_table("change", remote.port, "new") + bridge_table("added", remote.port, "added"), "a.toml")
        reload_broker(b)
        wait_for(lambda: "changed: bridges.added (added), bridges.change (changed), bridges.gone (removed)" in b.output(),
                 10, "the reload line")
        bridged(b, "added")
        bridged(b, "change", 2)
        assert "bridge gone stopped: removed by a reload" in b.output()
        subscriber = Client(remote.port, "sub")
        subscriber.subscribe("+/data/#", 1)
        Client(b.port, "publisher").publish("data/x", b"1", qos=1)
        assert sorted(subscriber.get(timeout=10).topic for _ in range(3)) == ["added/data/x", "keep/data/x", "new/data/x"]
        assert subscriber.nothing(1.0)
        assert [b.output().count(f"bridge keep: {side} up") for side in ("local", "remote")] == [1, 1]
        assert remote.log.read_text().count(" as keep-id ") == 1
    finally:
        remote.stop()


def test_a_reload_adds_the_first_bridge(tmp_path: Path, mosquitto: Mosquitto, brokers: list[Broker]) -> None:
    """A broker started without bridges starts the bridge process when a reload declares one."""
    b = serve(brokers, tmp_path, "")
    wait_for(lambda: b.output().count(" ready (pid ") == 1, 20, "the worker to be ready")
    write(tmp_path, f'run_dir = "{tmp_path / "a-run"}"\n' + bridge_table("cloud", mosquitto.port, "site1"), "a.toml")
    reload_broker(b)
    bridged(b)
    subscriber = watcher(mosquitto.port, "site1/#")
    Client(b.port, "publisher").publish("data/x", b"1", qos=1)
    assert subscriber.get(timeout=10).topic == "site1/data/x"
