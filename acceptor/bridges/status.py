"""`plexmq bridges`: each bridge of a running broker, its state and counts, from the status file the
bridge process writes in the run dir once a second (plexmq/bridge_status.py) and the queues the router writes beside
it (router/ops/stats.py): the broker of `--config` (its run_dir), or the one bridge process of this user.
`queued`: the messages waiting in the router for the bridge's local session, not yet sent to it; `held`:
those the bridge has taken and the other broker not yet acknowledged (at most its local session's window, 1,000)."""

from __future__ import annotations

import argparse
import os
import sys
import time

from plexmq.bridge_status import FILE, QUEUES, read
from plexmq.process import own_run_dirs


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
