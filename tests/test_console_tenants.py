"""A tenant's admins in the web console (issue 25, `[tenants.NAME] console_admins`): they log in with the
login form's tenant field (a wrong tenant or password is refused), their overview's events carry their
tenant's connections, messages and alarms only and nothing of the broker's (workers, nodes, store), and
the clients page lists and disconnects their tenant's clients only, whatever the request names; a reload
reads the admins files again, and logs out those no longer listed, or of a tenant removed or disabled."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlencode

import orjson

from plexmq.router.ops.alarms import DROPPED
from plexmq.workers.auth.passwords import delete_user, set_password
from tests.cli import CHEAP
from tests.conftest import Broker, wait_for
from tests.console import PASSWORD, Answer, ask, console_broker, event_until, log_in, session
from tests.mqtt import RawClient
from tests.steps import publish, subscribe, uid
from tests.tenants import user

BOSS, BOSS_PASSWORD = "boss", "acme's own secret"


def tenant_broker(start_broker: Callable[..., Broker], tmp_path: Path) -> tuple[Broker, str]:
    """Tenants acme (with the admin BOSS) and other; small queues, so that a subscriber that does not
    acknowledge makes drops."""
    admins = tmp_path / "acme-admins"
    set_password(str(admins), BOSS, BOSS_PASSWORD, n=CHEAP)
    return console_broker(start_broker, tmp_path, config=(
        'tenant_separator = "@"\nmax_inflight = 1\nmax_queued_messages = 1\n\n'
        f'[tenants.acme]\nconsole_admins = "{admins}"\n\n[tenants.other]\n'))


def tenant_login(url: str, tenant: str, password: str = BOSS_PASSWORD, name: str = BOSS) -> Answer:
    form = urlencode({"user": name, "password": password, "tenant": tenant}).encode()
    return ask(url, "POST", "/login", {"Content-Type": "application/x-www-form-urlencoded"}, form)


def tenant_session(url: str) -> dict[str, str]:
    status, headers, _ = tenant_login(url, "acme")
    assert status == 303
    return {"Cookie": headers["set-cookie"].split(";")[0]}


def client_in(port: int, tenant: str, client_id: str) -> RawClient:
    c = RawClient(port)
    assert c.connect(client_id, username=user(tenant, f"u-{uid()}")) == (False, 0)
    return c


def test_a_tenant_admin_logs_in_with_the_tenant_field_and_a_wrong_tenant_or_password_is_refused(
        start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    _b, url = tenant_broker(start_broker, tmp_path)
    assert b'name="tenant"' in ask(url, "GET", "/login")[2]
    for tenant, password in (("acme", "wrong"), ("other", BOSS_PASSWORD), ("", BOSS_PASSWORD), ("nobody", BOSS_PASSWORD)):
        status, headers, page = tenant_login(url, tenant, password)
        assert status == 401 and b"Wrong user or password." in page and "set-cookie" not in headers, tenant
    cookie = tenant_session(url)
    status, _, page = ask(url, "GET", "/", cookie)
    assert status == 200 and f"{BOSS} (tenant acme)".encode() in page


def test_a_tenant_admin_sees_and_acts_on_the_tenants_clients_and_alarms_only(
        start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    b, url = tenant_broker(start_broker, tmp_path)
    mine_ids, their_ids = [f"acme-{i}-{uid()}" for i in range(2)], [f"other-{i}-{uid()}" for i in range(3)]
    mine = [client_in(b.port, "acme", client_id) for client_id in mine_ids]
    theirs = [client_in(b.port, "other", client_id) for client_id in their_ids]
    cookie = tenant_session(url)
    broker_cookie, _ = session(url)

    event = event_until(url, cookie, lambda e: e["connections"] == 2, what="acme's two connections")
    assert event["tenant"] == "acme" and not {"workers", "nodes", "store", "router"} & event.keys()
    assert event_until(url, broker_cookie, lambda e: e["connections"] == 5, what="the broker's five")["workers"]

    for asked in ("", "&tenant=other", "&tenant="):
        status, _, body = ask(url, "GET", f"/api/clients?limit=100{asked}", cookie)
        listed = orjson.loads(body)
        assert status == 200 and {row[0] for row in listed["clients"]} == set(mine_ids), asked
        assert {row[listed["fields"].index("tenant")] for row in listed["clients"]} == {"acme"}

    status, _, page = ask(url, "GET", "/", cookie)
    csrf = page.split(b'<meta name="csrf" content="')[1].split(b'"')[0].decode()
    target = their_ids[0]
    for named in ("other", "acme"):
        body = orjson.dumps({"client_id": target, "tenant": named})
        status, _, said = ask(url, "POST", "/api/clients/disconnect",
                              {**cookie, "Content-Type": "application/json", "X-CSRF-Token": csrf}, body)
        assert status == 404 and said.endswith(b" is not connected\n"), named
    status, _, body = ask(url, "GET", "/api/clients?tenant=other", broker_cookie)
    assert target in {row[0] for row in orjson.loads(body)["clients"]}  # still connected

    # drops in other: the broker's alarm names the tenant, acme's admin sees none; then drops in acme
    overflow(b.port, "other", theirs[1])
    event = event_until(url, broker_cookie, lambda e: any(a["name"] == DROPPED for a in e["alarms"]), what="drops")
    assert "'other'" in next(a for a in event["alarms"] if a["name"] == DROPPED)["details"]
    assert event_until(url, cookie, lambda e: True)["alarms"] == []
    overflow(b.port, "acme", mine[0])
    event = event_until(url, cookie, lambda e: e["alarms"] != [], what="acme's drop alarm")
    assert [(a["name"], a["tenant"], a["what"]) for a in event["alarms"]] == [
        (DROPPED, "acme", "messages dropped in tenant 'acme'")]
    for c in [*mine, *theirs]:
        c.close()


def overflow(port: int, tenant: str, subscriber: RawClient) -> None:
    """`subscriber` (of `tenant`) subscribes and never acknowledges; a publisher of the tenant sends it
    more than its window and queue hold (max_inflight 1, max_queued_messages 1)."""
    topic = f"console/tenants/{uid()}"
    assert subscribe(subscriber, 1, [(topic, 1)]) == [1]
    publisher = client_in(port, tenant, f"pub-{uid()}")
    for i in range(6):
        publish(publisher, topic, b"m%d" % i, 1, packet_id=i + 1)
    publisher.close()


def test_a_reload_logs_out_the_admins_no_longer_listed_and_those_of_a_tenant_removed_or_disabled(
        start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path, tenants=("acme", "beta"))
    set_password(str(tmp_path / "admins"), "eve", PASSWORD, n=CHEAP)  # a new admin: she logs in after a reload
    assert log_in(url, user="eve")[0] == 401
    b.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "console: admins reloaded" in b.output(), 10, "the console's reload")
    ops, eve, acme, beta = session(url), session(url, user="eve"), session(url, "acme"), session(url, "beta")
    delete_user(str(tmp_path / "admins"), "eve")
    config = tmp_path / "plexmq.toml"
    text = config.read_text().split("[tenants.beta]")[0]  # beta removed
    config.write_text(text.replace("[tenants.acme]\n", "[tenants.acme]\nenabled = false\n"))  # acme disabled
    b.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: b.output().count("console: admins reloaded") == 2, 10, "the console's second reload")
    assert "console: admins reloaded; logged out, no longer admins: 'eve', 'ops' of tenant 'acme', 'ops' of tenant " \
           "'beta'" in b.output()
    for cookie, csrf in (eve, acme, beta):
        assert ask(url, "GET", "/api/retained", cookie)[0] == 401
        assert ask(url, "POST", "/api/retained/delete", {**cookie, "Content-Type": "application/json",
                                                          "X-CSRF-Token": csrf}, b'{"topic": "t"}')[0] == 401
    assert [log_in(url, user="eve")[0], log_in(url, tenant="acme")[0], log_in(url, tenant="beta")[0]] == [401] * 3
    assert ask(url, "GET", "/api/retained", ops[0])[0] == 200  # the one still listed keeps her session
