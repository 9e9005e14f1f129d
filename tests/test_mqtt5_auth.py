"""End to end: MQTT 5.0 enhanced authentication with SCRAM-SHA-256 against the password file's users
(raw v5 packets, scramp's client side): the exchange at CONNECT, its refusals, re-authentication;
and the SCRAM keys that the password file stores beside each hash."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import scramp

from plexmq.mqtt import properties as P
from plexmq.mqtt import v4, v5
from plexmq.workers.auth import passwords as pw
from tests.cli import CHEAP, passwd
from tests.conftest import Broker
from tests.mqtt import RawClient
from tests.steps import disconnect_of, subscribe5, uid

METHOD = "SCRAM-SHA-256"


@pytest.fixture
def scram_broker(start_broker: Callable[..., Broker], tmp_path: Path) -> Broker:
    """A broker whose password file has alice (secret) and bob (hunter2), and an ACL that lets each
    user at its own topics only."""
    passwords = tmp_path / "passwd"
    pw.set_password(str(passwords), "alice", "secret", n=CHEAP)
    pw.set_password(str(passwords), "bob", "hunter2", n=CHEAP)
    acl = tmp_path / "acl"
    acl.write_text("pattern readwrite users/%u/#\n")
    config = tmp_path / "plexmq.toml"
    config.write_text(f'password_file = "{passwords}"\nacl_file = "{acl}"\n')
    return start_broker("--workers", "1", "--config", str(config))


def auth_packet(code: int, data: str, method: str = METHOD) -> bytes:
    return v5.encode_auth(code, {P.AUTHENTICATION_METHOD: method, P.AUTHENTICATION_DATA: data.encode()})


def recv_auth(c: RawClient) -> tuple[int, dict]:
    first, body = c.recv()
    assert first == 0xF0, f"expected AUTH, got {first:#x} {body!r}"
    return v5.decode_reason_only(v5.AUTH, 0, body)


def recv_connack(c: RawClient) -> tuple[bool, int, dict]:
    first, body = c.recv()
    assert first == 0x20, f"expected CONNACK, got {first:#x} {body!r}"
    return v5.decode_connack(0, body)


def scram_connect(port: int, user: str, password: str, username: str | None = None) -> tuple[RawClient, scramp.ScramClient]:
    """CONNECT with SCRAM's client-first; the broker's AUTH 0x18 (server-first) read and answered
    with client-final. The CONNACK is next."""
    c = RawClient(port)
    client = scramp.ScramClient([METHOD], user, password)
    c.send(v5.encode_connect(f"scram-{uid()}", True, 60, protocol_level=5, username=username,
                             properties={P.AUTHENTICATION_METHOD: METHOD,
                                         P.AUTHENTICATION_DATA: client.get_client_first().encode()}))
    code, props = recv_auth(c)
    assert (code, props[P.AUTHENTICATION_METHOD]) == (0x18, METHOD)
    client.set_server_first(props[P.AUTHENTICATION_DATA].decode())
    c.send(auth_packet(0x18, client.get_client_final()))
    return c, client


def logged_in(port: int, user: str, password: str) -> RawClient:
    c, client = scram_connect(port, user, password)
    present, code, props = recv_connack(c)
    assert (present, code, props[P.AUTHENTICATION_METHOD]) == (False, 0, METHOD)
    client.set_server_final(props[P.AUTHENTICATION_DATA].decode())  # raises unless the broker knew alice's keys
    return c


def reauthenticate(c: RawClient, user: str, password: str) -> scramp.ScramClient:
    """AUTH 0x19 with client-first, the broker's AUTH 0x18 answered with client-final."""
    client = scramp.ScramClient([METHOD], user, password)
    c.send(auth_packet(0x19, client.get_client_first()))
    code, props = recv_auth(c)
    assert code == 0x18
    client.set_server_first(props[P.AUTHENTICATION_DATA].decode())
    c.send(auth_packet(0x18, client.get_client_final()))
    return client


# -- at CONNECT ------------------------------------------------------------------------------------


def test_scram_login_proves_both_sides_and_logs_in_as_the_user(scram_broker: Broker) -> None:
    c = logged_in(scram_broker.port, "alice", "secret")
    assert subscribe5(c, 1, [("users/alice/in", 1), ("users/bob/in", 1)]) == [1, 0x87]  # the ACL knows her
    c.send(v5.encode_disconnect())
    assert c.read_until_closed() == b""


def test_a_connect_username_must_be_the_scram_user(scram_broker: Broker) -> None:
    c = logged_in(scram_broker.port, "alice", "secret")  # none given: the SCRAM user is the one
    c.close()
    c, client = scram_connect(scram_broker.port, "alice", "secret", username="alice")
    assert recv_connack(c)[1] == 0
    c.close()
    c = RawClient(scram_broker.port)
    client = scramp.ScramClient([METHOD], "alice", "secret")
    c.send(v5.encode_connect(f"scram-{uid()}", True, 60, protocol_level=5, username="bob",
                             properties={P.AUTHENTICATION_METHOD: METHOD,
                                         P.AUTHENTICATION_DATA: client.get_client_first().encode()}))
    assert recv_connack(c)[1] == 0x86
    assert c.read_until_closed() == b""


@pytest.mark.parametrize("user, password", [("alice", "wrong"), ("mallory", "secret")])
def test_a_wrong_password_or_unknown_user_gets_0x86_after_the_whole_exchange(scram_broker: Broker, user: str,
                                                                             password: str) -> None:
    """An unknown user gets a server-first (with a salt of its own) and fails at the proof, as a
    wrong password does, so the exchange does not tell which users exist."""
    c, _client = scram_connect(scram_broker.port, user, password)
    present, code, props = recv_connack(c)
    assert (present, code, props[P.REASON_STRING]) == (False, 0x86, "bad user name or password")
    assert P.AUTHENTICATION_DATA not in props
    assert c.read_until_closed() == b""


def test_not_scram_gets_0x87(scram_broker: Broker) -> None:
    c = RawClient(scram_broker.port)
    present, code, props = c.connect5(f"bad-{uid()}", properties={P.AUTHENTICATION_METHOD: METHOD,
                                                                 P.AUTHENTICATION_DATA: b"not scram"})
    assert (present, code) == (False, 0x87) and "client-first" in props[P.REASON_STRING]
    assert c.read_until_closed() == b""


@pytest.mark.parametrize("method", ["SCRAM-SHA-512", "PLAIN", "scram-sha-256"])
def test_an_unknown_method_gets_0x8c(scram_broker: Broker, method: str) -> None:
    c = RawClient(scram_broker.port)
    present, code, props = c.connect5(f"m-{uid()}", properties={P.AUTHENTICATION_METHOD: method})
    assert (present, code) == (False, 0x8C) and method in props[P.REASON_STRING]
    assert c.read_until_closed() == b""


def test_scram_is_not_offered_without_a_password_file(broker: Broker) -> None:
    c = RawClient(broker.port)
    client = scramp.ScramClient([METHOD], "alice", "secret")
    present, code, _props = c.connect5(f"np-{uid()}", properties={
        P.AUTHENTICATION_METHOD: METHOD, P.AUTHENTICATION_DATA: client.get_client_first().encode()})
    assert (present, code) == (False, 0x8C)
    assert c.read_until_closed() == b""


def test_only_auth_may_come_before_the_connack(scram_broker: Broker) -> None:
    c = RawClient(scram_broker.port)
    client = scramp.ScramClient([METHOD], "alice", "secret")
    c.send(v5.encode_connect(f"early-{uid()}", True, 60, protocol_level=5, properties={
        P.AUTHENTICATION_METHOD: METHOD, P.AUTHENTICATION_DATA: client.get_client_first().encode()}))
    assert recv_auth(c)[0] == 0x18
    c.send(v5.encode_publish(b"users/alice/x", b"too soon"))  # [MQTT-3.1.2-30]
    assert c.read_until_closed() == b""
    assert "before the authentication ended" in scram_broker.output()


def test_a_user_without_scram_keys_is_refused_and_the_log_says_why(start_broker: Callable[..., Broker],
                                                                   tmp_path: Path) -> None:
    """A line from before SCRAM keys were written (a hash alone) still logs in with a password."""
    passwords = tmp_path / "passwd"
    passwords.write_text(f"carol:{pw.hash_password('secret', n=CHEAP)}\n")
    config = tmp_path / "plexmq.toml"
    config.write_text(f'password_file = "{passwords}"\n')
    b = start_broker("--workers", "1", "--config", str(config))
    c, _client = scram_connect(b.port, "carol", "secret")
    assert recv_connack(c)[1] == 0x86
    assert "user 'carol' has no SCRAM keys" in b.output()
    c = RawClient(b.port)
    assert c.connect5(f"plain-{uid()}", username="carol", password=b"secret")[1] == 0
    c.close()


# -- re-authentication -------------------------------------------------------------------------------


def test_reauthentication_succeeds_with_auth_0x00(scram_broker: Broker) -> None:
    c = logged_in(scram_broker.port, "alice", "secret")
    for _ in range(2):
        client = reauthenticate(c, "alice", "secret")
        code, props = recv_auth(c)
        assert (code, props[P.AUTHENTICATION_METHOD]) == (0x00, METHOD)
        client.set_server_final(props[P.AUTHENTICATION_DATA].decode())
    c.send(v4.PINGREQ_PACKET)
    assert c.recv() == (0xD0, b"")  # still connected
    c.close()


@pytest.mark.parametrize("user, password", [("alice", "wrong"), ("bob", "hunter2")])
def test_failed_reauthentication_is_disconnect_0x87(scram_broker: Broker, user: str, password: str) -> None:
    """A wrong password, or another user (even with the right password: the connection keeps the
    ACL it logged in with)."""
    c = logged_in(scram_broker.port, "alice", "secret")
    client = scramp.ScramClient([METHOD], user, password)
    c.send(auth_packet(0x19, client.get_client_first()))
    if user == "alice":
        client.set_server_first(recv_auth(c)[1][P.AUTHENTICATION_DATA].decode())
        c.send(auth_packet(0x18, client.get_client_final()))
    code, props = disconnect_of(c)
    assert code == 0x87 and "re-authentication failed" in props[P.REASON_STRING]


def test_reauthentication_with_another_method_is_a_protocol_error(scram_broker: Broker) -> None:
    """[MQTT-4.12.1-1]; 0x8C cannot be said in a DISCONNECT, so it is 0x82."""
    c = logged_in(scram_broker.port, "alice", "secret")
    c.send(auth_packet(0x19, "n,,n=alice,r=abc", method="SCRAM-SHA-512"))
    assert disconnect_of(c)[0] == 0x82


def test_auth_without_a_method_at_connect_is_a_protocol_error(scram_broker: Broker) -> None:
    c = RawClient(scram_broker.port)
    assert c.connect5(f"plain-{uid()}", username="alice", password=b"secret")[1] == 0
    c.send(auth_packet(0x19, "n,,n=alice,r=abc"))
    code, props = disconnect_of(c)
    assert code == 0x82 and "without an authentication method" in props[P.REASON_STRING]


def test_auth_out_of_turn_is_a_protocol_error(scram_broker: Broker) -> None:
    c = logged_in(scram_broker.port, "alice", "secret")
    c.send(auth_packet(0x18, "c=biws,r=abc,p=xyz"))  # continue, with no exchange under way
    assert disconnect_of(c)[0] == 0x82


# -- the password file's SCRAM keys ----------------------------------------------------------------


def test_each_entry_written_carries_scram_keys_and_old_lines_still_load(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    pw.set_password(str(path), "alice", "secret", n=CHEAP)
    line = path.read_text().strip()
    user, _, entry = line.partition(":")
    hashed, scram = entry.split(" ")
    assert user == "alice" and hashed.startswith("$scrypt$") and scram.startswith("$scram-sha-256$4096$")
    assert pw.verify(entry, "secret") and pw.verify(hashed, "secret")  # a database row may hold either
    users = pw.PasswordFile.load(str(path))
    assert users.check("alice", "secret") and users.has_scram_keys("alice")
    salt, stored_key, server_key, iterations = users.scram_keys("alice")
    assert (salt, stored_key, server_key, iterations) == scramp.ScramMechanism(METHOD).make_auth_info(
        "secret", iterations, salt)[:3] + (iterations,)

    path.write_text(f"{line}\nbob:{pw.hash_password('pw', n=CHEAP)}\n")  # a line of older plexmq, or mosquitto's
    users = pw.PasswordFile.load(str(path))
    assert users.check("bob", "pw") and not users.has_scram_keys("bob")
    decoy = users.scram_keys("bob")
    assert decoy.salt == users.scram_keys("bob").salt != users.scram_keys("nobody").salt  # stable per name


def test_the_command_writes_scram_keys(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    assert passwd(str(path), "alice", "--password-stdin", stdin="secret\n").returncode == 0
    assert pw.PasswordFile.load(str(path)).has_scram_keys("alice")


@pytest.mark.parametrize("scram, says", [
    ("$scram-sha-1$4096$AAAAAAAAAAAAAAAA$", "not of the form"),
    ("$scram-sha-256$100$" + "A" * 24 + "$" + "A" * 44 + "$" + "A" * 44, "iterations must be between 4096"),
    ("$scram-sha-256$4096$AAAA$" + "A" * 44 + "$" + "A" * 44, "salt shorter than 12 bytes"),
    ("$scram-sha-256$4096$" + "A" * 24 + "$AAAA$" + "A" * 44, "must be 32 bytes each"),
    ("$scram-sha-256$4096$" + "A" * 24 + "$!!$" + "A" * 44, "not valid base64"),
])
def test_bad_scram_keys_are_reported_by_line(tmp_path: Path, scram: str, says: str) -> None:
    path = tmp_path / "passwd"
    path.write_text(f"# users\nalice:{pw.hash_password('pw', n=CHEAP)} {scram}\n")
    with pytest.raises(pw.PasswordFileError, match=f"^{path}:2: .*{says}"):
        pw.PasswordFile.load(str(path))
