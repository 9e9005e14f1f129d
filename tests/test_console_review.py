"""The web console under an adversarial review: what a tenant admin's request says of another tenant,
how long a session and its event stream outlive a logout, how many sessions one admin may pile up, the
login throttle against a guesser that changes its address, and requests whose head is malformed."""

from __future__ import annotations

import hashlib
import http.client
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import orjson
import pytest

from plexmq.router.console.auth import ACCOUNT_FAILURES, FAILURES, SESSIONS_EACH, STREAMS_EACH, TRACKED, Admins, Throttled
from plexmq.workers.auth.passwords import SCRYPT_N, set_password
from tests.cli import CHEAP
from tests.conftest import Broker, wait_for
from tests.console import ADMIN, PASSWORD, ask, console_broker, log_in, log_in_from, session
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


def test_logging_out_ends_the_sessions_open_event_stream(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    _b, url = console_broker(start_broker, tmp_path)
    cookie, csrf = session(url)
    parts = urlsplit(url)
    stream = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=20)
    try:
        stream.request("GET", "/events", headers=cookie)
        answer = stream.getresponse()
        assert answer.status == 200
        assert answer.fp.readline().startswith(b"data: ") or answer.fp.readline()  # the stream is live
        status, _, _ = ask(url, "POST", "/logout", {**cookie, "X-CSRF-Token": csrf})
        assert status == 303
        deadline = time.monotonic() + 10  # the stream ends at its next refresh (once a second)
        while answer.fp.readline():
            assert time.monotonic() < deadline, "the stream outlived the logout"
    finally:
        stream.close()


def test_an_admins_sessions_are_bounded_the_oldest_logged_out(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    _b, url = console_broker(start_broker, tmp_path)
    cookies = []
    for _ in range(SESSIONS_EACH + 1):
        status, headers, _ = log_in(url)
        assert status == 303
        cookies.append({"Cookie": headers["set-cookie"].split(";")[0]})
    assert ask(url, "GET", "/api/clients", cookies[0])[0] == 401  # the oldest is gone
    assert all(ask(url, "GET", "/api/clients", cookie)[0] == 200 for cookie in cookies[1:])


def test_failed_logins_from_many_addresses_throttle_the_account(start_broker: Callable[..., Broker],
                                                                  tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path)
    guessers = [f"127.0.0.{2 + i}" for i in range(ACCOUNT_FAILURES // FAILURES)]
    for address in guessers:
        assert [log_in_from(url, address, "guess")[0] for _ in range(FAILURES)] == [401] * FAILURES
        assert log_in_from(url, address, "guess")[0] == 429  # this address's own bound
    status, headers, _ = log_in_from(url, "127.0.0.100", PASSWORD)  # another address: the account's bound
    assert status == 429 and headers["retry-after"] == "60"
    wait_for(lambda: f"console login for {ADMIN!r} from 127.0.0.100 refused: too many failed logins" in b.output(),
             10, "the refusal's log line")


def test_an_ipv6_guesser_counts_by_its_64_and_the_failures_remembered_are_bounded(tmp_path: Path) -> None:
    set_password(str(tmp_path / "admins"), ADMIN, PASSWORD, n=CHEAP)
    admins = Admins(str(tmp_path / "admins"))
    for i in range(FAILURES):
        assert admins.login(ADMIN, "guess", f"2001:db8::{i + 1:x}") is None
    with pytest.raises(Throttled):
        admins.login("someone", "guess", "2001:db8::ffff")  # the same /64
    assert admins.login("someone", "guess", "2001:db8:0:1::1") is None
    for i in range(TRACKED):  # as many other addresses and names, one failure each: the first /64, quiet longest,
        admins.login(f"u{i}", "guess", f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}")  # is forgotten
    assert admins.login("someone", "guess", "2001:db8::ffff") is None


def test_concurrent_wrong_logins_from_one_address_get_no_more_passwords_checked_than_the_bound(
        start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    _b, url = console_broker(start_broker, tmp_path, cost=SCRYPT_N)  # a hash as slow as in use
    with ThreadPoolExecutor(3 * FAILURES) as pool:  # more at once than the console answers (httpd.THREADS)
        statuses = sorted(pool.map(lambda _: log_in(url, "guess")[0], range(3 * FAILURES)))
    assert statuses == [401] * FAILURES + [429] * (2 * FAILURES)  # each counted before its slow hash
    assert log_in(url)[0] == 429  # the right password too, from this address, for now


def test_a_login_naming_a_tenant_without_admins_costs_the_same_hash(tmp_path: Path) -> None:
    set_password(str(tmp_path / "admins"), ADMIN, PASSWORD, n=CHEAP)
    set_password(str(tmp_path / "admins-acme"), ADMIN, PASSWORD, n=CHEAP)
    admins = Admins(str(tmp_path / "admins"), {"acme": str(tmp_path / "admins-acme")})
    hashes = [hashed(admins.login, who, "guess", f"10.0.0.{i}", tenant)  # each from its own address
              for i, (who, tenant) in enumerate([(ADMIN, "acme"), (ADMIN, "nosuch"), ("nobody", "acme"), ("nobody", "")])]
    assert hashes == [1, 1, 1, 1]  # so timing does not list the tenants (nor the admins)


def hashed(call: Callable[..., object], *args: str) -> int:
    """How many slow hashes (scrypt) `call(*args)` ran, as the profiler sees its calls of C functions."""
    count = 0

    def seen(_frame: object, event: str, arg: object) -> None:
        nonlocal count
        count += event == "c_call" and arg is hashlib.scrypt

    sys.setprofile(seen)
    try:
        call(*args)
    finally:
        sys.setprofile(None)
    return count


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


def open_stream(url: str, cookie: dict[str, str]) -> tuple[http.client.HTTPConnection, int]:
    """An overview's event stream: its connection (left open) and the answer's status."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    conn.request("GET", "/events", headers=cookie)
    answer = conn.getresponse()
    if answer.status == 200:
        assert answer.fp.readline() == b"retry: 2000\n"
    return conn, answer.status


def test_one_admin_cannot_take_every_overview_slot(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    _b, url = console_broker(start_broker, tmp_path, tenants=("acme",))
    acme = [session(url, "acme")[0] for _ in range(STREAMS_EACH + 1)]  # sessions of one admin share its share
    held = [open_stream(url, cookie) for cookie in acme[:STREAMS_EACH]]
    assert [status for _, status in held] == [200] * STREAMS_EACH
    conn, status = open_stream(url, acme[-1])
    assert status == 429
    conn.close()
    broker_admin, status = open_stream(url, session(url)[0])  # another admin still gets one
    assert status == 200
    broker_admin.close()
    held[0][0].close()  # a closed overview gives its slot back (noticed at the stream's next event)

    def reopened() -> http.client.HTTPConnection | None:
        again, status = open_stream(url, acme[-1])
        if status == 200:
            return again
        again.close()
        return None

    wait_for(reopened, 10, "the slot given back").close()
    held[1][0].close()
