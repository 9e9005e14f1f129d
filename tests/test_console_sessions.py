"""The console's sessions page over HTTP (issue 25): the offline persistent sessions with their queues
and expiry, removed as expiry would (and still gone after a restart), a connected one refused; the
busiest filters and topics; the shared groups and their members; a tenant admin kept to the tenant."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlencode

import orjson
import paho.mqtt.client as paho

from plexmq.workers.auth.passwords import set_password
from plexmq.workers.topic_sample import SAMPLE, TopicSample
from tests.cli import CHEAP
from tests.conftest import Broker, wait_for
from tests.console import ADMIN, PASSWORD, ask, console_broker, console_url, session
from tests.mqtt import Client
from tests.steps import uid

Login = tuple[dict[str, str], str]  # the Cookie header and the CSRF token


def api(url: str, login: Login, path: str) -> dict:
    status, _, body = ask(url, "GET", path, login[0])
    assert status == 200, body
    return orjson.loads(body)


def remove(url: str, login: Login, client_id: str, tenant: str = "") -> tuple[int, str]:
    headers = {**login[0], "X-CSRF-Token": login[1], "Content-Type": "application/json"}
    status, _, body = ask(url, "POST", "/api/sessions/remove", headers,
                          orjson.dumps({"client_id": client_id, "tenant": tenant}))
    return status, body.decode().strip()


def offline(url: str, login: Login, prefix: str, tenant: str | None = None) -> dict[str, list]:
    """The offline sessions whose client id starts with `prefix`: client id -> its row."""
    query = urlencode({"prefix": prefix, **({} if tenant is None else {"tenant": tenant})})
    return {row[0]: row for row in api(url, login, f"/api/sessions?{query}")["rows"]}


def test_an_offline_session_is_listed_with_its_queue_and_removed_for_good(start_broker: Callable[..., Broker],
                                                                          tmp_path: Path) -> None:
    data = tmp_path / "store"
    b, url = console_broker(start_broker, tmp_path, "--data-dir", str(data))
    login = session(url)
    kept, keeper, live = f"kept-{uid()}", f"keeper-{uid()}", f"live-{uid()}"
    before = time.time()
    for client_id in (kept, keeper):
        subscriber = Client(b.port, client_id, clean=False, protocol=paho.MQTTv5, session_expiry=3600)
        subscriber.subscribe(f"queue/{client_id}", 1)
        subscriber.disconnect()
    publisher = Client(b.port, f"pub-{uid()}")
    for n in range(3):
        publisher.publish(f"queue/{keeper}", b"x" * 10 + bytes([n]), qos=1)  # its PUBACK: queued by the router
    publisher.disconnect()
    row = wait_for(lambda: offline(url, login, keeper).get(keeper), 10, "the offline session listed")
    client_id, tenant, queued, queued_bytes, ends, subscriptions = row
    assert (client_id, tenant, queued, queued_bytes, subscriptions) == (keeper, "", 3, 33, 1)
    assert before + 3600 <= ends <= time.time() + 3600

    connected = Client(b.port, live, clean=False)
    assert remove(url, login, live) == (409, f"{live} is connected: disconnect it first (Clients), then remove its session")
    assert live not in offline(url, login, "")
    connected.disconnect()

    assert remove(url, login, keeper) == (200, f"removed the session of {keeper}")
    assert keeper not in offline(url, login, "")
    assert remove(url, login, keeper)[0] == 404
    wait_for(lambda: f"console: {ADMIN!r} from 127.0.0.1: session {keeper!r}: removed" in b.output(), 10,
             "the removal logged with who asked")
    b.stop()

    b = start_broker("--config", str(tmp_path / "plexmq.toml"), "--workers", "2", "--console-port", "0",
                     "--data-dir", str(data))
    url = console_url(b)
    login = session(url)
    listed = wait_for(lambda: offline(url, login, "") or None, 10, "the stored sessions back")
    assert kept in listed and keeper not in listed
    again = Client(b.port, keeper, clean=False)
    assert not again.session_present  # nothing of it was kept
    again.disconnect()


def test_busiest_filters_topics_and_shared_groups(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path)
    login = session(url)
    ids = [f"sub{n}-{uid()}" for n in range(5)]
    clients = [Client(b.port, client_id) for client_id in ids]
    for c in clients[:3]:
        c.subscribe("busy/three")
    clients[3].subscribe("busy/one")
    for c in clients[3:]:
        c.subscribe("$share/workers/jobs/#", 1)
    filters = api(url, login, "/api/filters")
    ranked = [(f, n) for _tenant, f, n in filters["rows"]]
    assert filters["complete"] and ranked.index(("busy/three", 3)) < ranked.index(("busy/one", 1))
    assert ("jobs/#", 2) in ranked  # the members of a shared group are its filter's subscribers

    groups = api(url, login, "/api/groups")
    assert groups["total"] == 1
    assert groups["rows"] == [{"tenant": "", "group": "workers", "filter": "jobs/#", "strategy": "round_robin",
                               "members": [[ids[3], True], [ids[4], True]], "count": 2}]

    publisher = Client(b.port, f"pub-{uid()}")
    stop = threading.Event()

    def publish() -> None:
        while not stop.wait(0.002):  # a steady load, not a wait for anything
            publisher.publish("busy/hot", b"load")

    load = threading.Thread(target=publish, daemon=True)
    load.start()
    try:
        rates = wait_for(lambda: {topic: rate for _tenant, topic, rate in api(url, login, "/api/topics")["rows"]
                                  if topic == "busy/hot" and rate > 0}, 30, "the steady topic among the busiest")
        assert rates["busy/hot"] > 0
    finally:
        stop.set()
        load.join()
        publisher.disconnect()
    for c in clients:
        c.disconnect()


TENANTS = """tenant_separator = "@"

[tenants.acme]
console_admins = "{admins}"

[tenants.beta]
"""


def test_a_tenant_admin_sees_and_removes_only_the_tenants_sessions(start_broker: Callable[..., Broker],
                                                                   tmp_path: Path) -> None:
    admins, acme_admins = tmp_path / "admins", tmp_path / "acme-admins"
    set_password(str(admins), ADMIN, PASSWORD, n=CHEAP)
    set_password(str(acme_admins), "boss", "acme secret", n=CHEAP)
    config = tmp_path / "plexmq.toml"
    config.write_text(f'console_admins = "{admins}"\n' + TENANTS.format(admins=acme_admins))
    b = start_broker("--config", str(config), "--workers", "2", "--console-port", "0")
    url = console_url(b)
    broker_admin = session(url)
    status, headers, _ = ask(url, "POST", "/login", {"Content-Type": "application/x-www-form-urlencoded"},
                             urlencode({"user": "boss", "password": "acme secret", "tenant": "acme"}).encode())
    assert status == 303
    cookie = {"Cookie": headers["set-cookie"].split(";")[0]}
    acme = (cookie, session_csrf(url, cookie))
    for tenant in ("acme", "beta"):
        c = Client(b.port, f"{tenant}-dev", clean=False, username=f"dev@{tenant}")
        c.subscribe(f"{tenant}/data", 1)
        c.subscribe("$share/g/shared/#", 1)
        c.disconnect()
    wait_for(lambda: [row[:2] for row in api(url, broker_admin, "/api/sessions")["rows"]]
             == [["acme-dev", "acme"], ["beta-dev", "beta"]], 10, "both tenants' offline sessions")
    assert [row[1] for row in api(url, broker_admin, "/api/sessions?tenant=beta")["rows"]] == ["beta"]

    for asked in ("/api/sessions", "/api/sessions?tenant=beta", "/api/sessions?tenant=", "/api/sessions?prefix=beta"):
        assert [row[0] for row in api(url, acme, asked)["rows"]] == ([] if "prefix" in asked else ["acme-dev"])
    for asked in ("/api/groups", "/api/groups?tenant=beta"):
        assert [(g["tenant"], g["members"]) for g in api(url, acme, asked)["rows"]] == [("acme", [["acme-dev", False]])]
    assert {row[0] for row in api(url, acme, "/api/filters?tenant=beta")["rows"]} == {"acme"}

    assert remove(url, acme, "beta-dev", "beta") == (404, "beta-dev of tenant acme has no persistent session")
    assert [row[0] for row in api(url, broker_admin, "/api/sessions")["rows"]] == ["acme-dev", "beta-dev"]
    assert remove(url, acme, "acme-dev") == (200, "removed the session of acme-dev of tenant acme")
    assert [row[0] for row in api(url, broker_admin, "/api/sessions")["rows"]] == ["beta-dev"]


def session_csrf(url: str, cookie: dict[str, str]) -> str:
    """The CSRF token of a logged-in session (from the sessions page)."""
    _, _, page = ask(url, "GET", "/sessions", cookie)
    return page.split(b'<meta name="csrf" content="')[1].split(b'"')[0].decode()


def test_a_worker_tallies_one_publish_in_sample_runs_included() -> None:
    sample, countdown = TopicSample(), SAMPLE
    for _ in range(3 * SAMPLE):  # single PUBLISHes, as `Worker.publish` counts them down
        countdown -= 1
        if countdown <= 0:
            countdown = sample.take("t", b"one", countdown)
    countdown -= 2 * SAMPLE + 5  # a run of QoS 0 packets (`Worker.publish_run`)
    if countdown <= 0:
        countdown = sample.take("t", b"run", countdown)
    assert countdown == SAMPLE - 5
    assert sample.report() == {"t": [["one", 3 * SAMPLE], ["run", 2 * SAMPLE]]}
    assert sample.report() == {}  # each report starts afresh
