"""What the bridge process, the router and `plexmq bridges` share of the bridges (acceptor/bridges/): the
local client id a bridge logs into this broker with, and the status files in the run dir: the bridge
process writes each bridge's state and counts once a second, the router each bridge's queue beside it
(router/ops/stats.py), and `plexmq bridges` and the router read them."""

from __future__ import annotations

import os
import time
from typing import Any

import orjson

LOCAL_PREFIX = "plexmq-bridge-"  # + the bridge's name: its client id on this broker, reserved for its token
FILE = "bridges.json"  # the bridge process's: each bridge's state and counts
QUEUES = "bridge-queues.json"  # the router's: each bridge's queued (`read` adds them)
STALE = 5.0  # seconds: a file older than this was left by a process that is down


def write(path: str, status: dict[str, Any]) -> None:
    """Replaced whole (a reader never sees half of it), mode 0600 like everything in the run dir."""
    part = f"{path}.part"
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(orjson.dumps({"time": time.time(), "bridges": status}))
    os.replace(part, path)


def read(run_dir: str, name: str = FILE) -> dict[str, Any]:
    """What the file `name` of the run dir says of each bridge ({} where there is none); a bridge
    process down (its file is stale) says so in each bridge's state."""
    try:
        with open(os.path.join(run_dir, name), "rb") as f:
            written = orjson.loads(f.read())
    except (OSError, orjson.JSONDecodeError):
        return {}
    bridges: dict[str, Any] = written["bridges"]
    if name == FILE and time.time() - written["time"] > STALE:
        for bridge in bridges.values():
            bridge["state"] = f"bridge process down (last word {time.time() - written['time']:.0f} s ago: {bridge['state']})"
    return bridges


def local_client_id(name: str) -> str:
    return LOCAL_PREFIX + name
