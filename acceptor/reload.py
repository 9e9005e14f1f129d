"""SIGHUP (or `plexmq reload`): read the config file again and apply what can change without dropping a client.

The acceptor re-reads the file (with the same command-line overrides), keeps the keys that only a
restart can change (and says which of them differ), writes the result where every child finds it
(`config_path`, also the config of children started later) and signals the children, which apply
their part: log level, limits, authentication and ACL files, archive filters, tenants (the acceptor
binds and closes tenant listeners, acceptor/listening.py; the workers close the connections of a tenant
removed or disabled; the router drops the state of a tenant removed with `on_remove = "drop"`), and
bridges (each added, changed or removed one alone: the bridge process, acceptor/bridges/__main__.py).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import orjson
import psutil

from plexmq.acceptor import bridges
from plexmq.acceptor import config as cfg
from plexmq.process import named_worker

log = logging.getLogger("plexmq.acceptor")

RELOADABLE = {
    "log_level", "connect_timeout", "max_packet_size", "max_user_properties", "max_subscriptions", "max_queued_messages",
    "max_queued_bytes",
    "persistent_client_expiration", "password_file", "acl_file", "allow_anonymous", "max_connections",
    "max_connection_rate", "client_message_rate", "client_byte_rate", "rate_limit_action", "allow_networks",
    "deny_networks", "max_keepalive", "response_information", "server_reference", "server_moved",
    "archive.topics", "memory_limit", "stop_timeout", "tls.crlfile", "strict_file_modes",
    "jwt_jwks_file", "jwt_audience", "jwt_issuer", "jwt_disconnect_on_expiry", "auth_database", "auth_database_acl",
    "auth_database_cache",
    "auth_database_timeout",
    "tenants", "tenant_separator", "tenant_required", "tenants_dir", "bridges",
}


def _flat(config: dict[str, Any]) -> dict[str, Any]:
    """Every option as `key` or `section.key`."""
    flat: dict[str, Any] = {}
    for section, options in cfg.SCHEMA.items():
        source = config[section] if section else config
        for key in options:
            flat[f"{section}.{key}" if section else key] = source[key]
    flat["tenants"] = config["tenants"]
    flat["bridges"] = config["bridges"]
    return flat


FILES = ("password_file", "acl_file", "jwt_jwks_file", "tls.crlfile")  # files a reload reads again
TENANT_FILES = ("password_file", "acl_file", "jwt_jwks_file", "console_admins")


class Files:
    """What the files that a reload reads again held at the last (re)load: their paths may stay the
    same while their contents change, and the reload's line must say so (it said "changed: nothing"
    after an edited ACL file, whose new rules applied)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.digests = self._digests(config)

    @staticmethod
    def _digests(config: dict[str, Any]) -> dict[tuple[str, str], bytes | None]:
        """(key, path) -> the file's SHA-256 (None: unreadable) for each file the config names."""
        flat = _flat(config)
        named = [(key, flat[key]) for key in FILES]
        named += [(f"tenants.{name}.{key}", table[key]) for name, table in config["tenants"].items() for key in TENANT_FILES]
        found: dict[tuple[str, str], bytes | None] = {}
        for key, path in named:
            if path:
                try:
                    with open(path, "rb") as f:
                        found[key, path] = hashlib.sha256(f.read()).digest()
                except OSError:
                    found[key, path] = None
        return found

    def edited(self, config: dict[str, Any]) -> list[str]:
        """`key (path edited)` of each file that the config names as before and that changed since the last
        call (or the start); remembers them as they are now."""
        now = self._digests(config)
        edited = [f"{key} ({path} edited)" for (key, path), digest in now.items()
                  if (key, path) in self.digests and self.digests[key, path] != digest]
        self.digests = now
        return edited


def reread(current: dict[str, Any], load: Callable[[], dict[str, Any]], files: Files) -> dict[str, Any] | None:
    """The config to run with now, or None when the file is bad (the running one is kept)."""
    try:
        fresh = load()
    except cfg.ConfigError as exc:
        log.error("SIGHUP: config not reloaded: %s", exc)
        return None
    edited = files.edited(fresh)
    old, new = _flat(current), _flat(fresh)
    for key in ("data_dir", "archive.dir"):  # serve may have made these absolute
        if os.path.abspath(new[key]) == os.path.abspath(old[key]):
            new[key] = old[key]
    new["workers"] = new["workers"] or old["workers"]  # 0: the default serve worked out
    new["router_name"] = new["router_name"] or old["router_name"]  # "": the default serve worked out
    changed = sorted(k for k in new if new[k] != old[k] and k in RELOADABLE)
    restart = sorted(k for k in new if new[k] != old[k] and k not in RELOADABLE)
    merged = orjson.loads(orjson.dumps(current))
    for key in changed:
        section, _, name = key.rpartition(".")
        (merged[section] if section else merged)[name] = new[key]
    if "bridges" in changed:  # named one by one; a bridge kept keeps its token (it is logged in with it)
        merged["bridge_logins"] = bridges.logins(merged["bridges"], current["bridge_logins"])
        changed.remove("bridges")
        changed += _bridges_changed(old["bridges"], new["bridges"])
    log.info("SIGHUP: config reloaded; changed: %s%s", ", ".join(changed + edited) or "nothing",
             f"; needs a restart: {', '.join(restart)}" if restart else "")
    return merged


def _bridges_changed(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """`bridges.NAME (added|changed|removed)` of each bridge a reload changes."""
    return [f"bridges.{name} ({'added' if name not in old else 'removed' if name not in new else 'changed'})"
            for name in sorted(old.keys() | new.keys()) if old.get(name) != new.get(name)]


def write(path: str, config: dict[str, Any]) -> None:
    """Where the children read their config on SIGHUP: mode 0600 (it may hold the router link's
    CURVE secret keys), and replaced whole, so a child never reads it half written."""
    part = f"{path}.part"
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(fd, 0o600)  # a .part left by a crash may have had another mode
        f.write(orjson.dumps(config))
    os.replace(part, path)


def _is_broker(cmdline: list[str]) -> bool:
    """`plexmq [serve] ...` or `python -m plexmq.acceptor [serve] ...` (not its router or workers)."""
    for i, word in enumerate(cmdline):
        if word == "-m":
            return cmdline[i + 1:i + 2] == ["plexmq.acceptor"]
        if os.path.basename(word) == "plexmq":
            rest = cmdline[i + 1:]
            return not rest or rest[0] == "serve" or rest[0].startswith("-")
    return False


def _main_process(name: str, cmdline: list[str]) -> bool:
    """A broker's main process (its acceptor): a worker is forked from it with the same command
    line, but names itself (plexmq/process.py)."""
    return named_worker(name) is None and _is_broker(cmdline)


def own_brokers() -> dict[int, list[str]]:
    """The running brokers this user started (pid -> command line): another user's broker is not
    this user's to reload, root's included, whatever the command line says."""
    uid = os.getuid()
    return {p.pid: p.info["cmdline"] for p in psutil.process_iter(["name", "cmdline", "uids"])
            if p.pid != os.getpid() and p.info["uids"] is not None and p.info["uids"].real == uid
            and _main_process(p.info["name"] or "", p.info["cmdline"] or [])}


def broker_at(pid: int) -> list[str]:
    """The command line of the broker whose main process is `pid`; ValueError (why not) when `pid`
    is no such process: a SIGHUP kills most programs."""
    try:
        proc = psutil.Process(pid)
        name, cmdline = proc.name(), proc.cmdline()
    except psutil.NoSuchProcess:
        raise ValueError("no such process") from None
    except psutil.AccessDenied:
        raise ValueError("not this user's to inspect") from None
    if not _main_process(name, cmdline):
        what = "a worker of a broker" if named_worker(name) is not None else " ".join(cmdline) or name
        raise ValueError(f"not a plexmq broker's main process: {what}")
    return cmdline


def main(argv: list[str]) -> int:
    """`plexmq reload [--pid PID]`: SIGHUP the running broker (the one of this user, if only one)."""
    parser = argparse.ArgumentParser(prog="plexmq reload", description="Make a running broker re-read its config.")
    parser.add_argument("--pid", type=int, help="the broker's pid (default: the only plexmq serve of this user)")
    args = parser.parse_args(argv)
    if args.pid is not None:
        try:
            brokers = {args.pid: broker_at(args.pid)}
        except ValueError as exc:
            print(f"plexmq reload: pid {args.pid}: {exc}", file=sys.stderr)
            return 2
    else:
        brokers = own_brokers()
    if len(brokers) != 1:
        found = ", ".join(map(str, brokers)) or "none"
        print(f"plexmq reload: {'no' if not brokers else 'more than one'} running broker of this user "
              f"(pids: {found}); use --pid", file=sys.stderr)
        return 2
    ((pid, cmdline),) = brokers.items()
    try:
        os.kill(pid, signal.SIGHUP)
    except OSError as exc:
        print(f"plexmq reload: cannot signal pid {pid}: {exc.strerror}", file=sys.stderr)
        return 2
    print(f"sent SIGHUP to plexmq (pid {pid}: {' '.join(cmdline)}); its log says what changed")
    return 0
