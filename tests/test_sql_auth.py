"""Users and ACL rules in MariaDB (`auth_database`), end to end: a private MariaDB server made for
this session (with the tables exactly as README.md documents them), real brokers, paho clients.

Skipped only where no MariaDB server is installed (`apt-get install mariadb-server`; .ci/run does).
"""

from __future__ import annotations

import os
import queue
import re
import select
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import paho.mqtt.client as paho
import pymysql
import pytest

from plexmq.acceptor import config as cfg
from plexmq.mqtt import v4 as p
from plexmq.workers.auth.database import connect_args
from plexmq.workers.auth.passwords import hash_password
from tests.conftest import ROOT, Broker, free_port, wait_for
from tests.mqtt import Client, RawClient
from tests.steps import uid

SEARCH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
SERVER = shutil.which("mariadbd", path=SEARCH) or shutil.which("mysqld", path=SEARCH)
INSTALL = shutil.which("mariadb-install-db", path=SEARCH) or shutil.which("mysql_install_db", path=SEARCH)
pytestmark = pytest.mark.skipif(SERVER is None, reason="no MariaDB server binary (apt-get install mariadb-server)")

CHEAP = 2 ** 10  # scrypt cost for test users: the hash says it, the broker honours it
PASSWORD = "p@ss:w/rd"  # the broker's database password: every character a URL must encode
CACHE = 1.0  # auth_database_cache of the shared broker, seconds
OK, BAD, UNAVAILABLE = "Success", "Bad user name or password", "Server unavailable"  # paho's CONNACK names


class MariaDB:
    """A private MariaDB server: its own data directory, socket and free port on 127.0.0.1."""

    def __init__(self, base: Path) -> None:
        data = base / "data"
        subprocess.run([INSTALL or "mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
                        "--auth-root-authentication-method=normal", "--skip-test-db"],
                       check=True, capture_output=True, timeout=120)
        self.socket = base / "mysqld.sock"
        self.log = base / "mysqld.err"
        self.port = free_port()
        # --user=root: CI runs as root, which mariadbd refuses unless told; networking stays on (the default)
        self.proc = subprocess.Popen([SERVER or "mariadbd", "--no-defaults", f"--datadir={data}",
                                      f"--socket={self.socket}", f"--port={self.port}", "--bind-address=127.0.0.1",
                                      "--user=root", f"--pid-file={base / 'mysqld.pid'}", f"--log-error={self.log}",
                                      "--skip-name-resolve", "--skip-log-bin", "--innodb-buffer-pool-size=16M"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            self.admin: pymysql.connections.Connection = wait_for(
                self._connect, 60, "MariaDB to accept connections")
        except BaseException:
            self.stop()
            raise

    def _connect(self) -> pymysql.connections.Connection | None:
        if self.proc.poll() is not None:
            log = self.log.read_text(errors="replace")
            raise AssertionError(f"mariadbd exited with {self.proc.returncode}:\n{log}")
        try:
            return pymysql.connect(unix_socket=str(self.socket), user="root", autocommit=True, connect_timeout=1)
        except pymysql.Error:
            return None

    def sql(self, statement: str, *args: Any) -> tuple[Any, ...]:
        with self.admin.cursor() as cursor:
            cursor.execute(statement, args or None)
            return cursor.fetchall()

    def url(self) -> str:
        return f"mysql://plexmq:{quote(PASSWORD, safe='')}@127.0.0.1:{self.port}/plexmq"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def documented_schema() -> list[str]:
    """The CREATE TABLE statements of README.md, which the tests use as they are."""
    block = re.search(r"```sql\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    assert block, "README.md has no ```sql block with the tables"
    return [statement for statement in block.group(1).split(";") if statement.strip()]


@pytest.fixture(scope="session")
def mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDB]:
    """A database `plexmq` with the documented tables and a user `plexmq` that may only SELECT."""
    server = MariaDB(tmp_path_factory.mktemp("mariadb"))
    try:
        server.sql("CREATE DATABASE plexmq")
        server.sql("CREATE USER 'plexmq'@'127.0.0.1' IDENTIFIED BY %s", PASSWORD)
        server.sql("GRANT SELECT ON plexmq.* TO 'plexmq'@'127.0.0.1'")
        server.sql("USE plexmq")
        for statement in documented_schema():
            server.sql(statement)
        yield server
    finally:
        server.stop()


def add_user(db: MariaDB, username: str, password: str) -> None:
    db.sql("REPLACE INTO plexmq_users (username, password_hash) VALUES (%s, %s)", username,
           hash_password(password, n=CHEAP))


def write_config(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


@pytest.fixture(scope="module")
def broker(mariadb: MariaDB, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """One worker (so failures and caches are counted in one place), users alice and bob, and ACL rows:
    alice reads and writes alice/# and reads public/#, anonymous clients read public/#, client id
    probe-1 reads probes/#, everyone has devices/%u/# and nobody secret/#."""
    add_user(mariadb, "alice", "wonderland")
    add_user(mariadb, "bob", "builder")
    mariadb.sql("INSERT INTO plexmq_acl (kind, name, access, topic) VALUES "
                "('user', 'alice', 'readwrite', 'alice/#'), ('user', 'alice', 'read', 'public/#'), "
                "('anonymous', '', 'read', 'public/#'), ('client', 'probe-1', 'read', 'probes/#'), "
                "('pattern', '', 'readwrite', 'devices/%u/#'), ('pattern', '', 'deny', 'secret/#')")
    base = tmp_path_factory.mktemp("sql-broker")
    path = write_config(base / "plexmq.toml", f'auth_database = "{mariadb.url()}"\nauth_database_acl = true\n'
                        f"auth_database_cache = {CACHE}\nauth_database_timeout = 2.0\nallow_anonymous = true\n")
    b = Broker(base / "broker.log", ["--workers", "1", "--config", path])
    yield b
    b.stop()


def connack(port: int, username: str | None, password: str | None, client_id: str = "",
            protocol: paho.MQTTProtocolVersion = paho.MQTTv311) -> str:
    """The name of the CONNACK a paho client got ("Success", "Bad user name or password", ...)."""
    got: queue.Queue[str] = queue.Queue()
    client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=client_id or f"sql-{uid()}",
                         protocol=protocol)
    if username is not None:
        client.username_pw_set(username, password)
    client.on_connect = lambda c, u, flags, rc, props: got.put(str(rc))
    client.connect("127.0.0.1", port)

    def answered() -> bool:  # paho's loop driven here: its own thread would wait a second to stop after a refusal
        client.loop(0.02)
        return not got.empty()

    try:
        wait_for(answered, 10, "the CONNACK")
        return got.get_nowait()
    finally:
        client.disconnect()


# ------------------------------------------------------------------------------------ users


def test_users_table_decides_the_connack_like_the_password_file(broker: Broker) -> None:
    assert connack(broker.port, "alice", "wonderland") == OK
    assert connack(broker.port, "alice", "wrong") == BAD
    # 5.0 clients hear the same verdicts as reason codes (0x00, 0x86)
    assert connack(broker.port, "alice", "wonderland", protocol=paho.MQTTv5) == OK
    assert connack(broker.port, "alice", "wrong", protocol=paho.MQTTv5) == BAD
    assert connack(broker.port, "mallory", "wonderland") == BAD  # no row
    # the column's collation ignores trailing spaces: the broker compares the name itself
    assert connack(broker.port, "alice ", "wonderland") == BAD


def test_a_changed_password_takes_effect_within_the_cache_time(broker: Broker, mariadb: MariaDB) -> None:
    carol = f"carol-{uid()}"
    add_user(mariadb, carol, "first")
    read_after = time.monotonic()  # the broker reads carol's row after this
    assert connack(broker.port, carol, "first") == OK
    add_user(mariadb, carol, "second")
    changed = time.monotonic()
    still = connack(broker.port, carol, "first")
    if time.monotonic() - read_after < CACHE:  # the row read at the first login is still cached
        assert still == OK
    wait_for(lambda: connack(broker.port, carol, "first") == BAD, 10, "the old password to be refused")
    assert time.monotonic() - changed < CACHE + 3
    assert connack(broker.port, carol, "second") == OK


def test_a_connection_the_database_closed_is_made_again(broker: Broker, mariadb: MariaDB) -> None:
    """Servers close idle connections (wait_timeout): the next query opens a new one, no 0x03."""
    assert connack(broker.port, "bob", "builder") == OK  # the pool holds a connection now
    kept = mariadb.sql("SELECT id FROM information_schema.processlist WHERE user = 'plexmq'")
    assert kept
    for (connection_id,) in kept:
        mariadb.sql(f"KILL {int(connection_id)}")
    dave = f"dave-{uid()}"  # not cached: its row must be read
    add_user(mariadb, dave, "diver")
    assert connack(broker.port, dave, "diver") == OK


# ------------------------------------------------------------------------------------ ACL


def test_acl_rows_decide_the_suback(broker: Broker) -> None:
    alice = Client(broker.port, f"sql-{uid()}", username="alice", password="wonderland")
    try:
        granted = [alice.subscribe(f, 1)[0] for f in ["alice/inbox", "public/#", "bob/#", "secret/x",
                                                      "devices/alice/+", "devices/bob/+"]]
        assert granted == [1, 1, 0x80, 0x80, 1, 0x80]
        alice.publish("alice/inbox", b"hello", 1)
        assert alice.get().payload == b"hello"
    finally:
        alice.disconnect()
    anonymous = Client(broker.port, "probe-1")  # anonymous rows, and the rows of its client id
    try:
        assert [anonymous.subscribe(f)[0] for f in ["public/news", "probes/#", "alice/#"]] == [0, 0, 0x80]
    finally:
        anonymous.disconnect()
    other = Client(broker.port, f"sql-{uid()}")
    try:
        assert other.subscribe("probes/#") == [0x80]
    finally:
        other.disconnect()


def test_a_changed_acl_row_takes_effect_for_live_subscriptions(broker: Broker, mariadb: MariaDB) -> None:
    """Read access is judged at delivery with the table as it is now: a deny row added while alice is
    subscribed withholds that topic from her within the cache time (the workers read the table again)."""
    feed = f"feed-{uid()}"

    def rows_read(*rows: tuple[str, str, str, str]) -> list[int]:
        changes = broker.output().count("the ACL table changed")
        ids = []
        for row in rows:
            mariadb.sql("INSERT INTO plexmq_acl (kind, name, access, topic) VALUES (%s, %s, %s, %s)", *row)
            ids.append(mariadb.sql("SELECT LAST_INSERT_ID()")[0][0])
        wait_for(lambda: broker.output().count("the ACL table changed") > changes, CACHE + 5, "the rows to be read")
        return ids

    ids = rows_read(("user", "alice", "read", f"{feed}/#"), ("user", "bob", "write", f"{feed}/#"))
    alice = Client(broker.port, f"sql-{uid()}", username="alice", password="wonderland")
    bob = Client(broker.port, f"sql-{uid()}", username="bob", password="builder")
    try:
        assert alice.subscribe(f"{feed}/#", 1) == [1]
        bob.publish(f"{feed}/secret", b"allowed before", 1)
        assert alice.get().payload == b"allowed before"
        ids += rows_read(("user", "alice", "deny", f"{feed}/secret"))
        bob.publish(f"{feed}/secret", b"denied now", 1)
        bob.publish(f"{feed}/news", b"still allowed", 1)
        assert alice.get().payload == b"still allowed"
    finally:
        for row_id in ids:
            mariadb.sql("DELETE FROM plexmq_acl WHERE id = %s", row_id)
        alice.disconnect()
        bob.disconnect()


def test_a_bad_acl_row_refuses_logins_rather_than_being_skipped(broker: Broker, mariadb: MariaDB) -> None:
    mariadb.sql("INSERT INTO plexmq_acl (kind, name, access, topic) VALUES ('pattern', '', 'deny', 'a/#/b')")
    (row_id,) = mariadb.sql("SELECT LAST_INSERT_ID()")[0]
    try:
        wait_for(lambda: connack(broker.port, "alice", "wonderland") == UNAVAILABLE, 10, "CONNACK 0x03")
        assert f"plexmq_acl row id {row_id}: invalid topic filter 'a/#/b'" in broker.output()
    finally:
        mariadb.sql("DELETE FROM plexmq_acl WHERE id = %s", row_id)
    wait_for(lambda: connack(broker.port, "alice", "wonderland") == OK, 10, "logins again")
    assert "answers again" in broker.output()


# ------------------------------------------------------------------------------------ no database


def test_a_database_that_cannot_answer_gets_0x03_in_bounded_time(tmp_path: Path,
                                                                  start_broker: Callable[..., Broker]) -> None:
    """Nothing listening answers at once; a server that accepts and says nothing, after the timeout.
    Meanwhile the worker serves other clients: it never waits on the database itself."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))  # bound, not listening yet: connections are refused
        port = silent.getsockname()[1]
        b = start_broker("--workers", "1", "--config", write_config(
            tmp_path / "plexmq.toml", f'auth_database = "mysql://plexmq:x@127.0.0.1:{port}/plexmq"\n'
            "auth_database_timeout = 1.0\nallow_anonymous = true\n"))
        start = time.monotonic()
        assert connack(b.port, "alice", "wonderland") == UNAVAILABLE
        assert time.monotonic() - start < 0.5  # refused: no need to wait for the timeout

        silent.listen(8)  # now the kernel accepts, and nobody ever sends the server greeting
        waiting = RawClient(b.port)
        start = time.monotonic()
        waiting.send(p.encode_connect(f"sql-{uid()}", username="alice", password=b"wonderland"))
        silent.settimeout(5)
        query, _ = silent.accept()  # a thread of the worker is now waiting for the greeting
        with query:
            assert connack(b.port, None, None) == OK  # and the worker serves other clients meanwhile
            assert not select.select([waiting.sock], [], [], 0)[0], "the login was answered before its timeout"
            assert waiting.recv() == (0x20, b"\x00\x03")
            assert 0.9 < time.monotonic() - start < 3
        waiting.read_until_closed()
    assert b.output().count("answering CONNACK 0x03 while the authentication database cannot answer") == 1


# ------------------------------------------------------------------------------------ config


@pytest.mark.parametrize("text, message", [
    ('auth_database = "postgres://u:secret@h/db"\n', "auth_database: must be a URL like mysql://"),
    ('auth_database = "mysql://u:secret@h:99999/db"\n', "auth_database: must be a URL like mysql://"),
    ('auth_database = "mysql://u:secret@h/"\n', "auth_database: must be a URL like mysql://"),
    ('auth_database_acl = true\n', "auth_database_acl: needs auth_database"),
    ('auth_database = "mysql://u:secret@h/db"\npassword_file = "x"\n', "set one of them, not both"),
    ('auth_database = "mysql://u:secret@h/db"\nauth_database_acl = true\nacl_file = "x"\n', "acl_file empty"),
    ('auth_database_cache = -1\n', "auth_database_cache' must be between 0"),
    ('auth_database_timeout = 0\n', "auth_database_timeout' must be between 0.1"),
])
def test_bad_database_settings_stop_startup_with_one_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(cfg.ConfigError) as info:
        cfg.load(write_config(tmp_path / "plexmq.toml", text), {})
    assert message in str(info.value) and "\n" not in str(info.value)
    assert "secret" not in str(info.value)  # the URL's password is never repeated


def test_a_database_is_authentication_enough_to_listen_beyond_loopback(tmp_path: Path) -> None:
    config = cfg.load(write_config(tmp_path / "plexmq.toml", 'host = "0.0.0.0"\n'
                                   'auth_database = "mariadb://u:p%40ss@db.example/mqtt"\n'), {})
    assert config["auth_database_cache"] == 60.0 and config["auth_database_timeout"] == 3.0
    assert connect_args(config["auth_database"]) == {"host": "db.example", "port": 3306, "user": "u",
                                                     "password": "p@ss", "database": "mqtt"}
