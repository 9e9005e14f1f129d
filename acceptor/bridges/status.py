"""`plexmq bridges`: each bridge of a running broker, its state and counts, from the status file the
bridge process writes in the run dir once a second (`write`) and the queues the router writes beside
it (router/ops/stats.py): the broker of `--config` (its run_dir), or the one bridge process of this user.
`queued`: the messages waiting in the router for the bridge's local session, not yet sent to it; `held`:
those the bridge has taken and the other broker not yet acknowledged (at most its local session's window, 1,000)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import orjson

from plexmq.process import own_run_dirs

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


def _run_dirs() -> list[str]:
    """The run dirs of this user's bridge processes."""
    return own_run_dirs("plexmq.acceptor.bridges")


def _run_dir(config_path: str | None) -> str:
    if config_path:
        from plexmq.acceptor import config as cfg

        try:
            config = cfg.load(config_path, {})
        except cfg.ConfigError as exc:
            raise SystemExit(f"plexmq bridges: {exc}") from None
        if not config["bridges"]:
            raise SystemExit(f"plexmq bridges: {config_path} declares no bridge")
        if config["run_dir"]:
            return str(config["run_dir"])
    found = _run_dirs()
    if len(found) != 1:
        raise SystemExit(f"plexmq bridges: {'no' if not found else 'more than one'} running bridge process of this "
                         "user; name the broker's config (with its run_dir) with --config")
    return found[0]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="plexmq bridges", description="The bridges of a running broker.")
    parser.add_argument("--config", metavar="FILE", help="the broker's config file (its run_dir); default: "
                        "the one running bridge process of this user")
    args = parser.parse_args(argv)
    run_dir = _run_dir(args.config)
    if not os.path.exists(os.path.join(run_dir, FILE)):
        print(f"plexmq bridges: {run_dir} holds no {FILE}: the bridge process has not written it (yet)", file=sys.stderr)
        return 1
    queues = read(run_dir, QUEUES)
    print(f"{'bridge':<20} {'since':<19} {'queued':>7} {'held':>5} {'sent':>9} {'received':>9} {'dropped':>8}  state")
    for name, bridge in sorted(read(run_dir).items()):
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(bridge["since"]))
        queued = queues.get(name, "?")  # ?: the router has not counted it (yet)
        print(f"{name:<20} {since:<19} {queued:>7} {bridge['held']:>5} {bridge['sent']:>9} {bridge['received']:>9} "
              f"{bridge['dropped']:>8}  {bridge['state']}")
    return 0
