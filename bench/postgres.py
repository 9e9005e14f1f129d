"""A private PostgreSQL server for the failover benchmark (bench/failover.py) and the tests of the
standby routers' shared store (issue 24): its own cluster in a fresh directory, its own port, started
from the Debian package's binaries, optionally inside a network namespace (tests/hosts.py).

PostgreSQL refuses to run as root, so the cluster belongs to the `postgres` user the package makes
and the server runs as that user (`setpriv`); its directory lies outside pytest's temporary tree,
which is private to root. Needs root and `apt-get install postgresql` (.ci/run installs it; the tests
skip without it).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from plexmq.bench.brokers import free_port

START_WAIT = 60.0  # seconds a server may take to take connections

_FOUND = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
BIN = Path(_FOUND[-1]).parent if _FOUND else None  # the newest installed major version
OWNER = "postgres"
# setpriv execs the server itself (runuser would fork it): its pid is the postmaster's, to kill and wait for
_AS_OWNER = ["setpriv", f"--reuid={OWNER}", f"--regid={OWNER}", "--init-groups", "--"]


def installed() -> bool:
    """Whether a server and the user it runs as are here."""
    if BIN is None:
        return False
    try:
        pwd.getpwnam(OWNER)
    except KeyError:
        return False
    return True


class PostgreSQL:
    """A running private server. `netns`: run it in that network namespace, listening on `host`."""

    def __init__(self, host: str = "127.0.0.1", netns: str | None = None, port: int | None = None) -> None:
        assert BIN is not None, "no PostgreSQL server installed"
        self.base = Path(tempfile.mkdtemp(prefix="plexmq-pg-"))
        os.chmod(self.base, 0o755)
        self.data = self.base / "data"
        self.log = self.base / "postgres.log"
        self.host, self.netns = host, netns
        self.port = port or free_port()
        owner = pwd.getpwnam(OWNER)
        os.chown(self.base, owner.pw_uid, owner.pw_gid)
        self._as_owner([str(BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                        "--no-sync", "-E", "UTF8", "--locale=C"], check=True)
        with open(self.data / "pg_hba.conf", "a") as hba:  # the routers of other namespaces, without a password
            hba.write("host all all 0.0.0.0/0 trust\n")
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/postgres"

    def _as_owner(self, argv: list[str], check: bool = False) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([*_AS_OWNER, *argv], check=check, capture_output=True, timeout=120)

    def start(self) -> None:
        """Start the server (again) and wait until it takes connections."""
        assert BIN is not None
        argv = [*_AS_OWNER, str(BIN / "postgres"), "-D", str(self.data), "-h", self.host,
                "-p", str(self.port), "-k", str(self.base), "-c", "shared_buffers=16MB", "-c", "max_connections=50",
                "-c", "logging_collector=off"]
        if self.netns:
            argv = ["ip", "netns", "exec", self.netns, *argv]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_WAIT
        try:
            while not self._ready():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"PostgreSQL took no connection within {START_WAIT:g} s: see {self.log}")
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"postgres exited with {self.proc.returncode}:\n{self.log.read_text(errors='replace')}")
        try:
            with psycopg.connect(host=str(self.base), port=self.port, user="postgres", dbname="postgres",
                                 connect_timeout=1):
                return True
        except psycopg.OperationalError:
            return False

    def sql(self, statement: str, *args: object) -> list[tuple]:
        """Run one statement as the superuser over the local socket; its rows (none for a command)."""
        with psycopg.connect(host=str(self.base), port=self.port, user="postgres", dbname="postgres",
                             autocommit=True) as db:
            cursor = db.execute(statement.encode(), args or None)  # bytes: a caller's own SQL text, not a literal
            return cursor.fetchall() if cursor.description else []

    def kill(self) -> None:
        """kill -9 of the server (all its processes: the postmaster's group)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its backends are in its session: the group goes
            self.proc.wait(10)

    def stop(self) -> None:
        """A fast shutdown (SIGINT: sessions ended, a clean checkpoint)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)
