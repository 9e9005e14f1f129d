"""A forged request in a real browser: an operator logged in to the console visits another site's page,
which makes the browser post a disconnect to the console (a cross-site form, the text/plain JSON
trick) and fetch one with the operator's cookie. Both are refused (the Origin is not the console's, and
neither carries the session's CSRF token) and the client stays connected."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson

from tests.conftest import Broker, wait_for
from tests.console import PASSWORD, ask, console_broker, session
from tests.console_browser import forge, log_in
from tests.mqtt import RawClient
from tests.steps import uid


def test_a_forged_disconnect_from_another_site_is_refused_and_the_client_stays(
        start_broker: Callable[..., Broker], tmp_path: Path, browser, attacker) -> None:  # noqa: ANN001
    b, url = console_broker(start_broker, tmp_path)
    client_id = f"victim-{uid()}"
    victim = RawClient(b.port)
    assert victim.connect(client_id) == (False, 0)
    log_in(browser, url, PASSWORD)
    wait_for(lambda: browser.current_url == url + "/", 10, "the overview")
    forge(browser, attacker, url, "/api/clients/disconnect", {"client_id": client_id, "tenant": ""})
    cookie, _csrf = session(url)
    status, _, body = ask(url, "GET", f"/api/clients?filter={client_id}", cookie)
    assert status == 200 and [row[0] for row in orjson.loads(body)["clients"]] == [client_id]
    assert f"disconnected {client_id!r}" not in b.output()
    victim.send(b"\xc0\x00")  # PINGREQ: the connection is still served
    assert victim.recv() == (0xD0, b"")
    victim.close()
