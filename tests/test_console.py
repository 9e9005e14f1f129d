"""The web console over HTTP (issue 25, first increment): off with console_port = -1; every page but the
login behind a session; wrong passwords refused and logged; a POST only with the session's CSRF token
and under the console's own name; the live figures over server-sent events; the clients found and
disconnected through the admin path."""

from __future__ import annotations

import http.client
import re
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import orjson

from plexmq.mqtt import properties as P
from plexmq.mqtt import v5
from plexmq.router.console.app import REFUSALS_LOGGED
from tests.cli import health, metrics_url
from tests.conftest import Broker, wait_for
from tests.console import ADMIN, ask, console_broker, log_in, session
from tests.mqtt import RawClient
from tests.steps import connect, uid


def test_the_console_is_off_with_port_minus_one(start_broker: Callable[..., Broker]) -> None:
    b = start_broker("--workers", "1", "--console-port", "-1")
    url = metrics_url(b)
    wait_for(lambda: health(url) == 200, 15, "/health: the router's loop runs, its endpoints started before it")
    assert re.search(r"INFO plexmq\.router\[\d+\]: console on |no console: ", b.output()) is None


def test_login_is_required_and_wrong_passwords_are_refused_and_logged(start_broker: Callable[..., Broker],
                                                                      tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path)
    for path in ("/", "/clients"):
        status, headers, _ = ask(url, "GET", path)
        assert (status, headers["location"]) == (303, "/login")
    assert ask(url, "GET", "/api/clients")[0] == 401
    assert ask(url, "GET", "/events")[0] == 401
    status, _, page = ask(url, "GET", "/login")
    assert status == 200 and b'name="password"' in page
    status, headers, page = log_in(url, "wrong")
    assert status == 401 and b"Wrong user or password." in page and "set-cookie" not in headers
    wait_for(lambda: f"console login refused for {ADMIN!r} from 127.0.0.1" in b.output(), 10, "the refusal logged")
    status, headers, _ = log_in(url)
    assert status == 303 and headers["location"] == "/"
    cookie = headers["set-cookie"]
    assert cookie.startswith("plexmq_console=") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert ask(url, "GET", "/clients", {"Cookie": cookie.split(";")[0]})[0] == 200
    assert ask(url, "GET", "/", {"Cookie": "plexmq_console=guessed"})[0] == 303


def test_without_admins_every_login_is_refused(start_broker: Callable[..., Broker]) -> None:
    b = start_broker("--workers", "1", "--console-port", "0")
    url = wait_for(lambda: re.search(r"console on (http://\S+)/", b.output()), 10, "the console line").group(1)
    assert b"console_admins is empty" in ask(url, "GET", "/login")[2]
    assert log_in(url)[0] == 401


def test_a_client_is_found_and_disconnected_only_with_the_csrf_token_and_our_origin(
        start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path)
    cookie, csrf = session(url)
    client_id = f"console-{uid()}"
    target = RawClient(b.port)
    assert target.connect5(client_id)[1] == 0
    other = connect(b.port)

    def listed() -> list[str]:
        status, _, body = ask(url, "GET", f"/api/clients?filter={client_id}", cookie)
        assert status == 200
        return [row[0] for row in orjson.loads(body)["clients"]]

    assert wait_for(listed, 10, "the client listed") == [client_id]
    port = urlsplit(url).port
    body = orjson.dumps({"client_id": client_id})
    as_json = {**cookie, "Content-Type": "application/json"}
    assert ask(url, "POST", "/api/clients/disconnect", as_json, body)[0] == 403
    assert ask(url, "POST", "/api/clients/disconnect", {**as_json, "X-CSRF-Token": "guess"}, body)[0] == 403
    forged = {**as_json, "X-CSRF-Token": csrf, "Origin": "http://attacker.example"}
    assert ask(url, "POST", "/api/clients/disconnect", forged, body)[0] == 403
    rebound = {**as_json, "X-CSRF-Token": csrf, "Host": f"rebound.example:{port}"}
    assert ask(url, "POST", "/api/clients/disconnect", rebound, body)[0] == 421
    assert listed() == [client_id]  # none of them did anything
    ours = {**as_json, "X-CSRF-Token": csrf, "Origin": f"http://127.0.0.1:{port}"}
    status, _, said = ask(url, "POST", "/api/clients/disconnect", ours, body)
    assert (status, said) == (200, f"disconnected {client_id}\n".encode())
    data = target.read_until_closed()
    found = v5.frame(data, 0, len(data) + 1)
    assert found is not None and found[0] == 0xE0
    code, props = v5.decode_reason_only(v5.DISCONNECT, 0, data[found[1]:found[2]])
    assert code == 0x98 and props[P.REASON_STRING] == "disconnected by an administrator"
    other.close()


def test_requests_refused_for_a_foreign_origin_are_logged_a_bounded_number_of_lines(
        start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path)
    cookie, csrf = session(url)
    foreign = {**cookie, "X-CSRF-Token": csrf, "Origin": "http://127.0.0.1:8000"}  # a page on another port
    for _ in range(REFUSALS_LOGGED + 5):
        assert ask(url, "POST", "/logout", foreign)[0] == 403
    line = "console: POST /logout from 127.0.0.1 refused: Origin 'http://127.0.0.1:8000' is not this endpoint"
    assert log_in(url, "wrong")[0] == 401  # a line the router logs after them: once it is out, they all are
    wait_for(lambda: f"console login refused for {ADMIN!r}" in b.output(), 10, "the wrong login's line")
    assert b.output().count(line) == REFUSALS_LOGGED  # within a minute: the rest are not logged


def test_the_overview_streams_the_figures_as_json_events(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path)
    cookie, _csrf = session(url)
    client = connect(b.port)
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=15)
    try:
        conn.request("GET", "/events", headers=cookie)
        answer = conn.getresponse()
        assert answer.status == 200 and answer.getheader("Content-Type") == "text/event-stream"
        events: list[dict] = []
        while len(events) < 3:
            line = answer.fp.readline()
            assert line, "the stream ended"
            if line.startswith(b"data: "):
                events.append(orjson.loads(line[6:]))
    finally:
        conn.close()
    first, second, third = events
    assert first["at"] < second["at"] < third["at"]
    assert first["rates"] == dict.fromkeys(("received", "sent", "dropped", "bytes_in", "bytes_out"))
    assert all(isinstance(rate, float) for rate in third["rates"].values())
    assert third["connections"] >= 1 and set(third["totals"]) == {"received", "sent", "dropped", "bytes_in", "bytes_out"}
    assert len(third["workers"]) == 2 and {w["state"] for w in third["workers"].values()} == {"up"}
    assert third["version"] and third["uptime"] >= 0
    client.close()


def test_the_clients_search_pages_across_workers_and_picks_a_protocol_version(
        start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path)
    cookie, _csrf = session(url)
    prefix = f"page-{uid()}"
    held = []
    for i in range(5):  # spread over both workers by the acceptor; 3.1.1 and 5.0 alternating
        client = RawClient(b.port)
        if i % 2:
            assert client.connect5(f"{prefix}-{i}")[1] == 0
        else:
            assert client.connect(f"{prefix}-{i}") == (False, 0)
        held.append(client)

    def page(query: str) -> dict:
        status, _, body = ask(url, "GET", f"/api/clients?filter={prefix}&{query}", cookie)
        assert status == 200, body
        return orjson.loads(body)

    first = wait_for(lambda: (listed := page("limit=2"))["total"] == 5 and listed, 10, "all five connected")
    assert [row[0] for row in first["clients"]] == [f"{prefix}-0", f"{prefix}-1"]
    assert len({row[1] for row in page("limit=5")["clients"]}) == 2  # both workers hold some
    assert [row[0] for row in page("offset=2&limit=2")["clients"]] == [f"{prefix}-2", f"{prefix}-3"]
    v5_only = page("protocol=5.0")
    assert (v5_only["total"], [row[0] for row in v5_only["clients"]]) == (2, [f"{prefix}-1", f"{prefix}-3"])
    assert page("protocol=3.1.1")["total"] == 3
    for bad in ("protocol=4", "limit=0", "offset=-1", "offset=99990&limit=100"):
        assert ask(url, "GET", f"/api/clients?{bad}", cookie)[0] == 400, bad
    for client in held:
        client.close()
