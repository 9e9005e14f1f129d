"""README.md's snippets, run as the README says to use them, with this test's directory in place of
/etc/plexmq and free ports in place of the fixed ones; a person's typed password comes on stdin
(`--password-stdin`). Elsewhere: the Securing config and ACL (tests/test_transports.py), the SQL
tables (tests/test_sql_auth.py)."""

from __future__ import annotations

import os
import queue
import re
import shlex
import shutil
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from plexmq.mqtt import v5
from tests.conftest import ROOT, Broker, free_port, wait_for
from tests.console import ADMIN, PASSWORD, console_url, log_in
from tests.logins import users
from tests.mqtt import RawClient
from tests.steps import uid
from tests.test_interop import Sub

README = (ROOT / "README.md").read_text()
PLEXMQ = [sys.executable, "-m", "plexmq.acceptor"]  # `plexmq`, this checkout's
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}  # run elsewhere than the checkout, still this checkout's code
needs_mosquitto = pytest.mark.skipif(shutil.which("mosquitto_sub") is None, reason="mosquitto-clients not installed")


def block(after: str, lang: str, index: int = 0) -> str:
    """The `index`th ```lang block after the text `after`."""
    blocks = re.findall(rf"```{lang}\n(.*?)```", README.split(after, 1)[1], re.DOTALL)
    return blocks[index]


def commands(text: str) -> list[list[str]]:
    """Each line of a sh block as argv, its comment and a trailing `&` left out."""
    return [shlex.split(line, comments=True) for line in text.splitlines() if line.strip()]


def plexmq(argv: list[str], cwd: Path, stdin: str | None = None) -> None:
    assert argv[0] == "plexmq", argv
    subprocess.run([*PLEXMQ, *argv[1:]], cwd=cwd, env=ENV, input=stdin, text=True, check=True, timeout=60,
                   capture_output=True)


def make_certificate(where: Path) -> None:
    """The README's openssl line, in `where` instead of /etc/plexmq."""
    line = next(c for c in commands(block("## Securing plexmq", "sh")) if c[0] == "openssl")
    subprocess.run([arg.replace("/etc/plexmq/", f"{where}/") for arg in line], check=True, capture_output=True, timeout=60)


def test_the_console_recipe_runs_as_printed(tmp_path: Path) -> None:
    """Make an admin, write the config, serve it: the admin logs in."""
    make_admin, write_config, serve = block("### Web console", "sh").splitlines()
    plexmq([*shlex.split(make_admin, comments=True), "--password-stdin"], tmp_path, stdin=PASSWORD + "\n")
    subprocess.run(["bash", "-c", write_config], cwd=tmp_path, check=True, timeout=10)
    argv = shlex.split(serve, comments=True)
    assert argv[:2] == ["plexmq", "serve"]
    b = Broker(tmp_path / "broker.log", [*argv[2:], "--console-port", "0"], env=ENV, cwd=tmp_path)
    try:
        assert shlex.split(make_admin, comments=True)[-1] == ADMIN
        assert log_in(console_url(b))[0] == 303
    finally:
        b.stop()


def test_a_key_appended_to_the_documented_config_says_where_it_belongs(tmp_path: Path) -> None:
    """What the README warns of: the key lands in [archive], and startup's line says to move it."""
    config = tmp_path / "plexmq.toml"
    config.write_text((ROOT / "deploy/plexmq.toml").read_text() + 'console_admins = "admins.txt"\n')
    done = subprocess.run([*PLEXMQ, "serve", "--config", str(config), "--port", "0"], env=ENV, capture_output=True,
                          text=True, timeout=30, check=False)
    assert done.returncode != 0
    assert "unknown key 'archive.console_admins' (console_admins is a top-level key" in done.stderr, done.stderr


@pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl tool is not installed")
def test_the_two_tenant_example_serves_both_tenants(tmp_path: Path) -> None:
    """The Tenants section's config, with the certificate the README's openssl line makes: acme's
    users log in by their suffix, beta's on its own ports (TLS verified for the certificate's host
    name on the wss:// one), and a client that names no tenant is refused."""
    mqtt_port, wss_port = free_port(), free_port()
    text = block("### Tenants", "toml").replace("/etc/plexmq/", f"{tmp_path}/")
    text = text.replace(":1884", f":{mqtt_port}").replace(":8884", f":{wss_port}")
    users(tmp_path / "acme.passwd", **{"sensor-7": "acme-secret"})
    (tmp_path / "acme.acl").write_text("user sensor-7\ntopic readwrite sensors/#\n")
    users(tmp_path / "beta.passwd", dev="beta-secret")
    make_certificate(tmp_path)
    (tmp_path / "tenants.toml").write_text(text)
    b = Broker(tmp_path / "broker.log", ["--config", str(tmp_path / "tenants.toml")])
    try:
        def code(port: int, username: str, password: bytes) -> int:
            c = RawClient(port)
            try:
                return c.connect(f"readme-{uid()}", username=username, password=password)[1]
            finally:
                c.close()

        assert code(b.port, "sensor-7@acme", b"acme-secret") == 0
        assert code(b.port, "sensor-7", b"acme-secret") == 0x05  # tenant_required
        assert code(mqtt_port, "dev", b"beta-secret") == 0
        context = ssl.create_default_context(cafile=str(tmp_path / "server.crt"))
        with socket.create_connection(("127.0.0.1", wss_port), timeout=10) as raw, \
                context.wrap_socket(raw, server_hostname="mqtt.example.com") as tls:
            assert tls.version() is not None
    finally:
        b.stop()


def test_the_server_reference_example_moves_clients(tmp_path: Path) -> None:
    """The MQTT 5.0 section's server_reference lines: a 5.0 client hears 0x9D and where to go."""
    (tmp_path / "moved.toml").write_text(block("send every client to another broker", "toml"))
    b = Broker(tmp_path / "broker.log", ["--config", str(tmp_path / "moved.toml")])
    try:
        c = RawClient(b.port)
        _present, code, told = c.connect5(f"readme-{uid()}")
        assert (code, told[v5.props_codec.SERVER_REFERENCE]) == (0x9D, "mqtt2.example:1883")
        c.close()
    finally:
        b.stop()


def mosquitto(b: Broker, argv: list[str]) -> list[str]:
    """A README mosquitto line as argv against `b`."""
    return [argv[0], "-p", str(b.port), *argv[1:]]


@needs_mosquitto
def test_the_mqtt5_mosquitto_lines_run_as_printed(broker: Broker) -> None:
    """A 5.0 subscriber with a session, a 5.0 and a 3.1.1 publisher: both messages arrive."""
    sub_line, *pub_lines = commands(block("### MQTT 5.0", "sh"))
    assert sub_line[0] == "mosquitto_sub"
    sub = Sub(broker, *sub_line[1:], "-C", "2")
    sub.subscribed()
    for line in pub_lines:
        subprocess.run(mosquitto(broker, line), check=True, timeout=10)
    assert [(topic, payload) for topic, _q, _r, payload in sub.messages()] == [("sensors/t1", "21.5"), ("sensors/t2", "19.0")]


@needs_mosquitto
def test_the_shared_subscription_lines_give_each_job_to_one_member(broker: Broker) -> None:
    first, second, loop = block("Shared subscriptions", "sh").splitlines()
    members = [Sub(broker, *shlex.split(line, comments=True)[1:-1]) for line in (first, second)]
    for member in members:
        member.subscribed()
    subprocess.run(["bash", "-c", loop.replace("mosquitto_pub ", f"mosquitto_pub -p {broker.port} ")], check=True, timeout=30)
    got: list[str] = []

    def all_came() -> bool:
        for member in members:
            while True:
                try:
                    line = member.lines.get_nowait()
                except queue.Empty:
                    break
                if line.startswith("MSG "):
                    got.append(line.rsplit("|", 1)[1])
        return len(got) >= 4
    try:
        wait_for(all_came, 10, "the four jobs")
        assert sorted(got) == [f"job {n}" for n in range(1, 5)]
    finally:
        for member in members:
            member.proc.kill()
            member.proc.wait(5)
