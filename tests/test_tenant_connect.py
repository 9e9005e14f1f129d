"""A worker's connection finds its tenant at CONNECT (tests/connection_harness.py, in-process): the
CONNACK of each refusal in 3.1.1 and 5.0, the tenant named in the CONNECT record, and local routes
kept per tenant (a filter served elsewhere in one tenant does not send another tenant's messages
through the router)."""

from __future__ import annotations

import pytest

from plexmq import wire
from plexmq.mqtt import properties as props
from plexmq.mqtt import reasons, v5
from plexmq.mqtt import v4 as p
from plexmq.tenants import Tenant, Tenants
from tests.connection_harness import Client, ConnectionHarness, Packet, Record, routed, routes, suback

TENANTS = Tenants({"acme": Tenant("acme"), "beta": Tenant("beta"), "off": Tenant("off", enabled=False)}, "@")
REQUIRED = Tenants(TENANTS.declared, "@", True)


@pytest.mark.parametrize("tenants,listener,username,v4_code,v5_code,said", [
    (TENANTS, "", "dev@nope", 0x04, reasons.BAD_USER_NAME_OR_PASSWORD, "unknown tenant 'nope'"),
    (TENANTS, "acme", "dev@beta", 0x04, reasons.BAD_USER_NAME_OR_PASSWORD, "this port serves tenant 'acme' only"),
    (REQUIRED, "", "dev", 0x05, reasons.NOT_AUTHORIZED, "no tenant found"),
    (REQUIRED, "", None, 0x05, reasons.NOT_AUTHORIZED, "no tenant found"),
    (TENANTS, "", "dev@off", 0x03, reasons.SERVER_UNAVAILABLE, "tenant 'off' is disabled"),
    (TENANTS, "off", "dev", 0x03, reasons.SERVER_UNAVAILABLE, "tenant 'off' is disabled"),
])
@pytest.mark.parametrize("version", [4, 5])
def test_a_connection_without_a_tenant_is_refused(tenants: Tenants, listener: str, username: str | None,
                                                  v4_code: int, v5_code: int, said: str, version: int) -> None:
    h = ConnectionHarness(tenants=tenants)
    c = h.open(listener)
    c.send(v5.encode_connect("dev", True, 60, username=username, protocol_level=version))
    connack = read_connack(c, version)
    if version == 4:
        assert connack == (False, v4_code, {})
    else:
        assert connack == (False, v5_code, {props.REASON_STRING: said})
    assert c.transport.closed
    assert h.records() == []  # nothing claimed from the router


def read_connack(c: Client, version: int) -> tuple[bool, int, dict]:
    """The one packet written to `c`, a CONNACK, as (session present, code, properties)."""
    [packet] = c.packets()
    assert packet.kind == p.CONNACK
    return (*p.decode_connack(0, packet.body), {}) if version == 4 else v5.decode_connack(0, packet.body)


@pytest.mark.parametrize("listener,username,tenant,local", [
    ("", "dev@acme", "acme", "dev"),
    ("", "a@b@beta", "beta", "a@b"),
    ("", "dev", "", "dev"),
    ("acme", "dev", "acme", "dev"),
    ("beta", "dev@beta", "beta", "dev"),
])
@pytest.mark.parametrize("version", [4, 5])
def test_the_connect_record_names_the_tenant(listener: str, username: str, tenant: str, local: str, version: int) -> None:
    """The router hears the tenant; the login keeps the username as the client sent it (until logins
    are per tenant), the connection its tenant-local name."""
    h = ConnectionHarness(tenants=TENANTS)
    c = h.open(listener)
    c.send(v5.encode_connect("dev", True, 60, username=username, protocol_level=version))
    assert read_connack(c, version)[1] == 0
    [record] = h.records()
    assert record.kind == "CONNECT"
    connect = wire.Connect(*record.fields)
    assert connect.tenant == tenant and connect.username == username
    assert c.conn.local_name == local
    assert c.conn.routes is h.worker.routes.of(tenant)


def test_routes_apply_per_tenant() -> None:
    """A filter with a place elsewhere in tenant acme sends acme's messages to the router, while beta's
    to the same topic still go straight to beta's subscriber on this worker (and never to acme's)."""
    h = ConnectionHarness(tenants=TENANTS)
    sub = h.client("sub", username="s@beta")
    sub.send(p.encode_subscribe(1, [("t", 0)]))
    assert [r.kind for r in h.records()] == ["SUBSCRIBE"]
    h.from_router(suback(sub.conn_id, 1, [0], [["t", 0]]))  # served here, in beta
    assert [packet.kind for packet in sub.packets()] == [p.SUBACK]
    h.from_router(routes(1, True, [["acme", "t", ["elsewhere"]]]))
    assert h.records() == [Record("ROUTES_ACK", (1,))]

    beta = h.client("pub-b", username="p@beta")
    beta.send(p.encode_publish(b"t", b"from beta", 0, False, False, 0))
    assert sub.packets() == [Packet(p.PUBLISH, 0, 0, "t", b"from beta")]
    assert h.records() == []  # delivered here: nothing to the router

    acme = h.client("pub-a", username="p@acme")  # its tenant's table made now: as known as the others
    acme.send(p.encode_publish(b"t", b"from acme", 0, False, False, 0))
    assert [(r.kind, r.fields[2]) for r in h.records()] == [("PUB0", "t")]  # the router serves acme's `t`
    assert sub.packets() == []
    h.from_router(routed(0, 1))  # the router has it: beta's may take the local path again
    beta.send(p.encode_publish(b"t", b"still here", 0, False, False, 0))
    assert sub.packets() == [Packet(p.PUBLISH, 0, 0, "t", b"still here")] and h.records() == []

    h.from_router(routes(2, False, [["beta", "t", ["elsewhere", h.worker.routes.default.own]]]))
    assert h.records() == [Record("ROUTES_ACK", (2,))]
    beta.send(p.encode_publish(b"t", b"again", 0, False, False, 0))
    assert [(r.kind, r.fields[2]) for r in h.records()] == [("PUB0", "t")]  # now beta's goes there too


def test_a_whole_table_empties_the_tenants_it_does_not_name() -> None:
    h = ConnectionHarness(tenants=TENANTS)
    h.from_router(routes(1, True, [["acme", "t", ["elsewhere"]]]))
    acme = h.worker.routes.of("acme")
    assert acme.targets(b"t") == ((), None, None, ())  # no subscriber here; the router routes it
    h.from_router(routes(2, True, [["beta", "t", ["elsewhere"]]]))
    assert acme.targets(b"t") == ((), (), (), ()) and h.worker.routes.of("beta").targets(b"t") == ((), None, None, ())
    assert h.worker.routes.default.targets(b"t") == ((), (), (), ())
