"""Ways a tenant could reach another's state or escape one of its limits, found by an adversarial
review of issue 23's tenants, each shut and kept shut here."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import rsa

from plexmq import tenants, wire
from plexmq.mqtt import reasons
from plexmq.mqtt import v4 as p
from plexmq.router.tenants import UNLIMITED as RouterUNLIMITED
from plexmq.router.tenants import Tenant as RouterTenant
from plexmq.tenants import Tenant, Tenants
from plexmq.wire import Session
from tests.cli import write
from tests.conftest import Broker
from tests.connection_harness import ConnectionHarness
from tests.logins import login, users
from tests.router_harness import RouterHarness, WorkerEnd
from tests.test_mqtt5_auth import recv_connack, scram_connect
from tests.test_tenant_logins import jwks, token


def limited(h: RouterHarness, name: str = "a", **limits: float) -> RouterTenant:
    h.router.apply_limits(name, tenants.Tenant(name, **limits))  # type: ignore[arg-type]
    return h.router.tenant(name)


def answer(h: RouterHarness, end: WorkerEnd, conn: int, client_id: str, clean: bool = True, tenant: str = "a",
           **connect: object) -> Session:
    end.connect(conn, client_id, clean, tenant=tenant, **connect)  # type: ignore[arg-type]
    h.turn()
    found = [r for r in end.take() if isinstance(r, Session)]
    assert len(found) == 1, found
    return found[0]


# -- max_retained_bytes: replacing a small retained message with a large one is never judged ---------

def test_max_retained_bytes_cannot_be_escaped_by_replacing_a_small_retained_message() -> None:
    """A replacement counts what it frees and what it adds (`RetainedStore.refuses`): a tenant capped at
    10 bytes that keeps 1 byte on "r" cannot replace it with 100,000."""
    h = RouterHarness()
    w0 = h.worker("w0")
    a = limited(h, max_retained_bytes=10)
    assert answer(h, w0, 1, "pub").refused == ""
    w0.pub(1, "r", b"1", retain=True)
    w0.pub(1, "r", b"x" * 100_000, retain=True)  # a replacement: never refused
    h.turn()
    assert a.retained.bytes <= 10, f"tenant capped at 10 retained bytes holds {a.retained.bytes}"


# -- max_session_expiry: a 3.1.1 persistent session is not capped -----------------------------------

def test_max_session_expiry_caps_a_3_1_1_persistent_session_too() -> None:
    """A 3.1.1 persistent session of a tenant capped at 60 s registers that expiry (not -1, which
    would keep it under persistent_client_expiration: by default for ever, with its queue)."""
    tenant = Tenant("lim", max_session_expiry=60)
    h = ConnectionHarness(tenants=Tenants({"lim": tenant}, "@"), workers=2)
    c = h.open()
    c.send(p.encode_connect("dev", False, 60, username="dev@lim"))
    [record] = [r for r in h.records() if r.kind == "CONNECT"]
    expiry = wire.Connect(*record.fields).expiry
    assert 0 <= expiry <= 60, f"a persistent session of a tenant capped at 60 s registered with expiry {expiry}"


# -- a tenant's broker-file user escapes into the default tenant (SCRAM without a username) -----------

def test_a_tenants_user_cannot_log_into_the_default_tenant_by_scram_without_a_username(
        tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    """Tenant beta uses the broker's password file, where its users are `NAME@beta` (README, issue 23).
    `dev@beta` connecting with MQTT 5.0 SCRAM but no username in CONNECT is placed in the default tenant
    by the CONNECT; the SCRAM user it proves names beta: refused 0x87 (`proves_its_tenant`), never let
    in where it could read the default tenant's `#`."""
    users(tmp_path / "broker.pw", root="root-pw", **{"dev@beta": "beta-pw"})
    (tmp_path / "broker.pw").chmod(0o600)
    b = start_broker("--workers", "1", "--config", str(write(tmp_path, (
        f'tenant_separator = "@"\npassword_file = "{tmp_path / "broker.pw"}"\n[tenants.beta]\n'))))
    port = b.port
    c, _client = scram_connect(port, "dev@beta", "beta-pw", username=None)
    assert recv_connack(c)[1] == reasons.NOT_AUTHORIZED
    c.close()
    root, root_code = login(port, "root", b"root-pw")  # a user of the default tenant still logs in
    assert root_code == 0
    root.close()


# -- a reload that removes a tenant misses its clients still connecting ----------------------------------

def test_a_client_still_connecting_when_its_tenant_is_removed_does_not_stay_connected() -> None:
    """A persistent session's CONNECT waits for the router's SESSION (CONNECTING; as long as the router
    is away, or busy); a reload that removes (or disables) its tenant meanwhile closes it too
    (`Worker._close_ended_tenants`), so no SESSION can make it CONNECTED in a tenant that is gone."""
    h = ConnectionHarness(tenants=Tenants({"acme": Tenant("acme")}, "@"), workers=2)
    c = h.open()
    c.send(p.encode_connect("dev", False, 60, username="dev@acme"))
    assert [r.kind for r in h.records()].count("CONNECT") == 1  # waiting for the router's SESSION
    worker = h.worker
    object.__setattr__(worker, "settings", dataclasses.replace(worker.settings, tenants=Tenants({}, "@")))
    worker._close_ended_tenants()  # what Worker.reload does when the declared tenants changed
    c.conn.session_ready(False, [])
    assert c.transport.closed, "a client of a removed tenant is connected (state CONNECTED) after the reload"


def test_a_token_whose_subject_names_a_tenant_does_not_log_into_the_default_tenant(
        tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    """The same with a broker-wide token: `sub = "dev@beta"` connects as beta's dev when the CONNECT
    says username `dev@beta`; with an empty username the subject it proves still names beta, and the
    connection, placed in the default tenant by its CONNECT, is refused (0x05)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    b = start_broker("--workers", "1", "--config", str(write(tmp_path, (
        f'tenant_separator = "@"\njwt_jwks_file = "{jwks(tmp_path / "broker.jwks", key)}"\n[tenants.beta]\n'))))
    port = b.port
    c, code = login(port, "dev@beta", token(key, sub="dev@beta"))
    assert code == 0  # beta's user, in beta: as designed
    c.close()
    c, code = login(port, "", token(key, sub="dev@beta"))  # empty username (3.1.1 needs one with a password)
    assert code == 0x05
    c.close()
    operator, code = login(port, "operator", token(key, sub="operator"))  # the default tenant's own user
    assert code == 0
    operator.close()



def test_max_retained_bytes_counts_what_a_retained_message_holds_not_only_its_payload() -> None:
    """max_retained_bytes counts a retained message's topic and 5.0 properties with its payload: 100
    messages of a 1-byte payload, each with a 60,000-byte topic and 60,000 bytes of user properties,
    do not fit a 1,000-byte cap."""
    h = RouterHarness()
    w0 = h.worker("w0")
    a = limited(h, max_retained_bytes=1000)
    assert answer(h, w0, 1, "pub").refused == ""
    user_props = bytes([0x26]) + (30_000).to_bytes(2, "big") + b"k" * 30_000 + (29_990).to_bytes(2, "big") + b"v" * 29_990
    for n in range(100):
        topic = f"{n:03d}/" + "t" * 60_000
        w0.link.pub(1, 0, 0, True, topic.encode(), b"1", user_props)
        w0.send()
    h.turn()
    held = sum(len(name) + len(m.payload) + len(m.props) for name, m in a.retained.messages.items())
    assert held <= 1000 * 2, f"a tenant capped at 1,000 retained bytes holds {held} bytes ({len(a.retained)} messages)"


# -- on_remove = "drop": a CONNECT the router takes after the drop makes the tenant again -----------------

def test_a_dropped_tenant_is_not_made_again_by_a_connect_of_a_worker_not_yet_reloaded(tmp_path: Path) -> None:
    """Router and workers reload on their own SIGHUPs. After `drop_tenant("a")` (and "a" no longer
    declared), a worker that has not reloaded yet may still accept `dev@a` and send its CONNECT: the
    router closes that connection and makes nothing of "a" again (no session, nothing retained)."""
    h = RouterHarness(tmp_path)
    w0 = h.worker("w0")
    h.router.apply_limits("a", tenants.Tenant("a"))  # declared, on_remove = "drop" in its table
    assert answer(h, w0, 1, "dev", clean=False).refused == ""
    h.router.drop_tenant("a")  # the router's reload ...
    h.router.apply_limits("a", RouterUNLIMITED)  # ... and "a" is no longer declared
    w0.connect(2, "dev2", False, tenant="a")  # the worker has not reloaded yet
    w0.pub(2, "keep/me", b"retained after the drop", retain=True)
    h.turn()
    w0.take()
    w0.gone(2)  # the worker's reload closes it
    h.turn()
    left = h.router.tenants.get("a")
    assert left is None or (not left.sessions and not left.retained.messages), \
        f"dropped tenant 'a' made again: sessions {list(left.sessions)}, retained {list(left.retained.messages)}"
