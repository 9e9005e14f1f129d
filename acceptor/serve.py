"""`plexmq serve`: bind the listeners, start the router and workers, hand off sockets, stop cleanly."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import socket
import sys
from collections.abc import Callable

from plexmq.acceptor import bridges, pidlock, reload, rundir
from plexmq.acceptor.admission import Admission
from plexmq.acceptor.config import curve_keys, default_router_name, listeners, router_endpoints, security_line
from plexmq.acceptor.listening import Listening, bind
from plexmq.acceptor.supervisor import Supervisor
from plexmq.files import Access, private_dir
from plexmq.process import connections_per_worker, hide_in_command_line, raise_fd_limit
from plexmq.router.store import StoreError, open_store
from plexmq.units import counted

log = logging.getLogger("plexmq.acceptor")

LOCK_FILE = "plexmq.lock"  # in the data dir: holds the pid of the broker that claimed it


def default_workers(max_connections: int, per_worker: int, role: str) -> int:
    """One per core (less one for the router where it runs too), at least one, and at least as many
    as it takes to hold `max_connections` when each worker holds `per_worker`."""
    cores = (os.cpu_count() or 2) - (role == "all")
    return max(cores, 1, -(-max_connections // per_worker))  # -(-a // b): a / b rounded up


def claim_data_dir(data_dir: str) -> int:
    """Lock the data dir for this broker's life (`LOCK_FILE`, acceptor/pidlock.py): a second broker on
    it would take the store from under the first, whose router would fail on "database is locked"
    until that broker gave up. The lock's descriptor; StoreError (one line naming the data dir, and
    the holder's pid) when it cannot be claimed."""
    try:
        before = private_dir(data_dir)
        if before & 0o077:
            log.warning("data dir %s was open to other users (mode %o): now %o", data_dir, before, before & 0o700)
        return pidlock.take(os.path.join(data_dir, LOCK_FILE))
    except pidlock.Held as held:
        raise StoreError(f"{data_dir}: in use by another broker (pid {held.holder}, which holds "
                         f"{os.path.join(data_dir, LOCK_FILE)})") from None
    except OSError as exc:
        raise StoreError(f"{data_dir}: {exc.strerror}") from None


def check_store(config: dict) -> None:
    """Open and check the store before anything starts: a damaged one stops startup (StoreError)."""
    store = open_store(config)
    assert store is not None, "persistence is on"
    try:
        store.verify()
    finally:
        store.close()


def check_port(host: str, port: int) -> None:
    """Bind `host`:`port` once and let it go, for a port that another process (the router) binds later:
    a port in use or a name that does not resolve stops startup with one line, not a router that
    fails in a loop or runs on without its endpoint (OSError)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))


def router_ports(config: dict) -> list[tuple[str, str, int]]:
    """(option, host, port) of what the router will bind: its endpoint for the workers and nodes, and
    on this host (not a node's) the metrics endpoint and the console, each unless off (-1) or on any
    free port (0)."""
    ports = [] if config["role"] == "node" else [
        (f"{option}_port", config[f"{option}_host"], config[f"{option}_port"]) for option in ("metrics", "console")]
    if config["router_bind"]:
        host, _, port = config["router_bind"][len("tcp://"):].rpartition(":")
        ports.insert(0, ("router_bind", host.strip("[]"), int(port)))
    return [(option, host, port) for option, host, port in ports if port > 0]


def serve(config: dict, load: Callable[[], dict]) -> int:
    """Run this host's part of the broker (its `role`) until SIGTERM/SIGINT; the exit status. `load`
    reads the config again (SIGHUP)."""
    role = config["role"]
    if config["store"]:  # a PostgreSQL URL: its password leaves the command line before any worker is forked
        from plexmq.router.store.postgres import masked  # psycopg only with such a store

        hide_in_command_line(config["store"], masked(config["store"]))  # the children read it from config.json (0600)
    per_worker = connections_per_worker(raise_fd_limit())
    if role == "router":
        config["workers"] = 0
    elif not config["workers"]:
        config["workers"] = default_workers(config["max_connections"], per_worker, role)
    if role == "node" and not config["node_name"]:
        config["node_name"] = socket.gethostname().split(".")[0]  # a DNS label: letters, digits, '-'
    if role != "node" and not config["router_name"]:  # names the router in the lease (a PostgreSQL store)
        config["router_name"] = default_router_name(config["router_bind"])
    socks: list[tuple[tuple[str, str, int, str], socket.socket]] = []
    for scheme, host, port, tenant in listeners(config) if role != "router" else []:
        try:
            socks.append(((scheme, host, port, tenant), bind(host, port)))
        except OSError as exc:
            print(f"plexmq: cannot listen on {host}:{port} ({scheme}): {exc.strerror}", file=sys.stderr)
            return 1
    for option, host, port in router_ports(config):
        try:
            check_port(host, port)
        except OSError as exc:
            print(f"plexmq: cannot listen on {host}:{port} ({option}): {exc.strerror or exc}", file=sys.stderr)
            return 1
    claim = -1  # the data dir's lock, held while the router may use the store
    if config["persistence"] and role != "node":
        try:
            if not config["store"]:  # SQLite in the data dir, which is this broker's alone (PostgreSQL: shared)
                config["data_dir"] = os.path.abspath(config["data_dir"])
                claim = claim_data_dir(config["data_dir"])
            check_store(config)
        except StoreError as exc:
            if not exc.unreachable:
                print(f"plexmq: cannot use the {'data dir' if not config['store'] else 'store'}: {exc}",
                      file=sys.stderr)
                return 1
            log.warning("the store does not answer yet: %s (the router waits for it as a standby)", exc)
    archive = config["archive"]
    if archive["enabled"] and role != "router":
        archive["dir"] = os.path.abspath(archive["dir"])
        try:
            Access(archive["group"]).make_dir(archive["dir"])
            if not os.access(archive["dir"], os.W_OK | os.X_OK):
                raise PermissionError(13, "not writable")
        except OSError as exc:
            print(f"plexmq: archive dir {archive['dir']}: {exc.strerror}", file=sys.stderr)
            return 1
    own_run_dir = not config["run_dir"]
    try:
        run_dir, run_lock = rundir.make_temporary() if own_run_dir else (config["run_dir"], rundir.claim(config["run_dir"]))
    except rundir.RunDirError as exc:
        print(f"plexmq: {exc}", file=sys.stderr)
        return 1
    if config["router_bind"] or config["router"]:  # the children learn the keys from their config, never from a log
        config["router_endpoints"] = router_endpoints(config["router"]) or [config["router_bind"]]
        config["router_curve"] = curve_keys(config["router_curve_dir"])
    else:
        config["router_endpoints"] = [f"ipc://{os.path.join(run_dir, 'router.ipc')}"]
    config["router_endpoint"] = config["router_endpoints"][0]  # the router binds it; a node's workers follow the list
    # handoff.py: a socket's listener byte (acceptor/listening.py keeps it as reloads change the tenants)
    config["listening"] = [[scheme, tenant] for (scheme, _host, _port, tenant), _sock in socks]
    if role == "all":  # the plain listener is bound; a reload may add bridges
        bridges.prepare(config, socks[0][1])
    config["config_path"] = os.path.join(run_dir, "config.json")
    reload.write(config["config_path"], config)
    # the plain listener first, in the line tests and scripts read
    for index, ((scheme, _host, _port, tenant), sock) in enumerate(socks):
        host, port = sock.getsockname()[:2]
        if not index:
            log.info("plexmq listening on %s:%d with %s", host, port, counted(config["workers"], "worker"))
        else:
            log.info("plexmq listening on %s:%d (%s%s)", host, port, scheme, f", tenant {tenant}" if tenant else "")
    if role == "router":
        log.info("plexmq router on %s: nodes join it there", config["router_bind"])
    else:
        log.info("%s", security_line(config))
    if role == "node":
        log.info("node %s joins the router at %s", config["node_name"], config["router"])
    if config["tenants"]:
        log.info("%s declared: %s", counted(len(config["tenants"]), "tenant"), ", ".join(sorted(config["tenants"])))
    if archive["enabled"] and role != "router":
        log.info("archive on: topics %s to %s", ", ".join(archive["topics"]), archive["dir"])
    needed = -(-config["max_connections"] // per_worker)
    if needed > config["workers"]:
        log.warning("%s: at most %d connections (%d each under the open-file limit): max_connections "
                    "%d needs --workers %d", counted(config["workers"], "worker"), config["workers"] * per_worker, per_worker,
                    config["max_connections"], needed)

    loop = asyncio.new_event_loop()  # the stdlib loop: uvloop keeps SIGCHLD for itself
    asyncio.set_event_loop(loop)
    status = 0

    def give_up(reason: str) -> None:
        nonlocal status
        log.critical("stopping the broker: %s", reason)
        status = 1
        loop.stop()

    supervisor = Supervisor(config, loop, give_up)
    supervisor.start()
    admission = Admission(config)
    listening = Listening(loop, supervisor.workers, admission, socks)
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, loop.stop)
    loop.add_signal_handler(signal.SIGCHLD, supervisor.reap)
    files = reload.Files(config)

    def on_sighup() -> None:
        nonlocal config
        fresh = reload.reread(config, load, files)
        if fresh is not None:
            config = fresh
            if role != "router":
                listening.update(config)
            reload.write(config["config_path"], config)
            logging.getLogger().setLevel(config["log_level"].upper())
            admission.configure(config)
            supervisor.reload(config)

    loop.add_signal_handler(signal.SIGHUP, on_sighup)
    try:
        loop.run_forever()
    finally:
        log.info("stopping")
        listening.close()
        supervisor.stop(config["stop_timeout"])
        if own_run_dir:
            shutil.rmtree(run_dir, ignore_errors=True)
        else:
            rundir.release(run_dir)
        os.close(run_lock)
        if claim >= 0:
            os.close(claim)  # the router has stopped: the data dir is free
        loop.close()
    log.info("stopped")
    return status
