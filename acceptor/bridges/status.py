"""`plexmq bridges`: each bridge of a running broker, its state and counts, from the status file the
bridge process writes in the run dir once a second (`write`): the broker of `--config` (its run_dir),
or the one bridge process of this user. `held`: the messages the bridge has taken and the remote not yet
acknowledged (at most the router's window); more may wait in the bridge's session on the router."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import orjson

from plexmq.process import own_run_dirs

FILE = "bridges.json"


def write(path: str, status: dict[str, Any]) -> None:
    """Replaced whole (a reader never sees half of it), mode 0600 like everything in the run dir."""
    part = f"{path}.part"
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(orjson.dumps({"time": time.time(), "bridges": status}))
    os.replace(part, path)


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
    path = os.path.join(_run_dir(args.config), FILE)
    try:
        with open(path, "rb") as f:
            written = orjson.loads(f.read())
    except (OSError, orjson.JSONDecodeError) as exc:
        print(f"plexmq bridges: cannot read {path}: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
        return 1
    print(f"{'bridge':<20} {'since':<19} {'held':>5} {'sent':>9} {'received':>9} {'dropped':>8}  state")
    for name, bridge in sorted(written["bridges"].items()):
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(bridge["since"]))
        print(f"{name:<20} {since:<19} {bridge['held']:>5} {bridge['sent']:>9} {bridge['received']:>9} "
              f"{bridge['dropped']:>8}  {bridge['state']}")
    age = time.time() - written["time"]
    if age > 5:
        print(f"(written {age:.0f} s ago: the bridge process may be stopped)")
    return 0
