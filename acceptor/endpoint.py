"""Which broker `plexmq status`, `plexmq clients` and `plexmq ban` talk to: `--metrics URL` (or
HOST:PORT), or `--config FILE`, the broker's own config file: its metrics_host and metrics_port, and its
run dir (acceptor/rundir.py), where the admin token is and whose lock says whether that broker is
running; and an admin request to it, with that token (`request`)."""

from __future__ import annotations

import argparse
import glob
import os
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import NamedTuple

from plexmq.acceptor import config as cfg
from plexmq.acceptor import rundir
from plexmq.router.ops import admin

DEFAULT = "http://127.0.0.1:9883"
ANY = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}  # a wildcard address is reached on loopback


class Refused(Exception):
    """What to print instead of an answer (one line; exit status 1)."""


class Endpoint(NamedTuple):
    url: str  # http://HOST:PORT
    run_dir: str  # the running broker's, from its config file ("": unknown, found by its port)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument("--metrics", metavar="URL", help=f"the broker's metrics endpoint, URL or HOST:PORT (default {DEFAULT})")
    chosen.add_argument("--config", metavar="FILE", help="the broker's config file: its metrics endpoint and run dir")


def find(args: argparse.Namespace) -> Endpoint:
    """The endpoint the arguments name, checked to be listening; Refused when it is not."""
    found = _from_config(args.config) if args.config else Endpoint(_url(args.metrics or DEFAULT), "")
    probe(found.url)
    return found


def _url(text: str) -> str:
    url = (text if "://" in text else f"http://{text}").rstrip("/")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018  # raises ValueError on a port that is not a number
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise Refused(f"--metrics {text}: not a URL (http://HOST:PORT) or HOST:PORT")
    return url


def _from_config(path: str) -> Endpoint:
    """The endpoint of the broker that runs with the config file `path`."""
    try:
        config = cfg.load(path, {})
    except cfg.ConfigError as exc:
        raise Refused(str(exc)) from None
    port, run_dir = config["metrics_port"], config["run_dir"]
    if port < 0:
        raise Refused(f"{path}: metrics_port = -1: that broker serves no metrics endpoint")
    if run_dir:
        try:
            holder = rundir.holder(run_dir)
        except OSError as exc:
            raise Refused(f"cannot read the run dir {run_dir} ({path}): {exc.strerror}") from None
        if holder is None:
            raise Refused(f"no running broker holds the run dir {run_dir} ({path}): what is there is a stopped one's")
    if not port:  # any free port: the one the running broker's token is named after
        tokens = glob.glob(os.path.join(glob.escape(run_dir), "admin-*.token")) if run_dir else []
        if len(tokens) != 1:
            raise Refused(f"{path}: metrics_port = 0 (any free port) and no run_dir that names it: use --metrics")
        port = int(os.path.basename(tokens[0])[len("admin-"):-len(".token")])
    host = ANY.get(config["metrics_host"], config["metrics_host"])
    return Endpoint(f"http://{f'[{host}]' if ':' in host else host}:{port}", run_dir)


def probe(url: str) -> None:
    """Refused ("nothing listens on ...") unless something accepts a connection at `url`."""
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    where = f"{parts.hostname}:{port}"
    try:
        socket.create_connection((parts.hostname, port), timeout=5).close()
    except ConnectionRefusedError:
        raise Refused(f"nothing listens on {where}") from None
    except OSError as exc:
        raise Refused(f"cannot reach {where}: {exc.strerror or exc}") from None


def token_file(found: Endpoint) -> str:
    """The admin token of the broker at `found`: in its run dir, or that of the one running broker of
    this user that serves the endpoint's port."""
    port = urllib.parse.urlsplit(found.url).port or 80
    if found.run_dir:
        return admin.token_path(found.run_dir, port)
    paths = admin.find(port)
    if len(paths) != 1:
        which = f"({', '.join(paths)})" if paths else "of this user"
        raise Refused(f"{'no' if not paths else 'more than one'} running broker {which} serves port {port}; "
                      "use --token-file or --config")
    return paths[0]


def admin_token(path: str) -> str:
    try:
        return admin.read(path)
    except OSError as exc:
        raise Refused(f"cannot read the admin token {path}: {exc.strerror}") from None


def request(url: str, token: str, path: str, body: bytes | None = None) -> bytes:
    """GET `path`, or POST `body` (JSON) to it, with the token; the answer's body (Refused with the
    broker's refusal, or why it cannot be reached)."""
    headers = {"Authorization": f"Bearer {token}"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    try:
        with urllib.request.urlopen(urllib.request.Request(url + path, body, headers), timeout=15) as answer:
            return answer.read()
    except urllib.error.HTTPError as exc:
        raise Refused(exc.read().decode().strip()) from None
    except (urllib.error.URLError, OSError) as exc:
        raise Refused(f"cannot reach {url}: {getattr(exc, 'reason', exc)}") from None
