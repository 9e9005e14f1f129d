"""What the web console's tests share: a broker with a console and one admin, its address, requests and
a logged-in session over plain HTTP, and the overview's event stream read until an event says what a
test waits for (the browser's part: tests/console_browser.py)."""

from __future__ import annotations

import http.client
import re
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import orjson

from plexmq.workers.auth.passwords import set_password
from tests.cli import CHEAP
from tests.conftest import Broker, wait_for

ADMIN, PASSWORD = "ops", "correct horse battery"

Answer = tuple[int, dict[str, str], bytes]


def ask(url: str, method: str, path: str, headers: dict[str, str] | None = None, body: bytes | None = None,
        context: ssl.SSLContext | None = None) -> Answer:
    """Status, headers (lower-case names) and body of one request, redirects not followed; over HTTPS
    with `context`."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=15) if context is None else \
        http.client.HTTPSConnection(parts.hostname or "", parts.port, timeout=15, context=context)
    try:
        conn.request(method, path, body, headers or {})
        answer = conn.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        conn.close()


def log_in(url: str, password: str = PASSWORD, tenant: str = "", user: str = ADMIN) -> Answer:
    form = urlencode({"user": user, "password": password, "tenant": tenant}).encode()
    return ask(url, "POST", "/login", {"Content-Type": "application/x-www-form-urlencoded"}, form)


def log_in_from(url: str, address: str, password: str, tenant: str = "") -> Answer:
    """A login from the local address `address` (any of 127.0.0.0/8 reaches a console on 127.0.0.1)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=15, source_address=(address, 0))
    try:
        conn.request("POST", "/login", urlencode({"user": ADMIN, "password": password, "tenant": tenant}).encode(),
                     {"Content-Type": "application/x-www-form-urlencoded"})
        answer = conn.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        conn.close()


def session(url: str, tenant: str = "", user: str = ADMIN) -> tuple[dict[str, str], str]:
    """A logged-in session (a broker admin's, or with `tenant` that tenant's admin's): its Cookie header
    and its CSRF token (from the overview page)."""
    status, headers, _ = log_in(url, tenant=tenant, user=user)
    assert status == 303
    cookie = {"Cookie": headers["set-cookie"].split(";")[0]}
    status, _, page = ask(url, "GET", "/", cookie)
    assert status == 200
    found = re.search(rb'<meta name="csrf" content="([^"]+)">', page)
    assert found is not None
    return cookie, found.group(1).decode()


def console_broker(start_broker: Callable[..., Broker], tmp_path: Path, *args: str, tenants: tuple[str, ...] = (),
                   config: str = "", cost: int = CHEAP) -> tuple[Broker, str]:
    """A broker whose console (on a free port) has the admin ADMIN, with more `config` lines (before the
    tenants' tables); it and the console's URL (no slash). With `tenants`: those tenants declared (a username `NAME@TENANT` joins
    one), each with its own console admin ADMIN (password PASSWORD, logging in with the tenant's name).
    `cost`: the broker's admin's scrypt n (the default's, SCRYPT_N, for a hash as slow as in use)."""
    admins = tmp_path / "admins"
    set_password(str(admins), ADMIN, PASSWORD, n=cost)  # what `plexmq passwd` writes
    text = f'console_admins = "{admins}"\n' + ('tenant_separator = "@"\n' if tenants else "") + config
    for tenant in tenants:
        set_password(str(tmp_path / f"admins-{tenant}"), ADMIN, PASSWORD, n=CHEAP)
        text += f'[tenants.{tenant}]\nconsole_admins = "{tmp_path / f"admins-{tenant}"}"\n'
    with open(tmp_path / "plexmq.toml", "w") as f:
        f.write(text)
    b = start_broker("--config", str(tmp_path / "plexmq.toml"), "--workers", "2", "--console-port", "0", *args)
    return b, console_url(b)


def console_url(b: Broker) -> str:
    found = wait_for(lambda: re.search(r"console on (https?://\S+)/", b.output()), 10, "the console line")
    return found.group(1)


def event_until(url: str, cookie: dict[str, str], wanted: Callable[[dict], bool], timeout: float = 20,
                what: str = "an event") -> dict:
    """The first event of the overview's stream (GET /events) that is `wanted`; AssertionError after `timeout`."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
    deadline = time.monotonic() + timeout
    try:
        conn.request("GET", "/events", headers=cookie)
        answer = conn.getresponse()
        assert answer.status == 200, answer.status
        while time.monotonic() < deadline:
            line = answer.fp.readline()
            assert line, "the stream ended"
            if line.startswith(b"data: ") and wanted(event := orjson.loads(line[6:])):
                return event
    finally:
        conn.close()
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def joined(url: str, cookie: dict[str, str], workers: int = 2) -> None:
    """Wait until `workers` workers have joined the router (each reports its STATS, which the overview
    lists): what the router tells its workers (the route table, the traces) reaches them all from then on."""
    event_until(url, cookie, lambda event: len(event.get("workers", {})) >= workers, 20, f"{workers} workers joined")
