"""The web console over HTTPS (issue 25, `console_tls`): with a `[tls]` certificate it serves HTTPS with
it (a self-signed one made here), its session cookie is Secure, and a POST from its own https:// origin
is taken while one from an http:// origin is not; plain HTTP on its port gets no answer; with
console_tls = false it stays plain HTTP; a certificate it cannot use stops startup with one line."""

from __future__ import annotations

import http.client
import re
import socket
import ssl
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from ipaddress import IPv4Address
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import orjson
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.cli import one_error_line, run, write
from tests.conftest import Broker
from tests.console import ADMIN, PASSWORD, Answer, ask, console_broker


def self_signed(where: Path) -> tuple[Path, Path]:
    """A self-signed certificate for localhost and 127.0.0.1, and its key (PEM files)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.now(UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(hours=1))
            .not_valid_after(now + timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(IPv4Address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    certfile, keyfile = where / "console.crt", where / "console.key"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    keyfile.chmod(0o600)
    return certfile, keyfile


def ask_tls(url: str, certfile: Path, method: str, path: str, headers: dict[str, str] | None = None,
            body: bytes | None = None) -> Answer:
    """`ask` over HTTPS, trusting `certfile` and checking the console's name against it."""
    return ask(url, method, path, headers, body, ssl.create_default_context(cafile=str(certfile)))


def first_event(url: str, certfile: Path, cookie: dict[str, str]) -> dict:
    """The first event of the overview's stream over HTTPS."""
    parts = urlsplit(url)
    context = ssl.create_default_context(cafile=str(certfile))
    conn = http.client.HTTPSConnection(parts.hostname or "", parts.port, timeout=15, context=context)
    try:
        conn.request("GET", "/events", headers=cookie)
        answer = conn.getresponse()
        assert answer.status == 200
        while not (line := answer.fp.readline()).startswith(b"data: "):
            assert line, "the stream ended"
        return orjson.loads(line[6:])
    finally:
        conn.close()


def test_with_a_certificate_the_console_speaks_https_only_and_its_cookie_is_secure(
        start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    certfile, keyfile = self_signed(tmp_path)
    # the certificate of the broker's [tls]; no MQTT listener over TLS is needed for the console to use it
    _b, url = console_broker(start_broker, tmp_path, config=f'[tls]\ncertfile = "{certfile}"\nkeyfile = "{keyfile}"\n')
    assert url.startswith("https://")
    form = urlencode({"user": ADMIN, "password": PASSWORD}).encode()
    status, headers, _ = ask_tls(url, certfile, "POST", "/login", {"Content-Type": "application/x-www-form-urlencoded"}, form)
    assert status == 303 and "; Secure" in headers["set-cookie"] and "HttpOnly" in headers["set-cookie"]
    cookie = {"Cookie": headers["set-cookie"].split(";")[0]}
    status, _, page = ask_tls(url, certfile, "GET", "/", cookie)
    assert status == 200
    found = re.search(rb'<meta name="csrf" content="([^"]+)">', page)
    assert found is not None
    assert first_event(url, certfile, cookie)["version"]  # the overview's stream too
    logout = {**cookie, "Content-Type": "application/x-www-form-urlencoded"}
    body = urlencode({"csrf": found.group(1).decode()}).encode()
    port = urlsplit(url).port
    assert ask_tls(url, certfile, "POST", "/logout", {**logout, "Origin": f"http://127.0.0.1:{port}"}, body)[0] == 403
    status, headers, _ = ask_tls(url, certfile, "POST", "/logout", {**logout, "Origin": f"https://127.0.0.1:{port}"}, body)
    assert status == 303 and headers["set-cookie"].startswith("plexmq_console=;") and "; Secure" in headers["set-cookie"]
    assert ask_tls(url, certfile, "GET", "/", cookie)[0] == 303  # logged out

    with socket.create_connection(("127.0.0.1", port), timeout=15) as plain:  # HTTP on the HTTPS port
        plain.sendall(b"GET /login HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        try:
            said = plain.recv(4096)
        except ConnectionResetError:
            said = b""
        assert b"HTTP/1." not in said  # a TLS alert, a reset or nothing: never a page


def test_console_tls_false_keeps_plain_http(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    certfile, keyfile = self_signed(tmp_path)
    _b, url = console_broker(start_broker, tmp_path,
                             config=f'console_tls = false\n[tls]\ncertfile = "{certfile}"\nkeyfile = "{keyfile}"\n')
    assert url.startswith("http://")
    form = urlencode({"user": ADMIN, "password": PASSWORD}).encode()
    status, headers, _ = ask(url, "POST", "/login", {"Content-Type": "application/x-www-form-urlencoded"}, form)
    assert status == 303 and "Secure" not in headers["set-cookie"]


def test_a_console_certificate_that_cannot_be_used_stops_startup_with_one_line(tmp_path: Path) -> None:
    certfile, _keyfile = self_signed(tmp_path)
    text = f'[tls]\ncertfile = "{certfile}"\nkeyfile = "{tmp_path}/absent.key"\n'  # no TLS listener: the console's
    message = one_error_line(run("serve", "--port", "0", "--console-port", "0", "--config", str(write(tmp_path, text))))
    assert "tls.keyfile" in message and "absent.key" in message, message
