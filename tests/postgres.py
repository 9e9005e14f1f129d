"""The tests' PostgreSQL: one private server (plexmq/bench/postgres.py) for the whole pytest session,
the `pg` fixture of tests/conftest.py, started by the first test that asks for it (a server takes
seconds to make and start); each test then works in a database of its own in it (`fresh_database`),
so that what one test leaves there is never another's starting point.

A test that kills, pauses or reconfigures the server itself (its superuser's password, say) starts one
of its own (PostgreSQL()), or resumes it before it ends, as the paused one in tests/test_standby.py does.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from plexmq.bench.postgres import PostgreSQL, installed
from tests.steps import uid


def fresh_database(server: PostgreSQL, prefix: str = "t") -> str:
    """A new empty database in `server`: its URL (as the superuser, over TCP)."""
    name = f"{prefix}_{uid()}".lower()
    server.sql(f"CREATE DATABASE {name}")
    return server.dsn.rsplit("/", 1)[0] + f"/{name}"


def session_server() -> Iterator[PostgreSQL]:
    """The session's server (the body of conftest's `pg`): skips the test where none is installed."""
    if not installed():
        pytest.skip("no PostgreSQL server installed")
    server = PostgreSQL()
    try:
        yield server
    finally:
        server.kill()  # no shutdown checkpoint: the session's databases go with the directory
        server.remove()
