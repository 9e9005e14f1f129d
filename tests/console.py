"""What the web console's tests share: a broker with a console and one admin, and its address."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from plexmq.workers.passwords import set_password
from tests.cli import CHEAP
from tests.conftest import Broker, wait_for

ADMIN, PASSWORD = "ops", "correct horse battery"


def console_broker(start_broker: Callable[..., Broker], tmp_path: Path, *args: str,
                   tenants: tuple[str, ...] = ()) -> tuple[Broker, str]:
    """A broker whose console (on a free port) has the admin ADMIN; it and the console's URL (no slash).
    With `tenants`: those tenants declared (a username `NAME@TENANT` joins one), each with its own
    console admin ADMIN (password PASSWORD, logging in with the tenant's name)."""
    admins = tmp_path / "admins"
    set_password(str(admins), ADMIN, PASSWORD, n=CHEAP)  # what `plexmq passwd` writes
    config = f'console_admins = "{admins}"\n' + ('tenant_separator = "@"\n' if tenants else "")
    for tenant in tenants:
        set_password(str(tmp_path / f"admins-{tenant}"), ADMIN, PASSWORD, n=CHEAP)
        config += f'[tenants.{tenant}]\nconsole_admins = "{tmp_path / f"admins-{tenant}"}"\n'
    with open(tmp_path / "plexmq.toml", "w") as f:
        f.write(config)
    b = start_broker("--config", str(tmp_path / "plexmq.toml"), "--workers", "2", "--console-port", "0", *args)
    return b, console_url(b)


def console_url(b: Broker) -> str:
    found = wait_for(lambda: re.search(r"console on (http://\S+)/", b.output()), 10, "the console line")
    return found.group(1)
