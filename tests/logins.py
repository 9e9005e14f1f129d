"""Logins for the authentication tests: a password file, a config file, a CONNECT with credentials."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plexmq.workers.auth.passwords import set_password
from tests.cli import CHEAP
from tests.mqtt import RawClient
from tests.steps import uid


def users(path: Path, **passwords: str) -> Path:
    for name, password in passwords.items():
        set_password(str(path), name, password, n=CHEAP)
    return path


def config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "plexmq.toml"
    path.write_text(text)
    return str(path)


def login(port: int, username: str | None, password: bytes | None, client_id: str = "", **kw: Any) -> tuple[RawClient, int]:
    c = RawClient(port)
    _present, code = c.connect(client_id or f"auth-{uid()}", username=username, password=password, **kw)
    return c, code
