"""A forged request in a real browser: an operator logged in to the console visits another site's page,
which makes the browser post a disconnect to the console (a cross-site form, the text/plain JSON
trick) and fetch one with the operator's cookie. Both are refused (the Origin is not the console's, and
neither carries the session's CSRF token) and the client stays connected."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest

from tests.conftest import Broker, wait_for
from tests.console import PASSWORD, ask, console_broker, session
from tests.console_browser import log_in
from tests.mqtt import RawClient
from tests.steps import uid


def attack_page(console: str, client_id: str) -> bytes:
    """A page of another origin that posts a disconnect of `client_id` to `console` as soon as it loads,
    first as a credentialed fetch, then as a form in its place."""
    body = orjson.dumps({"client_id": client_id, "tenant": ""}).decode()
    name, value = body[:-2] + ', "x": "', '"}'  # the form sends NAME=VALUE: together, the JSON body
    return f"""<!doctype html><html><body>
<form id="forged" method="post" action="{console}/api/clients/disconnect" enctype="text/plain">
<input name='{name}' value='{value}'></form>
<p id="fetched">pending</p>
<script>
const sent = () => {{ document.getElementById("fetched").textContent = "sent";
  setTimeout(() => document.getElementById("forged").submit(), 300); }};  // then the form, in the page's place
fetch("{console}/api/clients/disconnect", {{method: "POST", credentials: "include", mode: "no-cors",
  headers: {{"Content-Type": "text/plain"}}, body: '{body}'}}).then(sent, sent);
</script></body></html>""".encode()


@pytest.fixture
def attacker() -> Iterator[tuple[str, Callable[[bytes], None]]]:
    """Another site on loopback (another port: another origin): its URL and a setter of its page."""
    page = [b""]

    class Site(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802  http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(page[0])

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Site)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", lambda html: page.__setitem__(0, html)
    server.shutdown()


def test_a_forged_disconnect_from_another_site_is_refused_and_the_client_stays(
        start_broker: Callable[..., Broker], tmp_path: Path, browser, attacker) -> None:  # noqa: ANN001
    b, url = console_broker(start_broker, tmp_path)
    client_id = f"victim-{uid()}"
    victim = RawClient(b.port)
    assert victim.connect(client_id) == (False, 0)
    log_in(browser, url, PASSWORD)
    wait_for(lambda: browser.current_url == url + "/", 10, "the overview")
    site, set_page = attacker
    set_page(attack_page(url, client_id))
    browser.get(site + "/")
    wait_for(lambda: browser.current_url.startswith(url + "/api/"), 10, "the forged form posted (after the fetch)")
    wait_for(lambda: "is not this endpoint" in browser.find_element("tag name", "body").text, 10,
             "the forged form's refusal")
    cookie, _csrf = session(url)
    status, _, body = ask(url, "GET", f"/api/clients?filter={client_id}", cookie)
    assert status == 200 and [row[0] for row in orjson.loads(body)["clients"]] == [client_id]
    assert f"disconnected {client_id!r}" not in b.output()
    victim.send(b"\xc0\x00")  # PINGREQ: the connection is still served
    assert victim.recv() == (0xD0, b"")
    victim.close()
