"""What the web console's tests share: a broker with a console and one admin, and its address."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from plexmq.workers.passwords import set_password
from tests.cli import CHEAP
from tests.conftest import Broker, wait_for

ADMIN, PASSWORD = "ops", "correct horse battery"


def console_broker(start_broker: Callable[..., Broker], tmp_path: Path, *args: str, config: str = "") -> tuple[Broker, str]:
    """A broker whose console (on a free port) has the admin ADMIN; it and the console's URL (no slash).
    `config`: more of the config file (tenants ...), after the console's key."""
    admins = tmp_path / "admins"
    set_password(str(admins), ADMIN, PASSWORD, n=CHEAP)  # what `plexmq passwd` writes
    with open(tmp_path / "plexmq.toml", "w") as f:
        f.write(f'console_admins = "{admins}"\n{config}')
    b = start_broker("--config", str(tmp_path / "plexmq.toml"), "--workers", "2", "--console-port", "0", *args)
    return b, console_url(b)


def console_url(b: Broker) -> str:
    found = wait_for(lambda: re.search(r"console on (http://\S+)/", b.output()), 10, "the console line")
    return found.group(1)
