"""What the web console's tests share: a broker with a console and one admin, its address, and the
overview's event stream read until an event says what a test waits for."""

from __future__ import annotations

import http.client
import re
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import orjson

from plexmq.workers.passwords import set_password
from tests.cli import CHEAP
from tests.conftest import Broker, wait_for

ADMIN, PASSWORD = "ops", "correct horse battery"


def console_broker(start_broker: Callable[..., Broker], tmp_path: Path, *args: str, tenants: tuple[str, ...] = (),
                   config: str = "") -> tuple[Broker, str]:
    """A broker whose console (on a free port) has the admin ADMIN, with more `config` lines (before the
    tenants' tables); it and the console's URL (no slash). With `tenants`: those tenants declared (a username `NAME@TENANT` joins
    one), each with its own console admin ADMIN (password PASSWORD, logging in with the tenant's name)."""
    admins = tmp_path / "admins"
    set_password(str(admins), ADMIN, PASSWORD, n=CHEAP)  # what `plexmq passwd` writes
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
