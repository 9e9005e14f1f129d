"""A client's own page in the console (issue 25) over HTTP on the real broker: its connection as its
worker lists it (the exact id, not every id that contains it) with its in-flight and queued counts,
its subscriptions with their QoS and options from the router's session; an unknown client is not
connected, and a persistent session offline is said to be; a tenant admin sees only the tenant's
clients."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlencode

import orjson

from plexmq import grants
from plexmq.mqtt import properties as P
from plexmq.mqtt import v4, v5
from tests.conftest import Broker, wait_for
from tests.console import ask, console_broker, session
from tests.mqtt import Client, RawClient
from tests.steps import connect, publish, subscribe, uid

Cookie = dict[str, str]


def client_page(url: str, cookie: Cookie, client_id: str, tenant: str = "") -> tuple[int, dict]:
    status, _, body = ask(url, "GET", f"/api/client?{urlencode({'id': client_id, 'tenant': tenant})}", cookie)
    assert status in (200, 404), body
    return status, orjson.loads(body)


def test_a_clients_page_shows_its_connection_counts_and_subscriptions(start_broker: Callable[..., Broker],
                                                                      tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path)
    cookie, _csrf = session(url)
    client_id = f"page-{uid()}"
    subscriber = connect(b.port, client_id)  # reads nothing: its QoS 1 messages stay in flight, then queue
    assert subscribe(subscriber, 1, [(f"{client_id}/#", 1), ("other/+", 0)]) == [1, 0]
    near = connect(b.port, f"{client_id}-2")  # an id that contains the first
    five = RawClient(b.port)
    assert five.connect5(f"{client_id}-5")[1] == 0
    options = 2 | grants.NO_LOCAL | grants.RETAIN_AS_PUBLISHED | 0x20  # retain handling 2
    five.send(v5.encode_subscribe(1, [(f"{client_id}/five", options)], {P.SUBSCRIPTION_IDENTIFIER: 7}))
    assert five.recv()[0] == 0x90
    publisher = connect(b.port)
    for packet_id in range(1, 26):  # max_inflight (20) in flight, 5 queued behind them
        publish(publisher, f"{client_id}/x", b"m", qos=1, packet_id=packet_id)

    def counted() -> dict | None:
        status, found = client_page(url, cookie, client_id)
        connection = found["connection"]
        return found if status == 200 and (connection["inflight"], connection["queued"]) == (20, 5) else None

    found = wait_for(counted, 10, "the page to count 20 in flight and 5 queued")
    connection = found["connection"]
    assert (connection["client_id"], connection["protocol"], connection["keepalive"], connection["persistent"],
            connection["tenant"]) == (client_id, "3.1.1", 60, False, "")
    assert connection["address"].startswith("127.0.0.1:") and found["complete"]
    held = found["session"]
    assert (held["persistent"], held["online"], held["subscription_count"]) == (False, True, 2)
    assert [(s["filter"], s["qos"]) for s in held["subscriptions"]] == [("other/+", 0), (f"{client_id}/#", 1)]  # by filter
    status, found = client_page(url, cookie, f"{client_id}-5")
    assert status == 200 and found["connection"]["protocol"] == "5.0"
    assert found["session"]["subscriptions"] == [{"filter": f"{client_id}/five", "qos": 2, "no_local": True,
                                                  "retain_as_published": True, "retain_handling": 2, "identifier": 7}]
    assert ask(url, "GET", "/client?id=x", cookie)[0] == 200  # the page itself, filled in by its script
    assert b'href="/client"' not in ask(url, "GET", "/", cookie)[2]  # reached from the clients, not the navigation
    for c in (subscriber, near, five, publisher):
        c.close()


def test_an_unknown_client_is_not_connected_and_an_offline_session_is_said(start_broker: Callable[..., Broker],
                                                                           tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path)
    cookie, _csrf = session(url)
    nobody = f"nobody-{uid()}"
    assert client_page(url, cookie, nobody) == (404, {"client_id": nobody, "tenant": "", "complete": True,
                                                      "connection": None, "session": None})
    client_id = f"kept-{uid()}"
    kept = connect(b.port, client_id, clean=False)
    subscribe(kept, 1, [(f"{client_id}/#", 1)])
    kept.send(v4.DISCONNECT_PACKET)
    kept.close()

    def offline() -> dict | None:
        status, found = client_page(url, cookie, client_id)
        return found if status == 200 and not found["session"]["online"] else None

    found = wait_for(offline, 10, "the session offline")
    assert found["connection"] is None and found["session"]["persistent"] and found["session"]["offline_since"] > 0
    assert [s["filter"] for s in found["session"]["subscriptions"]] == [f"{client_id}/#"]


def test_a_tenant_admin_sees_only_the_tenants_clients(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path, tenants=("acme", "beta"))
    client_id = f"dev-{uid()}"  # one id in each tenant
    clients = {tenant: Client(b.port, client_id, username=f"dev@{tenant}") for tenant in ("acme", "beta")}
    clients["beta"].subscribe("beta/only", 1)
    acme, _csrf = session(url, "acme")
    admin, _csrf = session(url)
    status, found = client_page(url, acme, client_id, "beta")  # its own tenant's client, whatever it asks
    assert status == 200 and found["tenant"] == "acme" and found["session"]["subscriptions"] == []
    status, found = client_page(url, admin, client_id, "beta")
    assert status == 200 and [s["filter"] for s in found["session"]["subscriptions"]] == ["beta/only"]
    clients["acme"].disconnect()
    wait_for(lambda: client_page(url, acme, client_id)[0] == 404, 10, "acme's client gone")
    assert client_page(url, acme, client_id, "beta")[0] == 404  # beta's is there, and not for acme's admin
    assert client_page(url, admin, client_id, "beta")[0] == 200
    clients["beta"].disconnect()
