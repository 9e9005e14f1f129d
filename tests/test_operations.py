"""Operations: $SYS topics and the Prometheus endpoint, checked against known traffic."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from acceptor.status import scrape
from tests.conftest import ROOT, Broker, wait_for
from workers.mqtt import v4 as p
from tests.mqtt import Client, RawClient
from tests.steps import uid


def metrics_url(b: Broker) -> str:
    found = wait_for(lambda: re.search(r"metrics on (http://\S+)/metrics", b.output()), 10, "the metrics line")
    return found.group(1)  # type: ignore[union-attr]


def health(url: str) -> int:
    try:
        return urllib.request.urlopen(url + "/health", timeout=5).status
    except urllib.error.HTTPError as exc:
        return exc.code


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
    assert values[("plexmq_router_batch_frames_count", ())] > 0 < values[("plexmq_router_turn_seconds_count", ())]  # type: ignore[index]
    processes = {dict(labels)["process"] for (name, labels) in values if name == "plexmq_process_rss_bytes"}  # type: ignore[union-attr]
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
    assert int(seen["retained messages/count"]) >= 2  # ours plus the $SYS topics themselves
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
        out = subprocess.run([sys.executable, "-m", "acceptor", "status", "--metrics", url, "--once"],
                             cwd=ROOT, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return out.stdout if "clients 3 " in out.stdout else None

    text = wait_for(table, 10, "status to show 3 clients")
    rows = {line.split()[0]: line.split() for line in text.splitlines()[1:-1]}  # type: ignore[union-attr]
    assert set(rows) == {"acceptor", "router", "worker-0", "worker-1"}
    assert rows["router"][1] == str(b.router().pid)  # type: ignore[union-attr]
    for c in clients:
        c.disconnect()


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
    reload = subprocess.run([sys.executable, "-m", "acceptor", "reload", "--pid", str(b.proc.pid)],
                            cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert reload.returncode == 0, reload.stderr
    wait_for(lambda: "config not reloaded" in b.output(), 10, "the bad file refused")
    for client in (c, second):
        client.disconnect()



def test_a_worker_starting_during_a_reload_applies_it(tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    """The SIGHUP may reach a restarted worker before it listens for it: it must still apply the file."""
    config = tmp_path / "plexmq.toml"
    config.write_text("max_packet_size = 65536\n")
    b = start_broker("--workers", "1", "--config", str(config))
    old = b.workers()[0].pid
    b.workers()[0].send_signal(signal.SIGKILL)
    wait_for(lambda: re.search(rf"worker 0 started \(pid (?!{old}\b)\d+\)", b.output()), 10, "the new worker")
    config.write_text("max_packet_size = 1000\n")  # signalled while the new worker is still starting
    b.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "changed: max_packet_size" in b.output(), 10, "the reload line")
    wait_for(lambda: b.output().count(" ready (pid ") == 2, 20, "the new worker to be ready")
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

    def listed(*args: str) -> str:
        out = subprocess.run([sys.executable, "-m", "acceptor", "clients", "--metrics", url, *args],
                             cwd=ROOT, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return out.stdout

    first = listed("--filter", f"ops-list-{tag}", "--per-page", "3")
    rows = first.splitlines()[1:-1]
    assert [r.split()[0] for r in rows] == [f"ops-list-{tag}-{i}" for i in range(3)]
    assert all(r.split()[3] == "30" for r in rows) and first.splitlines()[-1] == "page 1 of 2, 5 clients"
    assert {r.split()[1] for r in listed("--filter", f"ops-list-{tag}").splitlines()[1:-1]} == {"0", "1"}
    for c in clients:
        c.disconnect()
