"""The `plexmq` command: `serve` runs the broker (the default); more subcommands join it here."""

from __future__ import annotations

import argparse
import importlib
import logging
import logging.handlers
import sys
from typing import Any

from plexmq.acceptor import config as cfg
from plexmq.process import setup_logging


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="plexmq", description="A multi-process MQTT 3.1, 3.1.1 and 5.0 broker.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser("serve", help="run the broker (default config embedded; no file needed)")
    serve.add_argument("--config", metavar="FILE", help="TOML config file; the command line wins over it")
    serve.add_argument("--host", help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="MQTT port (default 1883)")
    serve.add_argument("--workers", type=int, metavar="N", help="connection workers (default: cores - 1, at least 1)")
    serve.add_argument("--max-connections", type=int, metavar="N",
                       help="connections the broker holds at most; without --workers, enough workers start to hold them "
                            "under the open-file limit (default 0: no limit)")
    serve.add_argument("--role", choices=("all", "router", "node"),
                       help="all: everything on this host (default); router: the router alone, for nodes on "
                            "other hosts; node: listeners and workers that join the router at --router")
    serve.add_argument("--router", metavar="tcp://HOST:PORT", help="role node: the router's router_bind")
    serve.add_argument("--router-bind", metavar="tcp://HOST:PORT", help="where the router listens for workers and nodes")
    serve.add_argument("--router-curve-dir", metavar="DIR", help="the CURVE keys router and nodes share (deploy/nodes.md)")
    serve.add_argument("--node-name", metavar="NAME", help="role node: its name among the router's nodes (default: host name)")
    serve.add_argument("--router-lease", type=float, metavar="SECONDS",
                       help="with a PostgreSQL store: how long the active router's lease lasts unrenewed (default 2)")
    serve.add_argument("--router-name", metavar="NAME",
                       help="with a PostgreSQL store: this router's name in the lease (default HOST:PORT of router_bind)")
    serve.add_argument("--log-level", choices=cfg.LOG_LEVELS, help="default info")
    serve.add_argument("--log-format", choices=("text", "json"), help="json: one object per line (default text)")
    serve.add_argument("--metrics-port", type=int, metavar="PORT",
                       help="Prometheus endpoint on metrics_host (default 9883; 0: any free port; -1: none)")
    serve.add_argument("--console-port", type=int, metavar="PORT",
                       help="web console on console_host (default 18083; 0: any free port; -1: none)")
    serve.add_argument("--data-dir", metavar="DIR",
                       help="where sessions, queues and retained messages are kept (default ./plexmq-data)")
    serve.add_argument("--no-persistence", dest="persistence", action="store_const", const=False,
                       help="keep everything in memory only")
    serve.add_argument("--sync", choices=("normal", "full"),
                       help="store durability: full also survives power loss (default normal)")
    serve.add_argument("--store", metavar="DSN", help="postgresql://USER@HOST:PORT/DB: keep the router's state in PostgreSQL "
                                                      "(default: SQLite in the data dir); its password best from "
                                                      "PGPASSFILE or PGPASSWORD")
    for name, (_module, text) in TOOLS.items():
        commands.add_parser(name, help=text, add_help=False)
    return parser


# subcommands that parse their own arguments: name -> (module with main(argv) -> int, or MODULE:FUNCTION, help)
TOOLS = {
    "bench": ("plexmq.bench.cli", "the load generator and benchmark scenarios (plexmq bench --help)"),
    "pipeline": ("plexmq.pipeline.__main__", "PySpark jobs over archived traffic and benchmark samples (plexmq pipeline --help)"),
    "status": ("plexmq.acceptor.status", "a live table of a running broker's processes (plexmq status --help)"),
    "clients": ("plexmq.acceptor.clients", "list the connected clients of a running broker (plexmq clients --help)"),
    "ban": ("plexmq.acceptor.bans:ban", "ban clients of a running broker by client id, username or address (plexmq ban --help)"),
    "unban": ("plexmq.acceptor.bans:unban", "lift a ban (plexmq unban --help)"),
    "bans": ("plexmq.acceptor.bans:bans", "list the bans of a running broker (plexmq bans --help)"),
    "reload": ("plexmq.acceptor.reload", "make a running broker re-read its config file (SIGHUP)"),
    "keys": ("plexmq.acceptor.keys", "create the CURVE keys a router and its nodes share (plexmq keys DIR)"),
    "bridges": ("plexmq.acceptor.bridges.status", "the bridges of a running broker: state, counts (plexmq bridges --help)"),
    "passwd": ("plexmq.acceptor.passwd", "add, change or delete a user of a password file (plexmq passwd --help)"),
}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in TOOLS:  # each tool parses its own arguments
        module, _, function = TOOLS[args[0]][0].partition(":")
        return getattr(importlib.import_module(module), function or "main")(args[1:])
    if not args or args[0].startswith("-") and args[0] not in ("-h", "--help"):
        args.insert(0, "serve")
    parser = _parser()
    ns = parser.parse_args(args)
    if ns.command == "serve":
        overrides: dict[str, Any] = {key: value for key, value in vars(ns).items()
                                     if key not in ("command", "config") and value is not None}
        held = logging.handlers.BufferingHandler(capacity=1 << 16)  # what the load warns of, before logging is set up
        logging.getLogger().addHandler(held)
        try:
            config = cfg.load(ns.config, overrides)
        except cfg.ConfigError as exc:
            print(f"plexmq: {exc}", file=sys.stderr)
            return 2
        finally:
            logging.getLogger().removeHandler(held)
        setup_logging(config["log_level"], config["log_format"])
        for record in held.buffer:  # now as every other line: time, level, process
            if logging.getLogger(record.name).isEnabledFor(record.levelno):
                logging.getLogger(record.name).handle(record)
        from plexmq.acceptor.serve import serve

        return serve(config, lambda: cfg.load(ns.config, overrides))
    parser.print_help()
    return 2
