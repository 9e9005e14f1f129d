"""A real broker on a PostgreSQL store (`store = "postgresql://..."`): what it acknowledged survives a
kill -9 of its router; a bad `store` stops startup with one line; a database that dies makes the
router exit instead of hanging. A private server (plexmq/bench/postgres.py), a fresh database per test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from plexmq.bench.postgres import PostgreSQL, installed
from plexmq.mqtt import v4 as p
from tests.conftest import ROOT, wait_for
from tests.mqtt import RawClient
from tests.postgres import fresh_database
from tests.processes import OwnBroker, alive
from tests.steps import connect, publish, receive, subscribe, sync, uid

pytestmark = pytest.mark.skipif(not installed(), reason="no PostgreSQL server installed")


def _broker(tmp_path: Path, dsn: str) -> OwnBroker:
    return OwnBroker(tmp_path / "broker.log", ["--workers", "1", "--store", dsn, "--data-dir", str(tmp_path / "unused")],
                     session=True)


def test_a_persistent_session_and_retained_messages_survive_a_kill_of_the_router(pg: PostgreSQL,
                                                                                  tmp_path: Path) -> None:
    dsn = fresh_database(pg, "b")
    b = _broker(tmp_path, dsn)
    try:
        cid, topic = f"pg-{uid()}", f"pg/{uid()}"
        sub = connect(b.port, cid, clean=False)
        assert subscribe(sub, 1, [(topic, 1)]) == [1]
        sub.send(p.DISCONNECT_PACKET)
        sub.read_until_closed()
        pub = connect(b.port)
        queued = [b"queued-%d" % i for i in range(20)]
        for i, payload in enumerate(queued):
            publish(pub, topic, payload, 1, packet_id=1 + i)  # PUBACK: committed to PostgreSQL
        publish(pub, f"{topic}/r", b"kept", 1, retain=True, packet_id=100)
        router = b.router()
        assert router is not None
        os.kill(router.pid, signal.SIGKILL)
        wait_for(lambda: (r := b.router()) is not None and r.pid != router.pid, 10, "a new router")

        # a CONNECT the worker sent the old router is closed when the worker joins the new one: try again
        sub = wait_for(lambda: _connected(b.port, cid), 10, "the session back on the new router")
        assert [m.payload for m in receive(sub, payloads=queued)] == queued
        fresh = connect(b.port)
        assert subscribe(fresh, 1, [(f"{topic}/#", 1)]) == [1]
        assert [(m.topic, m.payload, m.retain) for m in sync(fresh)] == [(f"{topic}/r", b"kept", True)]
        assert not (tmp_path / "unused").exists(), "a PostgreSQL store has no use for the data dir"
        assert pg.sql(f"SELECT count(*) FROM pg_database WHERE datname = '{dsn.rsplit('/', 1)[1]}'") == [(1,)]
    finally:
        b.stop()


def _connected(port: int, client_id: str) -> RawClient | None:
    c = RawClient(port)
    try:
        present, code = c.connect(client_id, False)
    except AssertionError:  # closed: the worker joined the new router meanwhile
        return None
    assert (present, code) == (True, 0), "the persistent session was lost"
    return c


@pytest.mark.parametrize("value", ["mysql://user:sekrit@db/plexmq", "postgresql-ish"])
def test_a_bad_store_stops_startup_with_one_line(value: str) -> None:
    done = subprocess.run([sys.executable, "-m", "plexmq.acceptor", "serve", "--port", "0", "--store", value],
                          cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("plexmq: store: must be empty")
    assert "sekrit" not in done.stderr


def test_a_store_without_persistence_stops_startup() -> None:
    done = subprocess.run([sys.executable, "-m", "plexmq.acceptor", "serve", "--port", "0", "--no-persistence",
                           "--store", "postgresql://db/plexmq"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stderr) == (2, "plexmq: store: a PostgreSQL store needs persistence = true\n")


def test_a_database_that_dies_makes_the_router_exit_not_hang(tmp_path: Path) -> None:
    server = PostgreSQL()
    try:
        b = _broker(tmp_path, server.dsn)
        try:
            router = b.router()
            assert router is not None
            server.kill()
            pub = connect(b.port)
            pub.send(p.encode_publish(b"pg/dead", b"never acknowledged", 1, True, packet_id=1))  # retained: stored
            wait_for(lambda: not alive(router), 15, "the router to step down when its commit fails")
            assert f"router stops: the store failed: postgresql://{server.host}:{server.port}/postgres: " in b.output()
            # restarted, the router is a standby that waits for the database (it never exits for it)
            wait_for(lambda: "cannot reach the database" in b.output(), 15, "the restarted router to wait")
            with pytest.raises(TimeoutError):  # no PUBACK for what the store never kept
                pub.recv(1.0)
        finally:
            b.stop()
    finally:
        server.remove()
