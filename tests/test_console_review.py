"""The web console under an adversarial review: what a tenant admin's request says of another tenant,
how long a session and its event stream outlive a logout, how many sessions one admin may pile up, the
login throttle against a guesser that changes its address, and requests whose head is malformed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson

from tests.conftest import Broker, wait_for
from tests.console import ask, console_broker, session
from tests.mqtt import RawClient
from tests.steps import uid
from tests.tenants import user


def test_a_tenant_admins_disconnect_names_the_tenant_it_acted_on_whatever_the_body_says(
        start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path, tenants=("acme", "beta"))
    target = f"c-{uid()}"
    theirs = RawClient(b.port)
    assert theirs.connect(target, username=user("beta", f"u-{uid()}")) == (False, 0)
    cookie, csrf = session(url, "acme")
    status, _, said = ask(url, "POST", "/api/clients/disconnect",
                          {**cookie, "Content-Type": "application/json", "X-CSRF-Token": csrf},
                          orjson.dumps({"client_id": target, "tenant": "beta"}))
    assert status == 404 and said == f"{target} of tenant acme is not connected\n".encode()
    wait_for(lambda: f"'{target} of tenant acme' is not connected" in b.output(), 10, "the log line naming acme")
    broker_cookie, _ = session(url)
    listed = orjson.loads(ask(url, "GET", "/api/clients?tenant=beta", broker_cookie)[2])
    assert target in {row[0] for row in listed["clients"]}  # beta's client is still connected
    theirs.close()


def test_a_malformed_content_length_is_refused_and_the_console_keeps_serving(
        start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    _b, url = console_broker(start_broker, tmp_path)
    cookie, csrf = session(url)
    form = {"Content-Type": "application/x-www-form-urlencoded", "Content-Length": "x"}
    assert ask(url, "POST", "/login", form)[0] == 401
    for length in ("x", "-5", "\u00b2"):  # none of them is a length the endpoint waits for
        for path in ("/api/sessions/remove", "/api/retained/delete", "/api/clients/disconnect"):
            status, _, _ = ask(url, "POST", path, {**cookie, "Content-Type": "application/json", "X-CSRF-Token": csrf,
                                                   "Content-Length": length})
            assert status == 400, (path, length)
    assert ask(url, "GET", "/api/clients", cookie)[0] == 200
