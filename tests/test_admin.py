"""The admin requests of the metrics endpoint (`/clients`, `POST /clients/disconnect`): only with the
token that only the broker's user can read, only under this endpoint's own name, only as JSON when
they act, and each one logged with who asked; `/metrics` and `/health` stay open to read."""

from __future__ import annotations

import http.client
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Callable
from urllib.parse import urlsplit

import orjson
import pytest

from tests.cli import cli, metrics_url
from tests.conftest import Broker, wait_for
from tests.steps import connect, uid
from tests.users import as_nobody

NOBODY = ("runuser", "-u", "nobody", "--")


def token_file(b: Broker) -> str:
    found = wait_for(lambda: re.search(r"admin token \(for /clients\) in (\S+)", b.output()), 10, "the token line")
    return found.group(1)


def curl_as_nobody(url: str, *args: str) -> str:
    """The HTTP status a request by the local user `nobody` gets."""
    return subprocess.run([*NOBODY, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", *args, url],
                          capture_output=True, text=True, timeout=30).stdout


def clients_as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    return as_nobody("clients", *argv)


def status_of(url: str, method: str, path: str, headers: dict[str, str], body: bytes | None = None) -> int:
    """The status of a request sent with exactly these headers (a Host of its own too)."""
    parts = urlsplit(url)
    client = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=15)
    try:
        client.putrequest(method, path, skip_host="Host" in headers, skip_accept_encoding=True)
        for name, value in {**headers, **({} if body is None else {"Content-Length": str(len(body))})}.items():
            client.putheader(name, value)
        client.endheaders(body)
        return client.getresponse().status
    finally:
        client.close()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("curl") is None, reason="acting as nobody needs root, and curl")
def test_only_the_brokers_user_may_list_or_disconnect_clients(start_broker: Callable[..., Broker]) -> None:
    b = start_broker("--workers", "1")
    url = metrics_url(b)
    client_id = f"adm-{uid()}"
    target = connect(b.port, client_id)
    # another local user reads the metrics, as Prometheus does, but acts on nothing
    assert curl_as_nobody(f"{url}/metrics") == "200"
    wait_for(lambda: curl_as_nobody(f"{url}/health") == "200", 15, "/health to answer nobody 200")
    assert curl_as_nobody(f"{url}/clients") == "401"
    body = orjson.dumps({"client_id": client_id}).decode()
    assert curl_as_nobody(f"{url}/clients/disconnect", "-X", "POST", "-H", "Content-Type: application/json",
                          "-d", body) == "401"
    path = token_file(b)
    mode = os.stat(path)
    assert stat.S_IMODE(mode.st_mode) == 0o600 and mode.st_uid == os.getuid()
    assert subprocess.run([*NOBODY, "cat", path], capture_output=True, timeout=30).returncode != 0
    port = urlsplit(url).port
    out = clients_as_nobody("--metrics", url)
    assert (out.returncode, out.stderr.strip()) == (
        1, f"plexmq clients: no running broker of this user serves port {port}; use --token-file or --config")
    out = clients_as_nobody("--metrics", url, "--token-file", path, "--disconnect", client_id)
    assert (out.returncode, out.stderr.strip()) == (
        1, f"plexmq clients: cannot read the admin token {path}: Permission denied")
    # the broker's own user: `plexmq clients` finds the token of the broker on that port by itself
    assert [row.split()[0] for row in cli("clients", url).splitlines()[1:-1]] == [client_id]
    lines = wait_for(lambda: re.findall(r"admin request from 127\.0\.0\.1:\d+: (.*)", b.output()) if
                     "allowed: listed" in b.output() else None, 10, "the admin lines")
    assert lines == ["GET /clients: refused (401 Unauthorized): no valid admin token",
                     "POST /clients/disconnect: refused (401 Unauthorized): no valid admin token",
                     "GET /clients?filter=&offset=0&limit=50: allowed: listed 1 clients"]
    assert cli("clients", url, "--disconnect", client_id).strip() == f"disconnected {client_id}"
    target.read_until_closed()  # closed by the request that was let through


def test_admin_requests_must_name_this_endpoint_and_act_only_as_json(start_broker: Callable[..., Broker]) -> None:
    """With the token, still refused: a DNS-rebound name (Host), a page of another origin, a form POST."""
    b = start_broker("--workers", "1")
    url = metrics_url(b)
    with open(token_file(b)) as f:
        bearer = {"Authorization": f"Bearer {f.read().strip()}"}
    port = urlsplit(url).port
    assert port is not None
    client_id = f"adm-{uid()}"
    target = connect(b.port, client_id)
    body = orjson.dumps({"client_id": client_id})
    as_json = {**bearer, "Content-Type": "application/json"}
    assert status_of(url, "GET", "/clients", {**bearer, "Host": f"rebound.example:{port}"}) == 421
    assert status_of(url, "GET", "/clients", {**bearer, "Host": f"127.0.0.1:{port + 1}"}) == 421
    assert status_of(url, "GET", "/clients", {**bearer, "Origin": "http://attacker.example"}) == 403
    assert status_of(url, "POST", "/clients/disconnect", {**as_json, "Origin": "http://attacker.example"}, body) == 403
    assert status_of(url, "POST", "/clients/disconnect", {**as_json, "Origin": "null"}, body) == 403
    form = {**bearer, "Content-Type": "application/x-www-form-urlencoded"}
    assert status_of(url, "POST", "/clients/disconnect", form, f"client_id={client_id}".encode()) == 415
    assert status_of(url, "POST", "/clients/disconnect", {**bearer, "Content-Type": "text/plain"}, body) == 415
    assert status_of(url, "POST", "/clients/disconnect", {**as_json, "Authorization": "Bearer guess"}, body) == 401
    assert status_of(url, "GET", "/clients", {**bearer, "Host": f"localhost:{port}"}) == 200
    # the client is still there: this endpoint's own page, JSON, with the token, closes it
    assert status_of(url, "POST", "/clients/disconnect", {**as_json, "Origin": f"http://127.0.0.1:{port}"}, body) == 200
    expected = [f"GET /clients: refused (421 Misdirected Request): Host 'rebound.example:{port}' is not this endpoint",
                f"GET /clients: refused (421 Misdirected Request): Host '127.0.0.1:{port + 1}' is not this endpoint",
                "GET /clients: refused (403 Forbidden): Origin 'http://attacker.example' is not this endpoint",
                "POST /clients/disconnect: refused (403 Forbidden): Origin 'http://attacker.example' is not this endpoint",
                "POST /clients/disconnect: refused (403 Forbidden): Origin 'null' is not this endpoint",
                "POST /clients/disconnect: refused (415 Unsupported Media Type): a request that acts must be "
                "application/json",
                "POST /clients/disconnect: refused (415 Unsupported Media Type): a request that acts must be "
                "application/json",
                "POST /clients/disconnect: refused (401 Unauthorized): no valid admin token",
                "GET /clients: allowed: listed 1 clients",
                f"POST /clients/disconnect: allowed: disconnected {client_id!r}"]
    lines = wait_for(lambda: re.findall(r"admin request from 127\.0\.0\.1:\d+: (.*)", b.output()) if
                     "allowed: disconnected" in b.output() else None, 10, "the admin lines")
    assert lines == expected
    target.read_until_closed()  # closed by the request that was let through
