"""Standby routers at their edges (issue 24, found by an adversarial review): a PostgreSQL URL that
libpq cannot read, or whose password holds an unencoded '@', stops startup with one line that names
no part of the password; an outage right after the takeover makes the router step down and wait, not
stop the broker; two routers given the same router_name stay apart in the members list."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from plexmq.bench import postgres
from tests.conftest import ROOT, Broker, free_port, wait_for
from tests.hosts import make_keys
from tests.test_standby import RouterHost

needs_pg = pytest.mark.skipif(not postgres.installed(), reason="no PostgreSQL server installed")


def _serve_router(tmp_path: Path, dsn: str, seconds: float) -> subprocess.CompletedProcess[str]:
    """`plexmq serve --role router --store DSN` for at most `seconds` (then SIGTERM): its output."""
    keys = make_keys(tmp_path / "keys")
    (tmp_path / "plexmq.toml").write_text("")
    args = [sys.executable, "-m", "plexmq.acceptor", "serve", "--config", str(tmp_path / "plexmq.toml"),
            "--role", "router", "--router-bind", f"tcp://127.0.0.1:{free_port()}", "--router-curve-dir", str(keys),
            "--store", dsn, "--metrics-port", "-1", "--console-port", "-1", "--data-dir", str(tmp_path / "data")]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.terminate()
        out, _ = proc.communicate(timeout=15)
    return subprocess.CompletedProcess(args, proc.returncode, out, "")


# --- config errors stop startup with one line and never print the DSN password -------------------------

@pytest.mark.parametrize("dsn, secret", [
    ("postgresql://plexmq:p%ZZs3cretword@127.0.0.1:1/plexmq", "s3cretword"),  # a '%' not percent-encoded
    ("postgresql://plexmq:s3cretword@127.0.0.1:1/plexmq?bogus=1", None),  # an unknown URI query parameter
])
def test_an_invalid_store_dsn_stops_startup_with_one_line_without_the_password(tmp_path: Path, dsn: str,
                                                                              secret: str | None) -> None:
    done = _serve_router(tmp_path, dsn, 8)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 2, done.stdout  # a config error, as every other
    assert len(lines) == 1 and lines[0].startswith("plexmq: store: "), done.stdout
    if secret is not None:
        assert secret not in done.stdout


def test_a_password_with_an_unencoded_at_sign_is_not_logged_as_the_host(tmp_path: Path) -> None:
    """libpq splits the authority at the first '@': the rest of the password would be the host, which
    the log lines name. A config error instead, saying how to write it."""
    done = _serve_router(tmp_path, "postgresql://plexmq:p@ssw0rd-s3cret@127.0.0.1:1/plexmq", 5)
    assert "ssw0rd-s3cret" not in done.stdout, done.stdout
    assert done.returncode == 2 and "percent-encode it in the password (%40)" in done.stdout, done.stdout


# --- a standby never exits on database errors ---------------------------------------------------------

@needs_pg
def test_a_database_error_right_after_the_takeover_does_not_stop_the_broker(pg: postgres.PostgreSQL,
                                                                             tmp_path: Path) -> None:
    """The router takes the lease on its lease connection, then opens the store on a second one. Any
    database error there (here: the role's connection limit, as "too many clients" or a database that
    restarts at that moment would) makes router/main.py exit STORE_FAILED, and the supervisor then stops
    the whole broker ("the router cannot open its store"), although the error is an outage (StoreError
    .unreachable): the router should step down and wait as a standby, as it does for the same error
    one statement earlier."""
    pg.sql("CREATE ROLE review_lim LOGIN CONNECTION LIMIT 1")
    pg.sql("CREATE DATABASE review_lim OWNER review_lim")
    dsn = pg.dsn.replace("postgres@", "review_lim@").rsplit("/", 1)[0] + "/review_lim"
    keys = make_keys(tmp_path / "keys")
    a = RouterHost(tmp_path, "a", dsn, keys)
    a.start()
    try:
        wait_for(lambda: a.logged(r"the store does not answer: .*too many connections.*: stepping down"), 20,
                 "the router to step down for the outage")
        wait_for(lambda: a.logged(r"restarting it as a standby"), 10, "the supervisor to restart it as a standby")
        a.check_running()
        pg.sql("ALTER ROLE review_lim CONNECTION LIMIT -1")  # the outage is over: it must become active
        wait_for(lambda: a.logged(r"router a is active"), 20, "the router to take the lease")
        assert "cannot open the store" not in a.output()
    finally:
        a.stop()


# --- plexmq status / $SYS / metrics show the right active router --------------------------------------

@needs_pg
def test_two_routers_with_the_same_router_name_do_not_hide_the_active_one(pg_dsn: str) -> None:
    """router_name is free text and nothing checks that it is unique among the routers of one store:
    router_members is keyed by it, so a standby with the active's name overwrites the active's row
    ("standby"), and `plexmq status`/$SYS/metrics read from the members list that no router is
    active (and the standby also takes the active for "its own previous run")."""
    from plexmq.router.ha.lease import Lease

    a, b = Lease(pg_dsn, "same", "tcp://10.0.0.1:7883", 2.0), Lease(pg_dsn, "same", "tcp://10.0.0.2:7883", 2.0)
    try:
        assert a.try_acquire() is not None
        a.say("active")  # Members, once a second
        assert b.try_acquire() is None
        b.say("standby")  # wait_for_lease, every lease/8
        members = a.members()
        assert [m.state for m in members].count("active") == 1, members
        assert len(members) == 2, members
    finally:
        a.close()
        b.close()


# --- the store's password is on no process's command line ---------------------------------------------

PASSWORD = "s3cret-pw-34"


@pytest.fixture(scope="module")
def password_pg() -> Iterator[postgres.PostgreSQL]:
    """A server of its own where role `plexmq_pw` (owner of database `plexmq_pw`) logs in over TCP with
    PASSWORD only (the session's server trusts every login)."""
    if not postgres.installed():
        pytest.skip("no PostgreSQL server installed")
    server = postgres.PostgreSQL()
    try:
        server.sql(f"CREATE ROLE plexmq_pw LOGIN PASSWORD '{PASSWORD}'")
        server.sql("CREATE DATABASE plexmq_pw OWNER plexmq_pw")
        hba = server.data / "pg_hba.conf"
        hba.write_text(f"host all plexmq_pw {server.host}/32 scram-sha-256\n" + hba.read_text())  # first match wins
        server.sql("SELECT pg_reload_conf()")
        yield server
    finally:
        server.remove()


def _store(server: postgres.PostgreSQL, password: str = "") -> str:
    return f"postgresql://plexmq_pw{':' + password if password else ''}@{server.host}:{server.port}/plexmq_pw"


def test_the_store_password_is_in_no_command_line(password_pg: postgres.PostgreSQL, tmp_path: Path) -> None:
    """`--store postgresql://user:PASSWORD@...`: the acceptor hides the password in its own command line
    before it forks a worker (the router is exec'd without it: its config file is mode 0600), so `ps`
    shows it in no process of the broker; the router logged in with it all the same."""
    b = Broker(tmp_path / "broker.log", ["--store", _store(password_pg, PASSWORD), "--workers", "2"])
    try:
        tree = [psutil.Process(b.proc.pid), *psutil.Process(b.proc.pid).children(recursive=True)]
        assert len(tree) >= 4, tree  # the acceptor, the router, two workers
        for proc in tree:
            cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
            assert PASSWORD.encode() not in cmdline, (proc, cmdline)
        assert "--store\0postgresql://plexmq_pw:" + "*" * len(PASSWORD) + "@" in \
            Path(f"/proc/{b.proc.pid}/cmdline").read_text()
    finally:
        b.stop()
    assert " is active, epoch 1, the first holder" in b.output(), b.output()


@pytest.mark.parametrize("variable", ["PGPASSFILE", "PGPASSWORD"])
def test_libpq_reads_the_store_password_from_the_environment(password_pg: postgres.PostgreSQL, tmp_path: Path,
                                                              variable: str) -> None:
    """A URL without a password: libpq takes it from PGPASSWORD or the file PGPASSFILE names (the way
    deploy/nodes.md recommends), in the acceptor's check and in the router it starts."""
    if variable == "PGPASSFILE":
        path = tmp_path / "pgpass"
        path.write_text(f"{password_pg.host}:{password_pg.port}:plexmq_pw:plexmq_pw:{PASSWORD}\n")
        path.chmod(0o600)  # libpq ignores a file others may read
        value = str(path)
    else:
        value = PASSWORD
    b = Broker(tmp_path / "broker.log", ["--store", _store(password_pg)], env={**os.environ, variable: value})
    b.stop()
    assert " is active, epoch " in b.output(), b.output()
