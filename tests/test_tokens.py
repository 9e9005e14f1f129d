"""JWT bearer tokens as the CONNECT password, verified offline against a JWKS file."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from plexmq.mqtt import properties as P
from plexmq.mqtt import v4 as p
from tests.conftest import Broker
from tests.logins import config, login, users
from tests.mqtt import RawClient
from tests.steps import from_address, uid


@pytest.fixture(scope="module")
def keys() -> dict[str, object]:
    return {"rsa": rsa.generate_private_key(public_exponent=65537, key_size=2048),
            "ec": ec.generate_private_key(ec.SECP256R1()),
            "stranger": rsa.generate_private_key(public_exponent=65537, key_size=2048)}


def token(key: object, kid: str, algorithm: str = "RS256", **claims: object) -> bytes:
    body = {"sub": "device-1", "aud": "plexmq", "iss": "https://idp.example", "exp": time.time() + 300, **claims}
    return jwt.encode(body, key, algorithm=algorithm, headers={"kid": kid}).encode()  # type: ignore[arg-type]  # any of the test's keys


def start_tokens_broker(tmp_path: Path, start_broker: Callable[..., Broker], keys: dict[str, object],
                        extra: str = "") -> Broker:
    jwks = {"keys": [dict(json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(keys["rsa"].public_key())), kid="r1"),  # type: ignore[attr-defined]  # jwt.algorithms is there with cryptography
                     dict(json.loads(jwt.algorithms.ECAlgorithm.to_jwk(keys["ec"].public_key())), kid="e1")]}  # type: ignore[attr-defined]  # as above
    (tmp_path / "jwks.json").write_text(json.dumps(jwks))
    return start_broker("--workers", "2", "--config", config(tmp_path, f'jwt_jwks_file = "{tmp_path / "jwks.json"}"\n'
                                                            'jwt_audience = "plexmq"\njwt_issuer = "https://idp.example"\n'
                                                            + extra))


@pytest.fixture
def tokens_broker(tmp_path: Path, start_broker: Callable[..., Broker], keys: dict[str, object]) -> Broker:
    return start_tokens_broker(tmp_path, start_broker, keys)


def test_tokens_decide_the_connack(tokens_broker: Broker, keys: dict[str, object]) -> None:
    port = tokens_broker.port
    good = [("", token(keys["rsa"], "r1")), ("device-1", token(keys["rsa"], "r1")),
            ("", token(keys["ec"], "e1", "ES256"))]  # 3.1.1 needs a username with a password: any will do
    for username, password in good:
        c, code = login(port, username, password)
        assert code == 0, username
        c.close()
    bad = [("", token(keys["rsa"], "r1", exp=time.time() - 10)),  # expired
           ("", token(keys["rsa"], "r1", aud="other")),  # another audience
           ("", token(keys["rsa"], "r1", iss="https://evil.example")),  # another issuer
           ("", token(keys["stranger"], "r1")),  # signed by a key not in the JWKS
           ("device-2", token(keys["rsa"], "r1")),  # the username is not the token's subject
           ("device-1", b"not-a-token")]  # a password, and there is no password file
    for i, (username, password) in enumerate(bad):  # each from its own address: failures there are slowed
        c = from_address(port, f"127.0.0.{20 + i}")
        assert c.connect(f"tok-{i}", username=username, password=password)[1] == 4, (username, password)
        c.close()
    c = from_address(port, "127.0.0.30")
    assert c.connect("tok-anonymous")[1] == 5
    c.close()
    c.close()


def test_v5_clients_hear_the_token_verdict_as_reason_codes(tokens_broker: Broker, keys: dict[str, object]) -> None:
    """5.0 needs no user name with a password: the token alone logs in; a bad one is 0x86, none 0x87."""
    port = tokens_broker.port
    c = RawClient(port)
    assert c.connect5(f"tok5-{uid()}", password=token(keys["rsa"], "r1"))[:2] == (False, 0)
    c.close()
    c = from_address(port, "127.0.0.40")
    _present, code, props = c.connect5(f"tok5-{uid()}", password=token(keys["rsa"], "r1", exp=time.time() - 10))
    assert code == 0x86 and props[P.REASON_STRING] == "bad user name or password"
    c.close()
    c = from_address(port, "127.0.0.41")
    assert c.connect5(f"tok5-{uid()}")[1] == 0x87  # anonymous, and anonymous is not allowed
    c.close()


def test_a_token_must_name_its_user(tmp_path: Path, start_broker: Callable[..., Broker], keys: dict[str, object]) -> None:
    """A trusted token without the user claim would log in as any user name the client picks: refused.
    The claim is configurable."""
    b = start_tokens_broker(tmp_path, start_broker, keys, 'jwt_username_claim = "preferred_username"\n')
    named = token(keys["rsa"], "r1", preferred_username="device-9")
    c, code = login(b.port, "device-9", named)
    assert code == 0
    c.close()
    for i, password in enumerate([token(keys["rsa"], "r1"), token(keys["rsa"], "r1", preferred_username="")]):
        c = from_address(b.port, f"127.0.0.{50 + i}")
        assert c.connect(f"tok-{uid()}", username="admin", password=password)[1] == 4  # sub alone names no one here
        c.close()


def test_a_token_whose_algorithm_does_not_fit_its_key_is_a_bad_token(tokens_broker: Broker,
                                                                     keys: dict[str, object]) -> None:
    """ES256 naming the RSA key's kid: 0x04 (5.0: 0x86) after the failure delay, no ERROR in the log."""
    for i in range(3):
        c = from_address(tokens_broker.port, f"127.0.0.{60 + i}")
        assert c.connect(f"tok-{uid()}", username="device-1", password=token(keys["ec"], "r1", "ES256"))[1] == 4
        c.close()
    c = from_address(tokens_broker.port, "127.0.0.63")
    assert c.connect5(f"tok-{uid()}", password=token(keys["ec"], "r1", "ES256"))[1] == 0x86
    c.close()
    assert " ERROR " not in tokens_broker.output()


def test_a_password_with_two_dots_is_still_a_password(tmp_path: Path, start_broker: Callable[..., Broker],
                                                      keys: dict[str, object]) -> None:
    users(tmp_path / "passwd", carol="a.b.c")
    b = start_tokens_broker(tmp_path, start_broker, keys, f'password_file = "{tmp_path / "passwd"}"\n')
    c, code = login(b.port, "carol", b"a.b.c")
    assert code == 0
    c.close()
    c, code = login(b.port, "", token(keys["rsa"], "r1"))  # tokens still log in beside the file
    assert code == 0
    c.close()
    c = from_address(b.port, "127.0.0.70")
    assert c.connect(f"tok-{uid()}", username="carol", password=b"x.y.z")[1] == 4
    c.close()


def test_a_bad_jwks_file_stops_startup(tmp_path: Path) -> None:
    from plexmq.acceptor import config as cfg

    (tmp_path / "jwks.json").write_text("{nope")
    with pytest.raises(cfg.ConfigError, match="not a usable JWKS file"):
        cfg.load(config(tmp_path, f'jwt_jwks_file = "{tmp_path / "jwks.json"}"\n'), {})


@pytest.mark.parametrize("disconnect", [True, False])
def test_an_expiring_token_ends_the_session_only_when_configured(
        tmp_path: Path, start_broker: Callable[..., Broker], keys: dict[str, object], disconnect: bool) -> None:
    b = start_tokens_broker(tmp_path, start_broker, keys, f"jwt_disconnect_on_expiry = {str(disconnect).lower()}\n")
    expires = time.time() + 2
    c, code = login(b.port, "", token(keys["rsa"], "r1", exp=expires))
    assert code == 0
    if disconnect:
        c.read_until_closed(timeout=6)  # the worker sweeps once a second
        assert time.time() >= expires
        assert "token expired" in b.output()
    else:
        time.sleep(max(0.0, expires + 1.5 - time.time()))  # waiting for an absence: past the expiry and a sweep
        c.send(p.PINGREQ_PACKET)
        assert c.recv() == (0xD0, b"")
    c.close()
