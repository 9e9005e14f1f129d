"""Banned clients (issue 37): the set a CONNECT is looked up in (by client id, username, address or
network, in a tenant or in every one, until it expires); and on the real broker, made with `plexmq ban`:
connected clients closed at once (5.0 DISCONNECT 0x98, 3.1.1 closed), new ones refused (5.0 CONNACK
0x8A Banned with the reason, 3.1.1 and 3.1 0x05), paho's view of both, a tenant's ban beside another
tenant's client of the same id, a network, lifting one, the admin API's gate, and bans kept across a
restart, an expired one gone."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import orjson
import paho.mqtt.client as paho
import pytest

from plexmq.bans import ADDRESS, BROKER, CLIENT_ID, USERNAME, BadBan, BanSet, make
from plexmq.mqtt import reasons
from plexmq.mqtt.connect import encode_connect
from plexmq.mqtt.properties import REASON_STRING
from tests.cli import cli, metrics_url, write
from tests.conftest import ROOT, Broker, free_port, wait_for
from tests.console import ask, console_broker, session
from tests.mqtt import RawClient
from tests.steps import disconnect_of, from_address, raw5, uid

NOW = 1_700_000_000.0


def test_a_client_is_found_by_id_username_or_address_in_its_tenant_or_in_every_one() -> None:
    bans = BanSet([make("", CLIENT_ID, "dev", now=NOW), make("acme", USERNAME, "alice", now=NOW),
                   make(BROKER, ADDRESS, "10.1.2.3/8", now=NOW), make("acme", ADDRESS, "2001:db8::/32", now=NOW),
                   make(BROKER, ADDRESS, "192.0.2.7", "scanner", 60, now=NOW)])
    assert [ban.value for ban in bans if ban.kind == ADDRESS] == ["10.0.0.0/8", "2001:db8::/32", "192.0.2.7"]

    def found(tenant: str, client_id: str = "c", usernames: tuple[str | None, ...] = (None,), peer: str = "127.0.0.1:5",
              now: float = NOW) -> str | None:
        ban = bans.match(tenant, client_id, usernames, peer, now)
        return None if ban is None else f"{ban.tenant}/{ban.value}"

    assert found("", "dev") == "/dev" and found("acme", "dev") is None  # a client id names a client in its tenant
    assert found("acme", usernames=("alice@acme", "alice")) == "acme/alice" and found("", usernames=("alice",)) is None
    assert found("other", peer="10.200.0.1:1883") == "*/10.0.0.0/8" and found("", peer="11.0.0.1:1") is None
    assert found("", peer="::ffff:10.0.0.9:1") == "*/10.0.0.0/8"  # IPv4 through a dual-stack listener
    assert found("acme", peer="2001:db8:1::5:40000") == "acme/2001:db8::/32" and found("", peer="2001:db8::5:1") is None
    assert found("", peer="192.0.2.7:1") == "*/192.0.2.7" and found("", peer="192.0.2.7:1", now=NOW + 60) is None  # expired
    assert bans.remove(("*", ADDRESS, "10.0.0.0/8")) is not None and found("", peer="10.0.0.1:1") is None
    assert (8 not in [length for _version, length in bans.networks]) and len(bans) == 4
    for tenant, kind, value in (("", "topic", "x"), ("", ADDRESS, "10.0.0.300"), ("no/such", CLIENT_ID, "x"), ("", USERNAME, "")):
        with pytest.raises(BadBan):
            make(tenant, kind, value)


def connack_banned(reason: str) -> bytes:
    """The whole CONNACK of a refused 5.0 CONNECT: 0x8A Banned, with its reason string."""
    said = reason.encode()
    props = bytes([0x1F]) + len(said).to_bytes(2, "big") + said
    return bytes([0x20, 3 + len(props), 0x00, reasons.BANNED, len(props)]) + props


def paho_connack(port: int, client_id: str, protocol: int) -> int:
    """The CONNACK code paho's client gets (its own loop, which ends with the connection)."""
    codes: list[int] = []
    client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol)  # type: ignore[arg-type]  # paho's ints
    client.on_connect = lambda c, u, flags, rc, props: codes.append(rc.value)
    client.connect("127.0.0.1", port)
    wait_for(lambda: client.loop(0.1) != 0 or codes, 10, "paho's CONNACK")  # loop: != 0 once the broker closes
    client.disconnect()
    return codes[0]


def test_a_ban_closes_the_clients_it_names_and_refuses_them_after(start_broker: Callable[..., Broker]) -> None:
    b = start_broker("--workers", "2")
    url = metrics_url(b)
    user = f"mallory-{uid()}"
    five, (_, code, _) = raw5(b.port, f"{user}-5", username=user)
    four = RawClient(b.port)
    assert code == 0 and four.connect(f"{user}-4", username=user) == (False, 0)
    said = cli("ban", url, "username", user, "--reason", "too many reconnects").strip()
    assert said == f"banned username {user!r} in every tenant; 2 connected clients closed"
    assert disconnect_of(five) == (reasons.ADMINISTRATIVE_ACTION, {REASON_STRING: "banned: too many reconnects"})
    assert four.read_until_closed() == b""  # 3.1.1 has no DISCONNECT from the server: closed
    for level, expected in ((5, connack_banned("banned: too many reconnects")), (4, b"\x20\x02\x00\x05"),
                            (3, b"\x20\x02\x00\x05")):
        again = RawClient(b.port)
        again.send(encode_connect(f"{user}-{level}", username=user, protocol_level=level))
        assert again.read_until_closed() == expected, level
    assert re.search(rf"client {user}-5 \(127\.0\.0\.1:\d+\) closed: banned \(username '{user}': too many reconnects\)",
                     b.output())
    # paho's clients, banned by client id: 5.0 hears Banned, 3.1.1 not authorized (paho names its 5 as 5.0's 0x87)
    client_id = f"paho-{uid()}"
    cli("ban", url, "client_id", client_id)
    assert paho_connack(b.port, client_id, paho.MQTTv5) == reasons.BANNED
    assert paho_connack(b.port, client_id, paho.MQTTv311) == reasons.NOT_AUTHORIZED
    assert paho_connack(b.port, f"{client_id}-other", paho.MQTTv311) == 0


def test_bans_by_tenant_and_network_listed_and_lifted(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    config = write(tmp_path, 'tenant_separator = "@"\n[tenants.acme]\n')
    b = start_broker("--config", str(config), "--workers", "2")
    url = metrics_url(b)
    assert cli("ban", url, "client_id", "dev", "--tenant", "acme").strip() == \
        "banned client_id 'dev' in tenant 'acme'; 0 connected clients closed"
    theirs = RawClient(b.port)
    theirs.send(encode_connect("dev", username="u@acme"))
    assert theirs.read_until_closed() == b"\x20\x02\x00\x05"
    ours = RawClient(b.port)  # the same client id in the default tenant is another client
    assert ours.connect("dev") == (False, 0)
    assert cli("ban", url, "address", "127.0.0.5/30", "--for", "1d", "--reason", "<b>lab</b>").startswith(
        "banned address '127.0.0.4/30' in every tenant until ")
    ours.send(b"\xc0\x00")
    assert ours.recv() == (0xD0, b"")  # its address is not in the network: still served
    inside = from_address(b.port, "127.0.0.6")
    inside.send(encode_connect(f"lab-{uid()}"))
    assert inside.read_until_closed() == b"\x20\x02\x00\x05"
    rows = cli("bans", url).splitlines()
    assert [row.split()[:3] for row in rows[1:-1]] == [["*", "address", "127.0.0.4/30"], ["acme", "client_id", "dev"]]
    assert rows[-1] == "page 1 of 1, 2 bans" and rows[1].endswith("<b>lab</b>")
    assert cli("unban", url, "address", "127.0.0.4/30").strip() == "lifted the ban of address '127.0.0.4/30' in every tenant"
    assert from_address(b.port, "127.0.0.6").connect(f"lab-{uid()}") == (False, 0)
    out = cli_fails("unban", url, "address", "127.0.0.4/30")
    assert out == "plexmq unban: no ban of address '127.0.0.4/30' in every tenant"
    assert cli_fails("ban", url, "address", "10.0.0.300") == \
        "plexmq ban: not an IPv4 or IPv6 address or network (a.b.c.d/len): '10.0.0.300'"
    ours.close()


def cli_fails(*args: str) -> str:
    """The one line a `plexmq` command that fails prints (exit status 1)."""
    command, url, *rest = args
    out = subprocess.run([sys.executable, "-m", "plexmq.acceptor", command, "--metrics", url, *rest], cwd=ROOT,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and len(out.stderr.splitlines()) == 1, (out.returncode, out.stderr)
    return out.stderr.strip()


def test_the_admin_api_bans_only_with_the_token_under_its_own_name_as_json(start_broker: Callable[..., Broker]) -> None:
    b = start_broker("--workers", "1")
    url = metrics_url(b)
    port = url.rsplit(":", 1)[1]
    token = wait_for(lambda: re.search(r"admin token \(for /clients\) in (\S+)", b.output()), 10, "the token line")
    with open(token.group(1)) as f:
        bearer = {"Authorization": f"Bearer {f.read().strip()}", "Content-Type": "application/json"}
    body = orjson.dumps({"kind": "client_id", "value": "forged"})
    assert ask(url, "POST", "/bans/add", {"Content-Type": "application/json"}, body)[0] == 401
    assert ask(url, "POST", "/bans/add", {**bearer, "Origin": "http://attacker.example"}, body)[0] == 403
    assert ask(url, "POST", "/bans/add", {**bearer, "Content-Type": "text/plain"}, body)[0] == 415
    assert ask(url, "GET", "/bans/add", bearer)[0] == 405
    listing = orjson.loads(ask(url, "GET", "/bans", bearer)[2])
    assert (listing["total"], listing["bans"]) == (0, [])
    status, _, said = ask(url, "POST", "/bans/add", {**bearer, "Origin": f"http://127.0.0.1:{port}"},
                          orjson.dumps({"kind": "client_id", "value": "x", "duration": 60, "reason": "r"}))
    assert status == 200 and said.startswith(b"banned client_id 'x' in every tenant until ")
    row = orjson.loads(ask(url, "GET", "/bans?tenant=*", bearer)[2])["bans"][0]
    assert row[:4] == ["*", "client_id", "x", "r"] and row[4] - row[6] == 60 and row[5] == "admin API from 127.0.0.1"
    assert ask(url, "POST", "/bans/add", bearer, b'{"kind": "client_id"}')[0] == 400


def test_bans_are_kept_across_a_restart_and_an_expired_one_goes(start_broker: Callable[..., Broker],
                                                                 tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    b = start_broker("--workers", "1", "--data-dir", data)
    url = metrics_url(b)
    cli("ban", url, "client_id", "kept", "--reason", "for good")
    cli("ban", url, "client_id", "brief", "--for", "1s")
    b.stop()
    b = start_broker("--workers", "1", "--data-dir", data)
    url = metrics_url(b)
    wait_for(lambda: [row.split()[2] for row in cli("bans", url).splitlines()[1:-1]] == ["kept"], 10,
             "the expired ban lifted")
    assert "1 bans expired" in b.output()
    refused = RawClient(b.port)
    refused.send(encode_connect("kept"))
    assert refused.read_until_closed() == b"\x20\x02\x00\x05"
    assert RawClient(b.port).connect("brief") == (False, 0)


def test_a_tenant_admin_bans_and_sees_only_in_the_tenant(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    """Whatever the body names, a tenant admin's ban holds in the tenant alone; the broker's bans are
    neither listed to it nor lifted by it."""
    b, url = console_broker(start_broker, tmp_path, tenants=("acme",))
    mine, mine_csrf = session(url, tenant="acme")
    broker, broker_csrf = session(url)

    def post(cookie: dict[str, str], csrf: str, path: str, body: dict) -> tuple[int, bytes]:
        status, _, said = ask(url, "POST", path, {**cookie, "X-CSRF-Token": csrf, "Content-Type": "application/json"},
                              orjson.dumps(body))
        return status, said

    assert post(mine, mine_csrf, "/api/bans/add", {"kind": "client_id", "value": "dev", "tenant": "*"}) == \
        (200, b"banned client_id 'dev' in tenant 'acme'; 0 connected clients closed\n")
    assert post(broker, broker_csrf, "/api/bans/add", {"kind": "username", "value": "eve"})[0] == 200
    theirs = orjson.loads(ask(url, "GET", "/api/bans?tenant=*", mine)[2])
    assert [row[:3] for row in theirs["bans"]] == [["acme", "client_id", "dev"]]
    assert [row[5] for row in theirs["bans"]] == ["console: ops (tenant acme)"]
    assert post(mine, mine_csrf, "/api/bans/remove", {"kind": "username", "value": "eve", "tenant": "*"})[0] == 404
    assert orjson.loads(ask(url, "GET", "/api/bans", broker)[2])["total"] == 2
    assert RawClient(b.port).connect("dev") == (False, 0)  # the default tenant's dev is another client


def test_the_ban_cost_bench_runs_and_finds_what_it_should() -> None:
    """bench/ban_cost.py at a small size (its own asserts: the banned cases found, the others not)."""
    said = subprocess.run([sys.executable, "-m", "plexmq.bench.ban_cost", "--bans", "3000", "--connections", "100"],
                          capture_output=True, text=True, check=True, timeout=120, cwd=ROOT).stdout
    assert said.startswith("3,000 bans: ") and len(re.findall(r"µs per CONNECT", said)) == 5


def test_bans_on_a_postgresql_store_hold_for_the_next_router(start_broker: Callable[..., Broker], pg_dsn: str,
                                                             tmp_path: Path) -> None:
    """Another broker on the same shared store (as a standby that takes over would) starts with them."""
    b = start_broker("--workers", "1", "--store", pg_dsn)
    cli("ban", metrics_url(b), "address", "127.0.0.9", "--tenant", "", "--reason", "shared")
    b.stop()
    b = start_broker("--workers", "1", "--store", pg_dsn)
    assert "1 bans" in b.output()
    refused = from_address(b.port, "127.0.0.9")
    refused.send(encode_connect(f"pg-{uid()}"))
    assert refused.read_until_closed() == b"\x20\x02\x00\x05"
    assert from_address(b.port, "127.0.0.10").connect(f"pg-{uid()}") == (False, 0)


def test_an_ipv6_network_ban_on_an_ipv6_listener(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    """A tenant's listener on ::1 (the broker's own stays on 127.0.0.1); a broker-wide ban holds there."""
    port = free_port()
    config = write(tmp_path, f'[tenants.six]\nlisteners = ["mqtt://[::1]:{port}"]\n')
    b = start_broker("--config", str(config), "--workers", "1")
    assert cli("ban", metrics_url(b), "address", "::1/64").strip() == \
        "banned address '::/64' in every tenant; 0 connected clients closed"
    refused = wait_for(lambda: _reached("::1", port), 10, "the tenant's listener")
    assert refused.connect5(f"v6-{uid()}")[1] == reasons.BANNED
    assert RawClient(b.port).connect5(f"v4-{uid()}")[1] == 0


def _reached(host: str, port: int) -> RawClient | None:
    try:
        return RawClient(port, host=host)
    except ConnectionRefusedError:
        return None
