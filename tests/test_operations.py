"""Operations: $SYS topics and the Prometheus endpoint, checked against known traffic."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as paho
import psutil
import pytest

from plexmq.acceptor.reload import own_brokers
from plexmq.acceptor.status import scrape
from plexmq.mqtt import properties as P
from plexmq.mqtt import v4 as p
from plexmq.mqtt import v5
from tests.cli import cli, health, metrics_url, one_error_line, run
from tests.conftest import ROOT, Broker, wait_for
from tests.mqtt import Client, RawClient
from tests.steps import uid
from tests.users import as_nobody


def test_sys_topics_and_metrics_count_known_traffic(tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    config = tmp_path / "plexmq.toml"
    config.write_text("sys_interval = 1\n")
    b = start_broker("--workers", "2", "--config", str(config))
    topic = f"ops/{uid()}"
    sub, pub = Client(b.port, f"ops-sub-{uid()}"), Client(b.port, f"ops-pub-{uid()}")
    sub.subscribe(topic, 1)
    for i in range(25):
        pub.publish(topic, b"%d" % i, qos=1)
    for _ in range(25):
        sub.get()
    pub.publish(f"{topic}/kept", b"r", retain=True, qos=1)
    url = metrics_url(b)  # exact counts first, before a $SYS watcher adds its own deliveries
    def counted() -> dict | None:
        values = scrape(url)
        clients = sum(v for (name, _), v in values.items() if name == "plexmq_clients_connected")
        wanted = {("plexmq_messages_received_total", ()): 26, ("plexmq_messages_sent_total", ()): 25,
                  ("plexmq_subscriptions", ()): 1}
        return values if clients == 2 and all(values.get(k) == v for k, v in wanted.items()) else None

    values = wait_for(counted, 10, "the metrics to count the traffic")
    assert values[("plexmq_router_batch_frames_count", ())] > 0 < values[("plexmq_router_turn_seconds_count", ())]
    processes = {dict(labels)["process"] for (name, labels) in values if name == "plexmq_process_rss_bytes"}
    assert processes == {"acceptor", "router", "worker-0", "worker-1"}
    wait_for(lambda: health(url) == 200, 10, "/health to answer 200")

    watcher = Client(b.port, f"ops-sys-{uid()}")
    watcher.subscribe("$SYS/broker/#")
    expected = {"messages/received": "26", "clients/connected": "3", "subscriptions/count": "2"}
    seen: dict[str, str] = {}

    def settled() -> bool:
        while not watcher.messages.empty():
            msg = watcher.get()
            seen[msg.topic.removeprefix("$SYS/broker/")] = msg.payload.decode()
        per_worker = sum(int(seen.get(f"workers/{w}/clients/connected", 0)) for w in (0, 1))
        return per_worker == 3 and all(seen.get(k) == v for k, v in expected.items())

    try:
        wait_for(settled, 15, "$SYS to show the traffic")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; $SYS said {seen}") from None
    assert seen["version"].startswith("plexmq ") and seen["uptime"].endswith(" seconds")
    assert int(seen["messages/sent"]) >= 25  # and the $SYS messages the watcher got
    assert seen["retained messages/count"] == "1"  # ours: the $SYS figures are made for a new subscriber, not kept
    assert "load/messages/received/1min" in seen and int(seen["workers/0/rss"]) > 1 << 20
    for c in (sub, pub, watcher):
        c.disconnect()


def test_health_fails_when_a_worker_stops_reporting(tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    b = start_broker("--workers", "1")
    url = metrics_url(b)
    wait_for(lambda: health(url) == 200, 15, "/health to answer 200")
    worker = b.workers()[0]
    worker.suspend()  # alive but silent
    try:
        wait_for(lambda: health(url) == 503, 15, "/health to answer 503")
    finally:
        worker.resume()
    wait_for(lambda: health(url) == 200, 15, "/health to recover")


def test_status_prints_the_processes(start_broker: Callable[..., Broker]) -> None:
    b = start_broker("--workers", "2")
    url = metrics_url(b)
    clients = [Client(b.port, f"ops-st-{uid()}") for _ in range(3)]

    def table() -> str | None:
        out = cli("status", url, "--once")
        return out if "clients 3 " in out else None

    text = wait_for(table, 10, "status to show 3 clients")
    rows = {line.split()[0]: line.split() for line in text.splitlines()[1:-1]}
    assert set(rows) == {"acceptor", "router", "worker-0", "worker-1"}
    assert rows["router"][1] == str(b.router().pid)  # type: ignore[union-attr]  # the router is up
    for c in clients:
        c.disconnect()


@pytest.mark.parametrize("option", ["metrics_port", "console_port"])
def test_a_metrics_or_console_port_in_use_stops_startup_with_one_line(tmp_path: Path, option: str) -> None:
    """Not a broker that runs on without them while `plexmq status` on that port reads another one."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = {"metrics_port": "0", "console_port": "-1", option: str(port)}
        result = run("serve", "--port", "0", "--data-dir", str(tmp_path / "data"),
                     "--metrics-port", ports["metrics_port"], "--console-port", ports["console_port"])
    assert result.returncode == 1 and result.stderr.splitlines() == [
        f"plexmq: cannot listen on 127.0.0.1:{port} ({option}): Address already in use"], result.stderr


def test_json_log_format(start_broker: Callable[..., Broker]) -> None:
    b = start_broker("--workers", "1", "--log-format", "json", "--log-level", "debug")
    c = Client(b.port, f"ops-json-{uid()}")
    c.disconnect()
    wait_for(lambda: "ops-json-" in b.output(), 10, "the client's lines")
    entries = [json.loads(line) for line in b.output().splitlines() if line]
    assert {"time", "level", "process", "pid", "message"} <= entries[0].keys()
    assert any(e["message"].startswith("plexmq listening on ") for e in entries)


def test_sighup_rereads_the_config_file_and_keeps_clients(tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    config = tmp_path / "plexmq.toml"
    config.write_text('log_level = "info"\nmax_connections = 0\n')
    b = start_broker("--workers", "2", "--config", str(config))
    c = Client(b.port, f"ops-hup-{uid()}")
    c.subscribe("ops/hup", 1)
    config.write_text('log_level = "debug"\nmax_connections = 2\nsync = "full"\n')  # sync: only a restart changes it
    wait_for(lambda: b.output().count(" ready (pid ") == 2, 20, "both workers to be ready")  # a reload reaches running ones
    b.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "changed: log_level, max_connections; needs a restart: sync" in b.output(), 10, "the reload line")
    wait_for(lambda: b.output().count("reloaded its settings") == 3, 10, "router and workers to apply it")
    c.publish("ops/hup", b"still here", qos=1)  # the client stayed connected
    assert c.get().payload == b"still here"
    second = Client(b.port, f"ops-hup-{uid()}")
    try:
        Client(b.port, f"ops-hup-{uid()}")  # the third: max_connections = 2 now holds
    except Exception:
        pass
    else:
        raise AssertionError("a third connection was served with max_connections = 2")
    config.write_text("max_connections = bogus\n")
    reload = subprocess.run([sys.executable, "-m", "plexmq.acceptor", "reload", "--pid", str(b.proc.pid)],
                            cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert reload.returncode == 0, reload.stderr
    wait_for(lambda: "config not reloaded" in b.output(), 10, "the bad file refused")
    for client in (c, second):
        client.disconnect()


@pytest.mark.skipif(os.geteuid() != 0, reason="a broker of another user needs root to start one")
def test_reload_signals_only_a_broker_of_its_own_user(start_broker: Callable[..., Broker]) -> None:
    """`plexmq reload` as nobody finds nobody's broker only, never root's, and says which it signalled."""
    b = start_broker("--workers", "1")
    # nobody cannot run this Python (it lives under /root): a process that looks like `plexmq -f ...`
    theirs = subprocess.Popen(["runuser", "-u", "nobody", "--", "bash", "-c", "exec -a plexmq tail -f /dev/null"])

    def nobodys() -> list[psutil.Process]:
        return [p for p in psutil.process_iter(["username", "cmdline"])
                if p.info["username"] == "nobody" and (p.info["cmdline"] or [])[:1] == ["plexmq"]]
    try:
        (fake,) = wait_for(nobodys, 10, "nobody's broker")
        said = as_nobody("reload")
        assert said.returncode == 0, said.stderr
        assert said.stdout.startswith(f"sent SIGHUP to plexmq (pid {fake.pid}: plexmq -f /dev/null)")
        assert "SIGHUP" not in b.output()
    finally:
        theirs.kill()
        for p in nobodys():
            p.kill()
        theirs.wait()


def test_reload_finds_the_brokers_main_process_and_refuses_any_other_pid(start_broker: Callable[..., Broker]) -> None:
    """The workers are forked from the acceptor with its command line: they are not brokers to count,
    and neither they, the router nor any other program may get a reload's SIGHUP (it kills a `sleep`)."""
    b = start_broker("--workers", "2")
    workers = {proc.pid for proc in b.workers().values()}
    found = own_brokers()
    assert b.proc.pid in found and not workers & set(found), f"broker {b.proc.pid}, workers {workers}: found {found}"
    router = b.router()
    assert router is not None
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        for pid, what in ((sleeper.pid, "sleep 60"), (min(workers), "a worker of a broker"),
                          (router.pid, " ".join(router.cmdline()))):
            said = one_error_line(run("reload", "--pid", str(pid)))
            assert said == f"plexmq reload: pid {pid}: not a plexmq broker's main process: {what}"
        assert sleeper.poll() is None, "the sleep got a SIGHUP"
    finally:
        sleeper.kill()
        sleeper.wait()
    assert {proc.pid for proc in b.workers().values()} == workers and "SIGHUP" not in b.output()


def test_a_worker_starting_during_a_reload_applies_it(tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    """The SIGHUP may reach a restarted worker before it listens for it: it must still apply the file."""
    config = tmp_path / "plexmq.toml"
    config.write_text("max_packet_size = 65536\n")
    b = start_broker("--workers", "1", "--config", str(config))
    old = b.workers()[0].pid
    b.workers()[0].send_signal(signal.SIGKILL)
    started = wait_for(lambda: re.search(rf"worker 0 started \(pid (?!{old}\b)(\d+)\)", b.output()), 10, "the new worker")
    config.write_text("max_packet_size = 1000\n")  # signalled while the new worker may still be starting
    b.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "changed: max_packet_size" in b.output(), 10, "the reload line")
    # by its handler, or at its start when the signal came before the handler (`missed_reload`)
    wait_for(lambda: f"worker-0[{started.group(1)}]: worker 0 reloaded its settings" in b.output(), 20,
             "the new worker to apply the reload")
    raw = RawClient(b.port)
    raw.connect(f"ops-late-{uid()}")
    raw.send(p.encode_publish(b"ops/late", b"x" * 2000))
    raw.read_until_closed()  # above the reloaded max_packet_size
    wait_for(lambda: "exceeds the maximum of 1000" in b.output(), 10, "the oversize packet logged")

def test_clients_lists_who_is_connected(start_broker: Callable[..., Broker]) -> None:
    b = start_broker("--workers", "2")
    url = metrics_url(b)
    tag = uid()
    clients = [Client(b.port, f"ops-list-{tag}-{i}", keepalive=30) for i in range(5)] + [Client(b.port, "other")]

    first = cli("clients", url, "--filter", f"ops-list-{tag}", "--per-page", "3")
    rows = first.splitlines()[1:-1]
    assert [r.split()[0] for r in rows] == [f"ops-list-{tag}-{i}" for i in range(3)]
    assert all(r.split()[3] == "30" for r in rows) and first.splitlines()[-1] == "page 1 of 2, 5 clients"
    assert {r.split()[1] for r in cli("clients", url, "--filter", f"ops-list-{tag}").splitlines()[1:-1]} == {"0", "1"}
    for c in clients:
        c.disconnect()


@pytest.mark.skipif(shutil.which("mosquitto_sub") is None, reason="mosquitto-clients not installed")
def test_clients_by_protocol_version(tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    """One client of each version (paho 3.1.1 and 5.0, mosquitto_sub 3.1 and 5.0): $SYS, /metrics,
    `plexmq status` and `plexmq clients` count and name each one's version."""
    config = tmp_path / "plexmq.toml"
    config.write_text("sys_interval = 1\n")
    b = start_broker("--workers", "2", "--config", str(config))
    url = metrics_url(b)
    tag = uid()
    watcher = Client(b.port, f"ops-v311-{tag}")  # 3.1.1, and it reads the $SYS topics
    watcher.subscribe("$SYS/broker/clients/protocol/#")
    five = Client(b.port, f"ops-v5-{tag}", protocol=paho.MQTTv5)
    subs = [subprocess.Popen(["mosquitto_sub", "-h", "127.0.0.1", "-p", str(b.port), "-V", version, "-i",
                              f"ops-{name}-{tag}", "-t", f"ops/{tag}"], stdout=subprocess.DEVNULL)
            for version, name in (("mqttv31", "v31"), ("5", "m5"))]
    try:
        expected = {f"ops-v311-{tag}": "3.1.1", f"ops-v5-{tag}": "5.0", f"ops-v31-{tag}": "3.1", f"ops-m5-{tag}": "5.0"}

        def versions() -> dict[str, str] | None:
            rows = {r.split()[0]: r.split()[-2] for r in cli("clients", url, "--filter", tag).splitlines()[1:-1]}
            return rows if len(rows) == 4 else None

        assert wait_for(versions, 10, "plexmq clients to list all four") == expected
        assert [r.split()[0] for r in cli("clients", url, "--filter", tag, "--protocol", "5.0").splitlines()[1:-1]] \
            == sorted([f"ops-m5-{tag}", f"ops-v5-{tag}"])
        assert cli("clients", url).splitlines()[0].split()[-2:] == ["protocol", "tenant"]

        def metrics(counts: dict[str, float]) -> Callable[[], bool]:
            return lambda: {dict(labels)["protocol"]: value for (name, labels), value in scrape(url).items()
                            if name == "plexmq_clients_protocol"} == counts

        wait_for(metrics({"3.1": 1, "3.1.1": 1, "5.0": 2}), 10, "/metrics to count each version")
        wait_for(lambda: "clients 4 (3.1: 1, 3.1.1: 1, 5.0: 2) " in cli("status", url, "--once"), 10,
                 "status to count each version")
        seen: dict[str, str] = {}

        def published() -> bool:
            while not watcher.messages.empty():
                msg = watcher.get()
                seen[msg.topic.removeprefix("$SYS/broker/clients/protocol/")] = msg.payload.decode()
            return seen == {"3.1": "1", "3.1.1": "1", "5.0": "2"}

        try:
            wait_for(published, 15, "$SYS to count each version")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; $SYS said {seen}") from None
        five.disconnect()  # counted from the live connections: it leaves the count with them
        wait_for(metrics({"3.1": 1, "3.1.1": 1, "5.0": 1}), 10, "/metrics to count the 5.0 client gone")
    finally:
        for proc in subs:
            proc.terminate()
            proc.wait(5)
    watcher.disconnect()


def test_an_administrator_disconnects_a_client_which_keeps_its_session_and_sends_its_will(
        start_broker: Callable[..., Broker]) -> None:
    b = start_broker("--workers", "2")
    url = metrics_url(b)
    topic, client_id = f"ops/admin/{uid()}", f"ops-admin-{uid()}"
    watcher = Client(b.port)
    assert watcher.subscribe(f"{topic}/#", 1) == [1]
    target = RawClient(b.port)
    will = v5.Will(f"{topic}/will", b"closed by admin", 1, False)
    assert target.connect5(client_id, properties={P.SESSION_EXPIRY_INTERVAL: 600}, will=will)[1] == 0
    assert cli("clients", url, "--disconnect", client_id).strip() == f"disconnected {client_id}"
    data = target.read_until_closed()  # a DISCONNECT 0x98 with its reason, then the close
    found = v5.frame(data, 0, len(data) + 1)
    assert found is not None and found[0] == 0xE0
    code, props = v5.decode_reason_only(v5.DISCONNECT, 0, data[found[1]:found[2]])
    assert code == 0x98 and props[P.REASON_STRING] == "disconnected by an administrator"
    assert watcher.get().payload == b"closed by admin"
    again = RawClient(b.port)
    assert again.connect5(client_id, clean_start=False)[0] is True  # the session stayed
    again.send(v5.encode_disconnect())
    again.read_until_closed()
    out = subprocess.run([sys.executable, "-m", "plexmq.acceptor", "clients", "--metrics", url, "--disconnect", client_id],
                         cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and out.stderr.strip() == f"plexmq clients: {client_id} is not connected"
    watcher.disconnect()
