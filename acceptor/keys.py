"""`plexmq keys DIR`: the CURVE key pairs a router and its nodes share (router_curve_dir).

Writes `server.key_secret` / `client.key_secret` (and their `.key` public halves) in ZeroMQ's
certificate format into DIR (made 0700), each secret file 0600; pairs already there are kept, so it is
safe to run on every start. Copy the directory to every node (deploy/nodes.md): a node whose client
key is not the router's is refused.
"""

from __future__ import annotations

import argparse
import os
import sys

import zmq.auth

PAIRS = ("server", "client")


def ensure(key_dir: str) -> list[str]:
    """Create the pairs missing in `key_dir`; the names of those created."""
    os.makedirs(key_dir, mode=0o700, exist_ok=True)
    made = []
    old = os.umask(0o077)  # the secret files are born private
    try:
        for name in PAIRS:
            if not os.path.exists(os.path.join(key_dir, f"{name}.key_secret")):
                zmq.auth.create_certificates(key_dir, name)
                made.append(name)
    finally:
        os.umask(old)
    return made


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="plexmq keys", description="Create the CURVE keys of a router and its nodes.")
    parser.add_argument("dir", metavar="DIR", help="the router_curve_dir to fill (made 0700 if missing)")
    args = parser.parse_args(argv)
    try:
        made = ensure(args.dir)
    except OSError as exc:
        print(f"plexmq keys: {args.dir}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"{args.dir}: " + (f"created the {' and '.join(made)} key pairs" if made else "both key pairs were there already"))
    return 0
