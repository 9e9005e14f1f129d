"""Tenants changed live (SIGHUP), on the real broker: a tenant added is served at once (its listeners
bound), one disabled or removed loses its connected clients (5.0: DISCONNECT 0x98) and refuses new
ones, and a removed one's persistent sessions and retained messages are kept or dropped as its
`on_remove` said. A bad tenants file keeps the running tenants."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

from plexmq.mqtt import properties as props
from plexmq.mqtt import reasons
from tests.conftest import Broker, free_port, wait_for
from tests.mqtt import RawClient
from tests.steps import disconnect_of, ping, publish, raw5, subscribe, sync, uid

BASE = 'tenant_separator = "@"\n'


def reload(b: Broker, config: Path, text: str) -> None:
    """Write `text` as the config, SIGHUP the broker, and wait until its router and worker applied it."""
    config.write_text(text)
    done = b.output().count("reloaded its settings") + 2  # the router and the one worker
    b.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: b.output().count("reloaded its settings") >= done, 10, "the router and worker to reload")


def start(tmp_path: Path, start_broker: Callable[..., Broker], text: str) -> tuple[Broker, Path]:
    config = tmp_path / "plexmq.toml"
    config.write_text(text)
    return start_broker("--config", str(config), "--workers", "1", "--data-dir", str(tmp_path / "data")), config


def accepted(port: int, username: str, client_id: str = "", clean: bool = True) -> RawClient:
    c = RawClient(port)
    assert c.connect(client_id or f"c-{uid()}", clean, username=username)[1] == 0
    return c


def test_a_tenant_added_is_served_at_once_with_its_listener(tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    b, config = start(tmp_path, start_broker, BASE)
    c, connack = raw5(b.port, username="dev@acme")
    assert connack == (False, reasons.BAD_USER_NAME_OR_PASSWORD, {props.REASON_STRING: "unknown tenant 'acme'"})
    c.close()
    port = free_port()
    reload(b, config, f'{BASE}[tenants.acme]\nlisteners = ["mqtt://127.0.0.1:{port}"]\n')
    assert f"SIGHUP: plexmq listening on 127.0.0.1:{port} (mqtt, tenant acme)" in b.output()
    sub = accepted(b.port, "dev@acme")
    subscribe(sub, 1, [("t", 0)])
    publish(accepted(port, "own"), "t", b"on acme's listener")  # no suffix: the listener names the tenant
    assert [m.payload for m in sync(sub)] == [b"on acme's listener"]

    (tmp_path / "tenants").mkdir()
    (tmp_path / "tenants" / "beta.toml").write_text("enabled = maybe\n")
    config.write_text(f'{BASE}tenants_dir = "{tmp_path / "tenants"}"\n')
    b.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "config not reloaded" in b.output(), 10, "the bad tenants file refused")
    accepted(port, "own").close()  # the running tenants stay

    reload(b, config, BASE)  # acme and its listener go
    assert f"SIGHUP: stopped listening on 127.0.0.1:{port} (mqtt, tenant acme)" in b.output()
    try:
        RawClient(port).close()
    except ConnectionRefusedError:
        pass
    else:
        raise AssertionError("acme's listener still accepts")


def test_a_tenant_disabled_loses_its_clients(tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    b, config = start(tmp_path, start_broker, f"{BASE}[tenants.acme]\n")
    five, connack = raw5(b.port, username="five@acme")
    assert connack[1] == 0
    four = accepted(b.port, "four@acme")
    other = accepted(b.port, "dev")  # the default tenant's
    reload(b, config, f"{BASE}[tenants.acme]\nenabled = false\n")
    assert disconnect_of(five) == (reasons.ADMINISTRATIVE_ACTION, {props.REASON_STRING: "tenant disabled"})
    assert four.read_until_closed() == b""
    ping(other)
    assert raw5(b.port, username="five@acme")[1][1] == reasons.SERVER_UNAVAILABLE
    assert RawClient(b.port).connect("x", username="four@acme") == (False, 0x03)


def queue_for_offline(port: int, username: str, topic: str) -> None:
    """A persistent session of `username` subscribed to `topic`, offline, with one QoS 1 message queued."""
    c = accepted(port, username, "keeper", clean=False)
    subscribe(c, 1, [(topic, 1)])
    c.close()
    sender = accepted(port, username.replace("keeper", "sender"))
    publish(sender, topic, b"queued", qos=1)  # acknowledged: routed into the offline session
    publish(sender, "kept", b"retained", qos=1, retain=True)
    sender.close()


def test_a_tenant_removed_keeps_its_sessions(tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    b, config = start(tmp_path, start_broker, f"{BASE}[tenants.acme]\n")
    queue_for_offline(b.port, "keeper@acme", "t")
    live, connack = raw5(b.port, username="live@acme")
    assert connack[1] == 0
    reload(b, config, BASE)
    assert disconnect_of(live) == (reasons.ADMINISTRATIVE_ACTION, {props.REASON_STRING: "tenant removed"})
    assert RawClient(b.port).connect("keeper", False, username="keeper@acme") == (False, 0x04)
    reload(b, config, f"{BASE}[tenants.acme]\n")
    c = RawClient(b.port)
    assert c.connect("keeper", False, username="keeper@acme") == (True, 0)
    assert [m.payload for m in sync(c)] == [b"queued"]
    subscribe(c, 2, [("kept", 0)])
    assert [m.payload for m in sync(c)] == [b"retained"]


def test_a_tenant_removed_with_drop_loses_its_sessions(tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    declared = f'{BASE}[tenants.acme]\non_remove = "drop"\n'
    b, config = start(tmp_path, start_broker, declared)
    queue_for_offline(b.port, "keeper@acme", "t")
    live, connack = raw5(b.port, username="live@acme", client_id="live", clean_start=False,
                         properties={props.SESSION_EXPIRY_INTERVAL: 3600})
    assert connack[1] == 0
    reload(b, config, BASE)
    wait_for(lambda: "tenant acme removed: its 2 sessions and 1 retained messages dropped" in b.output(),
             10, "the router to drop acme")
    code, _said = disconnect_of(live)
    assert code == reasons.ADMINISTRATIVE_ACTION
    reload(b, config, f"{BASE}[tenants.acme]\n")  # declared again: on_remove is read from the config that removed it
    assert_dropped(b.port)
    accepted(b.port, "keeper@acme", "keeper").close()  # a clean session: the check's own session goes
    b.stop()
    assert_dropped(start(tmp_path, start_broker, config.read_text())[0].port)  # gone from the store too


def assert_dropped(port: int) -> None:
    c = RawClient(port)
    assert c.connect("keeper", False, username="keeper@acme") == (False, 0)
    subscribe(c, 1, [("kept", 0)])
    assert sync(c) == []
    c.close()
