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
