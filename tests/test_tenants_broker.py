"""Tenants on the real broker: clients named into two tenants by their username, a tenant's own
listener, and the CONNACK of each refusal on the socket (3.1.1 and 5.0). Keeping the tenants' topics
apart is the router's part (issue 23), tested with it."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as paho

from plexmq.mqtt import properties as props
from plexmq.mqtt import reasons
from tests.cli import write
from tests.conftest import Broker
from tests.mqtt import Client, RawClient

CONFIG = """tenant_separator = "@"
tenant_required = true

[tenants.acme]
listeners = ["mqtt://127.0.0.1:0", "ws://127.0.0.1:0"]

[tenants.beta]

[tenants.off]
enabled = false
"""


def test_tenants_by_username_and_by_listener(tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    b = start_broker("--config", str(write(tmp_path, CONFIG)), "--workers", "1")
    acme_port, acme_ws = (int(re.findall(rf"listening on 127\.0\.0\.1:(\d+) \({scheme}, tenant acme\)", b.output())[0])
                          for scheme in ("mqtt", "ws"))

    clients = [Client(b.port, "dev", username="dev@acme"), Client(b.port, "dev", username="dev@beta"),
               Client(b.port, "five", username="five@beta", protocol=paho.MQTTv5),
               Client(acme_port, "own", username="own"), Client(acme_port, "two", username="two@acme"),
               Client(acme_ws, "web", username="web", transport="websockets")]  # each asserts its CONNACK 0
    for client in clients:
        client.disconnect()

    refusals: list[tuple[int, str | None, int]] = [
        (b.port, "dev@nope", 0x04),  # an unknown tenant
        (b.port, "dev", 0x05),  # none found, tenant_required
        (b.port, "dev@off", 0x03),  # disabled
        (acme_port, "dev@beta", 0x04),  # another tenant's name on acme's listener
    ]
    for port, username, code in refusals:
        raw = RawClient(port)
        assert raw.connect("x", username=username) == (False, code)
        assert raw.read_until_closed() == b""
        raw.close()
    refusals5: list[tuple[int, str | None, int, str]] = [
        (b.port, "dev@nope", reasons.BAD_USER_NAME_OR_PASSWORD, "unknown tenant 'nope'"),
        (b.port, None, reasons.NOT_AUTHORIZED, "no tenant found"),
        (b.port, "dev@off", reasons.SERVER_UNAVAILABLE, "tenant 'off' is disabled"),
        # beta exists: acme's own listener binds its logins to acme
        (acme_port, "dev@beta", reasons.BAD_USER_NAME_OR_PASSWORD, "this port serves tenant 'acme' only"),
    ]
    for port, username, code, said in refusals5:
        raw = RawClient(port)
        assert raw.connect5("x", username=username) == (False, code, {props.REASON_STRING: said})
        assert raw.read_until_closed() == b""
        raw.close()


def test_a_broker_with_two_thousand_tenants_declared_starts_and_serves_the_last(tmp_path: Path,
                                                                               start_broker: Callable[..., Broker]) -> None:
    """The config of thousands of tenants is more than one environment variable may hold (128 KiB):
    the router and the workers read it from the config file the acceptor writes."""
    declared = "".join(f"[tenants.t{i}]\nmax_connections = {i + 1}\n" for i in range(2000))
    b = start_broker("--config", str(write(tmp_path, 'tenant_separator = "@"\n' + declared)), "--workers", "1")
    client = Client(b.port, "dev", username="dev@t1999")  # asserts CONNACK 0: t1999 is known to the worker and router
    client.disconnect()
