"""Each tenant's own logins and ACL, and the tenant found from a login (issue 23, wave 2: logins).

A tenant with a password file or token keys of its own checks its clients' tenant-local names there
and never against the broker's; one without uses the broker's with the name as sent. A tenant's ACL
(its %u the tenant-local name) replaces the broker's for its clients only. Where neither the listener
nor the username names a tenant, a broker-wide token's claim, the SQL row's column or the client
certificate's subject field may. The pure rules are tables; the rest runs on real brokers."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from plexmq.acceptor import config as cfg
from plexmq.mqtt import v4 as p
from plexmq.tenants import (
    CERTIFIED,
    DISABLED,
    NONE_FOUND,
    OWN_LOGINS,
    OWN_PORT,
    UNKNOWN,
    Found,
    Refused,
    Tenant,
    Tenants,
    resolve,
    settle,
)
from plexmq.workers.auth.passwords import hash_password
from tests.cli import write
from tests.conftest import Broker
from tests.logins import login, users
from tests.mqtt import RawClient
from tests.steps import from_address, sync, uid
from tests.test_mqtt5_auth import logged_in, reauthenticate, recv_auth, recv_connack, scram_connect
from tests.test_sql_auth import CHEAP, SERVER, MariaDB, add_user, documented_schema, mariadb  # noqa: F401  # mariadb: the session's database fixture
from tests.test_transports import Pki, client_certificate, pki, port_of, tls_section, tls_socket  # noqa: F401  # pki: a fixture

# -- the rules, as tables ------------------------------------------------------------------------------

REGISTRY = Tenants({"acme": Tenant("acme", password_file="acme.pw"), "beta": Tenant("beta"),
                    "off": Tenant("off", enabled=False)}, "@", by_login=True)
REQUIRED = Tenants(REGISTRY.declared, "@", True, by_login=True)


@pytest.mark.parametrize("registry,owner,username,certified,result", [
    (REGISTRY, "", "dev", "", Found("", "dev", True)),  # nothing named one: a login may
    (Tenants(REGISTRY.declared, "@"), "", "dev", "", Found("", "dev")),  # no login can: settled now
    (REGISTRY, "", "dev", "beta", Found("beta", "dev")),  # the certificate counts as the listener does
    (REGISTRY, "", "dev@beta", "beta", Found("beta", "dev")),
    (REGISTRY, "", "me@example", "beta", Found("beta", "me@example")),
    (REGISTRY, "", "dev@acme", "beta", Refused(CERTIFIED, "beta")),  # the username names another
    (REGISTRY, "acme", "dev", "beta", Refused(OWN_PORT, "acme")),  # the listener names another
    (REGISTRY, "", "dev", "nope", Refused(UNKNOWN, "nope")),
    (REGISTRY, "", "dev", "off", Refused(DISABLED, "off")),
])
def test_resolution_with_a_certificate(registry: Tenants, owner: str, username: str, certified: str,
                                       result: Found | Refused) -> None:
    assert resolve(registry, owner, username, certified) == result


@pytest.mark.parametrize("registry,found,claimed,result", [
    (REGISTRY, Found("", "dev", True), "", Found("", "dev")),
    (REQUIRED, Found("", "dev", True), "", Refused(NONE_FOUND, "")),
    (REGISTRY, Found("", "dev", True), "beta", Found("beta", "dev")),
    (REGISTRY, Found("", "dev@beta", True), "beta", Found("beta", "dev")),
    (REQUIRED, Found("", "dev", True), "beta", Found("beta", "dev")),
    (REGISTRY, Found("", "dev", True), "nope", Refused(UNKNOWN, "nope")),
    (REGISTRY, Found("", "dev", True), "off", Refused(DISABLED, "off")),
    (REGISTRY, Found("", "dev", True), "acme", Refused(OWN_LOGINS, "acme")),  # its logins were not the ones asked
    (REGISTRY, Found("acme", "dev"), "acme", Found("acme", "dev")),  # a token of acme's own naming acme
    (REGISTRY, Found("acme", "dev"), "beta", Refused(UNKNOWN, "beta")),  # ... or another tenant
    (REGISTRY, Found("beta", "dev"), "", Found("beta", "dev")),
])
def test_a_login_names_a_tenant_only_where_nothing_else_did(registry: Tenants, found: Found, claimed: str,
                                                            result: Found | Refused) -> None:
    assert settle(registry, found, claimed) == result


# -- the config: each key's errors, with their place -----------------------------------------------------


def error(path: Path) -> str:
    with pytest.raises(cfg.ConfigError) as err:
        cfg.load(str(path), {})
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_bad_line_in_a_tenants_file_stops_startup_naming_both_places(tmp_path: Path) -> None:
    (tmp_path / "acme.pw").write_text("dev:$scrypt$nonsense\n")
    (tmp_path / "acme.acl").write_text("user dev\ntopic sideways a/b\n")
    (tmp_path / "acme.jwks").write_text("{}")
    where = f"{tmp_path / 'plexmq.toml'}:3: key 'tenants.acme."
    for key, file, said in [("password_file", "acme.pw", f"{tmp_path / 'acme.pw'}:1:"),
                            ("acl_file", "acme.acl", f"{tmp_path / 'acme.acl'}:2:"),
                            ("jwt_jwks_file", "acme.jwks", f"{tmp_path / 'acme.jwks'}: not a usable JWKS file")]:
        message = error(write(tmp_path, f'tenant_separator = "@"\n[tenants.acme]\n{key} = "{tmp_path / file}"\n'))
        assert message.startswith(f"{where}{key}': {said}"), message
    tenants_dir = tmp_path / "tenants"
    tenants_dir.mkdir()
    (tenants_dir / "beta.toml").write_text(f'\nacl_file = "{tmp_path / "acme.acl"}"\n')
    message = error(write(tmp_path, f'tenants_dir = "{tenants_dir}"\n'))
    assert message.startswith(f"{tenants_dir / 'beta.toml'}:2: key 'tenants.beta.acl_file': {tmp_path / 'acme.acl'}:2:")


@pytest.mark.parametrize("text,said", [
    ('[tenants.acme]\njwt_audience = "x"\n', ":2: key 'tenants.acme.jwt_audience' needs tenants.acme.jwt_jwks_file"),
    ('[tenants.acme]\n\njwt_issuer = "x"\n', ":3: key 'tenants.acme.jwt_issuer' needs tenants.acme.jwt_jwks_file"),
    ('[tenants.acme]\nallow_anonymous = "yes"\n', ":2: key 'tenants.acme.allow_anonymous' must be bool"),
    ('[tenants.acme]\npassword_file = 1\n', ":2: key 'tenants.acme.password_file' must be str"),
    ('auth_database_tenant_column = "x; DROP TABLE"\n', ":1: key 'auth_database_tenant_column' must be a column name"),
    ('tenant_certificate_field = "SN"\n', ":1: key 'tenant_certificate_field' must be one of , O, OU, CN"),
])
def test_bad_values_name_their_key_and_line(tmp_path: Path, text: str, said: str) -> None:
    message = error(write(tmp_path, text))
    assert message.startswith(f"{tmp_path / 'plexmq.toml'}{said}"), message


@pytest.mark.parametrize("text,said", [
    ('auth_database_tenant_column = "tenant"\n', "auth_database_tenant_column: needs auth_database"),
    ('jwt_tenant_claim = "tenant"\n', "jwt_tenant_claim: needs jwt_jwks_file"),
    ('tenant_certificate_field = "O"\n', "tenant_certificate_field: needs tls.require_certificate = true"),
])
def test_a_login_source_of_tenants_needs_its_logins(tmp_path: Path, text: str, said: str) -> None:
    assert error(write(tmp_path, text)).startswith(said)


def test_a_tenant_listener_beyond_loopback_counts_the_tenants_logins(tmp_path: Path) -> None:
    users(tmp_path / "acme.pw", dev="x")
    (tmp_path / "acme.pw").chmod(0o600)
    listener = '[tenants.acme]\nlisteners = ["mqtt://0.0.0.0:0"]\n'
    message = error(write(tmp_path, listener))
    said = "tenants.acme.listeners: mqtt://0.0.0.0:0: listening beyond loopback needs authentication"
    assert message.startswith(f"{tmp_path / 'plexmq.toml'}:2: {said}"), message
    assert cfg.load(str(write(tmp_path, listener + f'password_file = "{tmp_path / "acme.pw"}"\n')), {})
    assert cfg.load(str(write(tmp_path, listener + "allow_anonymous = true\n")), {})
    assert cfg.load(str(write(tmp_path, listener + 'auth_database = "mysql://u:p@db:3306/acme"\n')), {})
    error(write(tmp_path, "allow_anonymous = true\n" + listener + "allow_anonymous = false\n"))
    # the broker's own listener is not guarded by a tenant's logins
    error(write(tmp_path, f'host = "0.0.0.0"\n[tenants.acme]\npassword_file = "{tmp_path / "acme.pw"}"\n'))


# -- passwords and ACLs per tenant, on a broker ---------------------------------------------------------------


def connected(port: int, username: str | None, password: bytes | None = None, **kw: object) -> RawClient:
    c, code = login(port, username, password, **kw)  # type: ignore[arg-type]  # login's keywords
    assert code == 0, (username, code)
    return c


ADDRESSES = (f"127.0.0.{n}" for n in itertools.count(60))  # failures from one address are answered ever later


def refused(port: int, username: str | None, password: bytes | None) -> int:
    c = from_address(port, next(ADDRESSES))
    code = c.connect(f"refused-{uid()}", username=username, password=password)[1]
    c.close()
    return code


def heard(sub: RawClient, pub: RawClient, topic: str) -> bool:
    """Whether `sub` (subscribed to `topic`'s filter) gets what `pub` publishes to `topic`."""
    pub.send(p.encode_publish(topic.encode(), b"x", 0))
    sync(pub)  # the publish has been read before the barrier
    return [m.topic for m in sync(sub)] == [topic]


@pytest.fixture(scope="module")
def tenants_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """acme: its own users (dev) and ACL; beta: the broker's users (dev@beta), its own ACL and anonymous
    rule; the default tenant: the broker's users (root, dev) and no ACL. Both ACLs deny one topic of the
    same tree. Each tenant has a listener of its own (where anonymous clients are its)."""
    where = tmp_path_factory.mktemp("tenant-logins")
    users(where / "broker.pw", root="root-pw", **{"dev@beta": "beta-pw", "dev": "default-pw"})
    users(where / "acme.pw", dev="acme-pw", other="other-pw")
    for name in ("broker.pw", "acme.pw"):
        (where / name).chmod(0o600)
    (where / "acme.acl").write_text("user dev\ntopic readwrite data/#\ntopic deny data/a-only\n"
                                    "pattern readwrite home/%u/#\n")
    (where / "beta.acl").write_text("user dev\ntopic readwrite data/#\ntopic deny data/b-only\n"
                                    "pattern readwrite home/%u/#\n")
    path = write(where, f'tenant_separator = "@"\npassword_file = "{where / "broker.pw"}"\n'
                 f'[tenants.acme]\npassword_file = "{where / "acme.pw"}"\nacl_file = "{where / "acme.acl"}"\n'
                 f'listeners = ["mqtt://127.0.0.1:0"]\n[tenants.beta]\nacl_file = "{where / "beta.acl"}"\n'
                 'listeners = ["mqtt://127.0.0.1:0"]\nallow_anonymous = true\n')
    b = Broker(where / "broker.log", ["--workers", "2", "--config", str(path)])
    yield b
    b.stop()


def test_a_tenants_users_log_in_there_only(tenants_broker: Broker) -> None:
    port = tenants_broker.port
    connected(port, "dev@acme", b"acme-pw").close()  # acme's file, the tenant-local name
    assert refused(port, "dev@acme", b"default-pw") == 4  # never the broker's users
    assert refused(port, "root@acme", b"root-pw") == 4
    assert refused(port, "dev", b"acme-pw") == 4  # not into the default tenant
    assert refused(port, "dev@beta", b"acme-pw") == 4  # nor into another tenant
    assert refused(port, "other@beta", b"other-pw") == 4
    connected(port, "dev@beta", b"beta-pw").close()  # beta: the broker's users, the name as sent
    connected(port, "dev", b"default-pw").close()

    def anonymous(tenant: str) -> int:
        return refused(port_of(tenants_broker, f"mqtt, tenant {tenant}") if tenant else port, None, None)

    assert anonymous("beta") == 0 and anonymous("acme") == 5 and anonymous("") == 5  # beta's rule, else the broker's


def test_a_tenants_acl_applies_to_its_clients_only(tenants_broker: Broker) -> None:
    port = tenants_broker.port
    a_sub, a_pub = connected(port, "dev@acme", b"acme-pw"), connected(port, "dev@acme", b"acme-pw")
    b_sub, b_pub = connected(port, "dev@beta", b"beta-pw"), connected(port, "dev@beta", b"beta-pw")
    d_sub, d_pub = connected(port, "dev", b"default-pw"), connected(port, "root", b"root-pw")
    for c in (a_sub, b_sub, d_sub):
        c.send(p.encode_subscribe(1, [("data/#", 0), ("home/#", 0)]))
        assert c.recv()[0] == 0x90
    assert heard(a_sub, a_pub, "data/b-only") and not heard(a_sub, a_pub, "data/a-only")
    assert heard(b_sub, b_pub, "data/a-only") and not heard(b_sub, b_pub, "data/b-only")
    assert heard(d_sub, d_pub, "data/a-only") and heard(d_sub, d_pub, "data/b-only")  # no ACL in the default tenant
    assert heard(a_sub, a_pub, "home/dev/x") and not heard(a_sub, a_pub, "home/dev@acme/x")  # %u: the tenant-local name
    assert heard(b_sub, b_pub, "home/dev/x")
    for c in (a_sub, a_pub, b_sub, b_pub, d_sub, d_pub):
        c.close()


def test_scram_checks_the_tenants_own_keys(tenants_broker: Broker) -> None:
    """MQTT 5.0 enhanced authentication against acme's file, as the tenant-local user, at CONNECT
    and again later; the same proof does not log into the default tenant."""
    port = tenants_broker.port
    c, _client = scram_connect(port, "dev", "acme-pw", username="dev@acme")
    assert recv_connack(c)[1] == 0
    reauthenticate(c, "dev", "acme-pw")
    assert recv_auth(c)[0] == 0x00
    c.close()
    c, _client = scram_connect(port, "dev", "acme-pw", username="dev")  # the broker's dev has another password
    assert recv_connack(c)[1] == 0x86
    c.close()
    logged_in(port, "root", "root-pw").close()  # the broker's users, in the default tenant


# -- tokens: a tenant's own keys, and the claim of the broker's --------------------------------------------------


def jwks(path: Path, key: rsa.RSAPrivateKey) -> Path:
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    path.write_text(json.dumps({"keys": [dict(jwk, kid="k")]}))
    return path


def token(key: rsa.RSAPrivateKey, **claims: object) -> bytes:
    body = {"sub": "device-1", "exp": time.time() + 300, **claims}
    return jwt.encode(body, key, algorithm="RS256", headers={"kid": "k"}).encode()


def test_tokens_name_the_tenant(tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    """A broker-wide token's claim places its client; a tenant's own token logs in there only, and may
    not claim another tenant."""
    broker_key, gamma_key = (rsa.generate_private_key(public_exponent=65537, key_size=2048) for _ in range(2))
    b = start_broker("--workers", "1", "--config", str(write(tmp_path, (
        f'tenant_separator = "@"\njwt_jwks_file = "{jwks(tmp_path / "broker.jwks", broker_key)}"\n'
        'jwt_tenant_claim = "tenant"\n[tenants.delta]\n[tenants.off]\nenabled = false\n'
        f'[tenants.gamma]\njwt_jwks_file = "{jwks(tmp_path / "gamma.jwks", gamma_key)}"\n'))))
    port = b.port
    d_sub, d_pub = (connected(port, "", token(broker_key, tenant="delta")) for _ in range(2))
    default_sub = connected(port, "", token(broker_key))
    for c in (d_sub, default_sub):
        c.send(p.encode_subscribe(1, [("t/#", 0)]))
        assert c.recv()[0] == 0x90
    assert heard(d_sub, d_pub, "t/1")
    assert not sync(default_sub)  # delta's message stayed in delta
    assert refused(port, "", token(broker_key, tenant="nope")) == 4
    assert refused(port, "", token(broker_key, tenant="gamma")) == 4  # gamma checks logins of its own
    assert refused(port, "", token(broker_key, tenant="off")) == 3
    assert refused(port, "", token(broker_key, tenant=7)) == 4  # a claim that is no name: not a token
    connected(port, "device-1@gamma", token(gamma_key)).close()
    connected(port, "device-1@gamma", token(gamma_key, tenant="gamma")).close()
    assert refused(port, "device-1@gamma", token(gamma_key, tenant="delta")) == 4  # gamma's key, another tenant
    assert refused(port, "device-1@gamma", token(broker_key)) == 4  # the broker's keys are not gamma's
    assert refused(port, "", token(gamma_key, tenant="gamma")) == 4  # gamma's keys are not the broker's
    connected(port, "device-1@delta", token(broker_key, sub="device-1@delta", tenant="delta")).close()
    assert refused(port, "device-1@delta", token(broker_key, sub="device-1@delta", tenant="gamma")) == 4  # suffix: delta
    for c in (d_sub, d_pub, default_sub):
        c.close()


# -- the SQL column --------------------------------------------------------------------------------------------


@pytest.mark.skipif(SERVER is None, reason="no MariaDB server binary (apt-get install mariadb-server)")
def test_the_user_rows_column_names_the_tenant(mariadb: MariaDB, tmp_path: Path,  # noqa: F811  # the fixture
                                              start_broker: Callable[..., Broker]) -> None:
    mariadb.sql("ALTER TABLE plexmq_users ADD COLUMN IF NOT EXISTS tenant VARCHAR(64) NULL")
    names = {name: f"{name}-{uid()}" for name in ("sensor", "plain", "lost", "crossed")}
    for name, tenant in [("sensor", "acme"), ("plain", None), ("lost", "nope"), ("crossed", "beta")]:
        add_user(mariadb, names[name], "pw")
        mariadb.sql("UPDATE plexmq_users SET tenant = %s WHERE username = %s", tenant, names[name])
    watcher = f"watcher-{uid()}@acme"
    add_user(mariadb, watcher, "pw")
    add_user(mariadb, f"{names['crossed']}@acme", "pw")
    mariadb.sql("UPDATE plexmq_users SET tenant = 'beta' WHERE username = %s", f"{names['crossed']}@acme")
    b = start_broker("--workers", "1", "--config", str(write(tmp_path, (
        f'tenant_separator = "@"\nauth_database = "{mariadb.url()}"\nauth_database_tenant_column = "tenant"\n'
        "[tenants.acme]\n[tenants.beta]\n"))))
    port = b.port
    acme_sub = connected(port, watcher, b"pw")  # its suffix names acme, its row nothing
    default_sub = connected(port, names["plain"], b"pw")
    sensor = connected(port, names["sensor"], b"pw")
    for c in (acme_sub, default_sub):
        c.send(p.encode_subscribe(1, [("t/#", 0)]))
        assert c.recv()[0] == 0x90
    assert heard(acme_sub, sensor, "t/1")
    assert not sync(default_sub)
    assert refused(port, names["lost"], b"pw") == 4  # the row names no declared tenant
    assert refused(port, f"{names['crossed']}@acme", b"pw") == 4  # the suffix named acme, the row beta
    connected(port, names["crossed"], b"pw").close()
    for c in (acme_sub, default_sub, sensor):
        c.close()


@pytest.fixture
def acme_database(mariadb: MariaDB) -> Iterator[str]:  # noqa: F811  # the fixture
    """The URL of a database `acme` beside the broker's, with the documented tables, that `plexmq` may read."""
    mariadb.sql("CREATE DATABASE IF NOT EXISTS acme")
    mariadb.sql("GRANT SELECT ON acme.* TO 'plexmq'@'127.0.0.1'")
    try:
        mariadb.sql("USE acme")
        for statement in documented_schema():
            mariadb.sql(statement.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS", 1))
    finally:
        mariadb.sql("USE plexmq")  # the session's other tests add their rows there
    yield mariadb.url().rsplit("/", 1)[0] + "/acme"


@pytest.mark.skipif(SERVER is None, reason="no MariaDB server binary (apt-get install mariadb-server)")
def test_a_tenants_own_database_checks_its_users_only(mariadb: MariaDB, acme_database: str,  # noqa: F811  # the fixture
                                                       tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    local, broker_user = f"dev-{uid()}", f"ops-{uid()}"
    mariadb.sql("REPLACE INTO acme.plexmq_users (username, password_hash) VALUES (%s, %s)", local,
                hash_password("pw", n=CHEAP))
    mariadb.sql("INSERT INTO acme.plexmq_acl (kind, name, access, topic) VALUES ('user', %s, 'readwrite', 'own/#')", local)
    add_user(mariadb, broker_user, "pw")
    add_user(mariadb, f"{broker_user}@acme", "pw")  # the broker's table is never asked for acme's clients
    b = start_broker("--workers", "1", "--config", str(write(tmp_path, (
        f'tenant_separator = "@"\nauth_database = "{mariadb.url()}"\n'
        f'[tenants.acme]\nauth_database = "{acme_database}"\nauth_database_acl = true\n[tenants.beta]\n'))))
    port = b.port
    dev = connected(port, f"{local}@acme", b"pw")  # checked in acme's database as `local`
    dev.send(p.encode_subscribe(1, [("own/#", 0), ("other/#", 0)]))
    assert dev.recv()[1][2:] == bytes([0, 0x80])  # acme's ACL table, its %u-free rule naming the local user
    dev.close()
    assert refused(port, f"{local}@beta", b"pw") == 4
    assert refused(port, local, b"pw") == 4
    assert refused(port, f"{broker_user}@acme", b"pw") == 4
    connected(port, broker_user, b"pw").close()  # the broker's own users still log in


def test_a_tenants_bad_database_url_stops_startup_naming_its_line(tmp_path: Path) -> None:
    message = error(write(tmp_path, '[tenants.acme]\n\nauth_database = "mysql://u:s3cret@host/"\n'))
    assert message.startswith(f"{tmp_path / 'plexmq.toml'}:3: key 'tenants.acme.auth_database': must be a URL"), message
    assert "s3cret" not in message
    message = error(write(tmp_path, '[tenants.acme]\nauth_database_acl = true\n'))
    assert message.startswith(f"{tmp_path / 'plexmq.toml'}:2: key 'tenants.acme.auth_database_acl': needs"), message


# -- the client certificate ------------------------------------------------------------------------------------


def test_the_certificates_subject_names_the_tenant(pki: Pki, tmp_path: Path,  # noqa: F811  # the fixture
                                                   start_broker: Callable[..., Broker]) -> None:
    b = start_broker("--workers", "1", "--config", str(write(tmp_path, (
        'tenant_separator = "@"\ntenant_required = true\ntenant_certificate_field = "CN"\n'
        "[tenants.acme]\n[tenants.beta]\n[tenants.off]\nenabled = false\n"
        + tls_section(pki, cafile=pki.ca, require_certificate=True)))))
    port = port_of(b, "mqtts")

    def answer(cn: str, username: str | None = None) -> int:
        with tls_socket(port, pki, client_certificate(pki, tmp_path, cn)) as s:
            s.sendall(p.encode_connect(f"c-{uid()}", True, 60, username=username))
            return s.recv(4)[3]

    assert answer("acme") == 0 and answer("acme", "dev@acme") == 0 and answer("beta", "me@example") == 0
    assert answer("nope") == 4 and answer("acme", "dev@beta") == 4
    assert answer("off") == 3
