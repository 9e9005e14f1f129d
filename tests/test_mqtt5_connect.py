"""End to end: what the broker decides at CONNECT from its config, per protocol version: the server
keep alive (`max_keepalive`), response information (`response_information`) and sending clients to
another server (`server_reference`, `server_moved`); and that bad values of those keys stop startup
with one line."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from plexmq.mqtt import properties as P
from plexmq.mqtt import v4
from tests.cli import names_line, one_error_line, run, write
from tests.conftest import Broker, wait_for
from tests.mqtt import Client, RawClient
from tests.steps import disconnect_of, raw5, uid

V5 = paho.MQTTv5


def configured(start_broker: Callable[..., Broker], tmp_path: Path, text: str) -> Broker:
    return start_broker("--workers", "1", "--config", str(write(tmp_path, text)))


# -- server keep alive -----------------------------------------------------------------------------


def test_a_v5_keepalive_above_max_keepalive_is_replaced_and_held_to(start_broker: Callable[..., Broker],
                                                                       tmp_path: Path) -> None:
    b = configured(start_broker, tmp_path, "max_keepalive = 1\n")
    for asked in (60, 0):  # above the limit, and none at all
        c, (_present, code, props) = raw5(b.port, keepalive=asked)
        assert (code, props[P.SERVER_KEEP_ALIVE]) == (0, 1)
        assert disconnect_of(c)[0] == 0x8D  # silent for 1.5 s: the broker used the value it told
    c, (_present, code, props) = raw5(b.port, keepalive=1)
    assert code == 0 and P.SERVER_KEEP_ALIVE not in props  # within the limit: its own
    c.close()


def test_paho_v5_is_told_the_server_keep_alive(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    b = configured(start_broker, tmp_path, "max_keepalive = 30\n")
    c = Client(b.port, f"ska-{uid()}", keepalive=120, protocol=V5)
    assert c.connack_properties.ServerKeepAlive == 30  # type: ignore[union-attr]  # a 5.0 CONNACK has properties
    c.disconnect()


def test_a_311_keepalive_above_max_keepalive_is_refused_as_mosquitto_does(start_broker: Callable[..., Broker],
                                                                            tmp_path: Path) -> None:
    b = configured(start_broker, tmp_path, "max_keepalive = 30\n")
    for asked, expected in ((31, 0x02), (0, 0x02), (30, 0x00)):
        c = RawClient(b.port)
        assert c.connect(f"ka-{uid()}", keepalive=asked) == (False, expected)
        if expected:
            assert c.read_until_closed() == b""
        c.close()
    assert "keepalive 31 s, max_keepalive is 30 s" in b.output()


def test_without_max_keepalive_nothing_is_told_or_refused(broker: Broker) -> None:
    c, (_present, code, props) = raw5(broker.port, keepalive=0)
    assert code == 0 and P.SERVER_KEEP_ALIVE not in props
    c.close()
    c = RawClient(broker.port)
    assert c.connect(f"ka0-{uid()}", keepalive=0) == (False, 0)
    c.close()


# -- request / response information ----------------------------------------------------------------


def test_response_information_only_for_those_who_ask(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    b = configured(start_broker, tmp_path, 'response_information = "responses/"\n')
    c, (_present, code, props) = raw5(b.port, properties={P.REQUEST_RESPONSE_INFORMATION: 1})
    assert (code, props[P.RESPONSE_INFORMATION]) == (0, "responses/")
    c.close()
    for asked in ({P.REQUEST_RESPONSE_INFORMATION: 0}, None):
        c, (_present, code, props) = raw5(b.port, properties=asked)
        assert code == 0 and P.RESPONSE_INFORMATION not in props
        c.close()
    properties = Properties(PacketTypes.CONNECT)
    properties.RequestResponseInformation = 1
    paho_client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=f"rri-{uid()}", protocol=V5)
    told: list[object] = []
    paho_client.on_connect = lambda _c, _u, _f, _rc, props: told.append(props.ResponseInformation)
    paho_client.connect("127.0.0.1", b.port, properties=properties)
    while not told:
        paho_client.loop(timeout=5)
    assert told == ["responses/"]
    paho_client.disconnect()


def test_no_response_information_unless_configured(broker: Broker) -> None:
    c, (_present, code, props) = raw5(broker.port, properties={P.REQUEST_RESPONSE_INFORMATION: 1})
    assert code == 0 and P.RESPONSE_INFORMATION not in props
    c.close()


# -- use another server ----------------------------------------------------------------------------


@pytest.mark.parametrize("moved, code", [(False, 0x9C), (True, 0x9D)])
def test_clients_are_sent_to_the_server_reference(start_broker: Callable[..., Broker], tmp_path: Path,
                                                  moved: bool, code: int) -> None:
    b = configured(start_broker, tmp_path, f'server_reference = "mqtt2.example:1883"\nserver_moved = {str(moved).lower()}\n')
    c, (present, got, props) = raw5(b.port)
    assert (present, got, props[P.SERVER_REFERENCE]) == (False, code, "mqtt2.example:1883")
    assert c.read_until_closed() == b""
    c = RawClient(b.port)
    assert c.connect(f"old-{uid()}") == (False, 0x03)  # 3.1.1: server unavailable, it cannot be told where
    assert c.read_until_closed() == b""


def test_a_reload_sends_new_clients_elsewhere_and_keeps_the_connected_ones(start_broker: Callable[..., Broker],
                                                                           tmp_path: Path) -> None:
    """server_reference changes live (SIGHUP): an operator moves clients without a restart."""
    b = configured(start_broker, tmp_path, "")
    staying, _ = raw5(b.port)
    write(tmp_path, 'server_reference = "mqtt2.example:1883"\n')
    b.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: b.output().count("reloaded its settings") == 2, 10, "the router and the worker to apply it")
    c, (_present, code, props) = raw5(b.port)
    assert (code, props[P.SERVER_REFERENCE]) == (0x9C, "mqtt2.example:1883")
    staying.send(v4.PINGREQ_PACKET)  # a connected client stays
    assert staying.recv() == (0xD0, b"")
    staying.close()


def test_the_server_reference_comes_before_any_login(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    passwords = tmp_path / "passwd"
    passwords.write_text("")
    b = configured(start_broker, tmp_path, f'password_file = "{passwords}"\nserver_reference = "other:1883"\n')
    c = RawClient(b.port)
    present, code, props = c.connect5(f"r-{uid()}", username="nobody", password=b"x",
                                      properties={P.AUTHENTICATION_METHOD: "SCRAM-SHA-256"})
    assert (code, props[P.SERVER_REFERENCE]) == (0x9C, "other:1883")
    paho_client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=f"r-{uid()}", protocol=V5)
    refused: list[int] = []
    paho_client.on_connect = lambda _c, _u, _f, rc, _p: refused.append(rc.value)
    paho_client.connect("127.0.0.1", b.port)
    while not refused:
        paho_client.loop(timeout=5)
    assert refused == [0x9C]


# -- the keys' values ------------------------------------------------------------------------------


@pytest.mark.parametrize("text, key, says", [
    ("max_keepalive = 65536\n", "max_keepalive", "between 0 and 65535"),
    ("max_keepalive = -1\n", "max_keepalive", "between 0 and 65535"),
    ('max_keepalive = "60"\n', "max_keepalive", "must be int"),
    ('response_information = "a\\u0000b"\n', "response_information", "U+0000"),
    ("server_reference = 7\n", "server_reference", "must be str"),
    ('server_reference = "a\\u0000b"\n', "server_reference", "U+0000"),
    ('server_moved = "yes"\n', "server_moved", "must be bool"),
])
def test_bad_values_stop_startup_with_one_line(tmp_path: Path, text: str, key: str, says: str) -> None:
    path = write(tmp_path, text)
    line = one_error_line(run("serve", "--config", str(path)))
    assert f"'{key}'" in line and says in line and names_line(line, path, 1)


def test_server_moved_needs_a_server_reference(tmp_path: Path) -> None:
    line = one_error_line(run("serve", "--config", str(write(tmp_path, "server_moved = true\n"))))
    assert "server_moved: needs server_reference" in line
