"""The router process: one ROUTER socket, drained in bounded batches, one reply frame per worker."""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import sys
import time
from contextlib import nullcontext

import orjson
import zmq
from zmq.auth.thread import ThreadAuthenticator

from plexmq import curve
from plexmq.process import STEPPED_DOWN, STORE_FAILED, become_child, child_config, missed_reload, settle_heap
from plexmq.router.asks import Asks, start_asked
from plexmq.router.console.app import serve_console
from plexmq.router.console.auth import files as console_admins
from plexmq.router.core import Router
from plexmq.router.ha.lease import Lease, Members, SteppedDown, is_postgres
from plexmq.router.ha.standby import wait_for_lease
from plexmq.router.ops.metrics import TurnMetrics, serve_metrics
from plexmq.router.ops.stats import Stats
from plexmq.router.store import Store, StoreError, open_store
from plexmq.router.tenants import UNLIMITED
from plexmq.tenants import Tenants
from plexmq.units import parse_duration

log = logging.getLogger("plexmq.router")

DRAIN_LIMIT = 500  # frames taken per turn before replies are flushed (rumqttd drains up to 500 too)
EXPIRY_INTERVAL = 60.0  # seconds between sweeps for expired persistent sessions (at most)


def serve(config: dict) -> None:
    """Run until SIGTERM."""
    stopping = False
    router: Router | None = None

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        if router is not None:  # a BYE read in this very turn is already one of the stop's
            router.stopping = True

    signal.signal(signal.SIGTERM, stop)
    reload_wanted = False

    def want_reload(_signum: int, _frame: object) -> None:
        nonlocal reload_wanted
        reload_wanted = True

    signal.signal(signal.SIGHUP, want_reload)
    reload_wanted = reload_wanted or missed_reload(config)
    ctx = zmq.Context(io_threads=1)
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # an unroutable send raises instead of vanishing
    sock.setsockopt(zmq.SNDHWM, 0)  # flow control is ours (the windows, queues and Outbox limits): never let ZeroMQ drop
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.LINGER, 0)
    auth = curve.server(ctx, sock, config["router_curve"]) if "router_curve" in config else None
    sock.bind(config["router_endpoint"])
    # a PostgreSQL store is shared by several routers: this one is a standby until it holds the lease
    lease = Lease(config["store"], config["router_name"], config["router_endpoint"], config["router_lease"]) \
        if is_postgres(config["store"]) else None
    taken = wait_for_lease(sock, lease, lambda: stopping) if lease is not None else None
    if lease is not None and taken is None:  # SIGTERM while a standby
        lease.close()
        _close(ctx, sock, auth)
        log.info("router stopped")
        return
    expiration = parse_duration(config["persistent_client_expiration"] or "0")
    if lease is not None:
        lease.watch()  # steps down when renewals stop, even while the loop waits in a commit
    with lease.held() if lease is not None else nullcontext():  # the load may take longer than the lease
        store = open_store(config, lease.fence() if lease is not None else None)
        router = Router(config["max_inflight"], config["max_queued_messages"], config["max_queued_bytes"], store,
                        expiration, config["shared_subscription_strategy"], config["link_timeout"])
    apply_tenants(router, config)
    links = router.links
    log.info("router listening on %s", config["router_endpoint"])
    members = None
    if lease is not None and taken is not None:
        log.info("router %s is active, epoch %d, %s", lease.name, taken.epoch,
                 f"took over from {taken.previous} after {taken.gap:.1f} s" if taken.previous else "the first holder")
        members = Members(lease)
        members.start()
    expiry_interval = _expiry_interval(expiration)
    next_expiry = time.monotonic() + expiry_interval
    stats = Stats(router, config["parent_pid"], config["metrics_tenants"], config["tenants"], members,
                  os.path.dirname(config["config_path"]))
    turns = TurnMetrics()
    asks: Asks = Asks()
    if config["metrics_port"] >= 0:
        serve_metrics(stats, turns, asks, config["metrics_host"], config["metrics_port"],
                      os.path.dirname(config["config_path"]))
    admins = serve_console(stats, asks, router.traces, config, store) if config["console_port"] >= 0 else None
    sys_interval = config["sys_interval"]
    if sys_interval:
        router.sys_figures = stats.figures
    next_refresh = next_sys = time.monotonic() + 1.0

    unreachable: set[bytes] = set()  # workers a send failed to: said once, until one succeeds

    def send(worker: bytes, frame: bytes) -> None:
        if frame:
            try:
                sock.send_multipart((worker, links.tag(worker), frame), zmq.NOBLOCK)
            except zmq.ZMQError as exc:
                # a stop: the acceptor signals the router first, then the workers, which may leave
                # before this turn's last send; nothing is amiss then
                if worker not in unreachable and not stopping:
                    unreachable.add(worker)
                    log.warning("cannot reach worker %s: %s (its frames are lost until it joins again)",
                                worker.decode(errors="replace"), exc)
                return
            if unreachable:
                unreachable.discard(worker)

    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    woken, wake = socket.socketpair()  # a signal's byte (SIGTERM, SIGHUP) ends the wait: pyzmq resumes an interrupted poll
    woken.setblocking(False)
    wake.setblocking(False)
    signal.set_wakeup_fd(wake.fileno(), warn_on_full_buffer=False)
    poller.register(woken, zmq.POLLIN)
    deadlines = router.deadlines
    settle_heap()
    while not stopping:
        try:  # wait no longer than the once-a-second work, the first deadline or the lease's renewal
            now = time.monotonic()
            ready = poller.poll(_wait_ms(next_refresh - now, deadlines.first - time.time(),
                                         lease.renew_due(now) if lease is not None else math.inf))
        except zmq.ZMQError:
            continue  # interrupted by a signal
        drained = 0
        if ready:
            if len(ready) > 1 or ready[0][0] is woken:
                woken.recv(64)
            started = time.perf_counter()
            drained = read_frames(sock, router, DRAIN_LIMIT)
        for worker, join in links.rejoins:
            router.out(worker).rejoin(join)
        links.rejoins.clear()
        for worker in links.gaps:
            router.link_broken(worker)
        links.gaps.clear()
        start_asked(asks, router)
        if router.listings:
            for done in [i for i, listing in router.listings.items() if listing.done.is_set()]:
                del router.listings[done]
        if reload_wanted:
            reload_wanted = False
            fresh = apply_reload(router, config)
            expiration = expiration if fresh is None else fresh
            if admins is not None and fresh is not None:  # the tenants as reloaded: a removed one's admins go
                admins.reload(*console_admins(config))
            expiry_interval = _expiry_interval(expiration)
        now = time.monotonic()
        if now >= next_expiry:
            next_expiry = now + expiry_interval
            router.expire(time.time())
        if now >= next_refresh:
            next_refresh = now + 1.0
            if drained < DRAIN_LIMIT:  # all that came is taken: silence is the workers', not ours
                for worker in links.silent(now):
                    router.worker_lost(worker)
            for worker in links.joined():
                router.out(worker).beat()
            stats.refresh(time.time())
            router.traces.sweep(router, now)
            router.bans.sweep(router, time.time())
            if sys_interval and now >= next_sys:
                next_sys = now + sys_interval
                for tenant, topic, payload in stats.sys_messages(time.time()):
                    router.route(tenant, topic.encode(), payload, 0, True)  # retained as published, never kept
        wall = time.time()
        if wall >= deadlines.first:
            router.due(wall)
        durable = store is not None and bool(store.ops)
        frames = router.take_frames(split=durable)
        if lease is not None and lease.must_step_down(time.monotonic()):  # paused past the lease (SIGSTOP, swap):
            raise SteppedDown(lease.late(time.monotonic()))  # send nothing
        for worker, at_once, _ in frames:
            send(worker, at_once)
        if store is not None and (durable or lease is not None and lease.renew_due(now) <= 0):
            # before any acknowledgement: what a PUBACK or SUBACK acknowledges is on disk; with a lease
            # the commit carries its fence and renews it (an empty one while idle)
            commit(store, lease)
        for worker, _, later in frames:
            send(worker, later)
        if drained:
            turns.observe(drained, time.perf_counter() - started)
    take_last_frames(sock, router, config["stop_timeout"] / 2)
    if store is not None:
        if store.ops:
            commit(store, lease)
        store.close()
    if members is not None:
        members.stopping.set()
        members.join(2 * lease.seconds if lease is not None else 1.0)  # the lease's connection is ours again
    if lease is not None and taken is not None:
        lease.release()
        lease.close()
    _close(ctx, sock, auth)
    log.info("router stopped")


def take_last_frames(sock: zmq.Socket, router: Router, wait: float) -> None:
    """The broker stops: handle what this host's workers sent before they stopped, up to the BYE each
    says when it stops, before it closes its clients (at most `wait` seconds). A new clean session's CONNACK leaves
    the worker before its CONNECT reaches the router: an unread one would leave the session it
    discards in the store. What the records ask to send is dropped: nobody is left to read it."""
    links = router.links.links
    deadline = time.monotonic() + wait
    while any(link.alive and not link.node for link in links.values()):
        left = deadline - time.monotonic()
        if left <= 0 or not sock.poll(int(left * 1000) + 1):
            break
        read_frames(sock, router, DRAIN_LIMIT)
    router.take_frames(split=False)


def read_frames(sock: zmq.Socket, router: Router, limit: int) -> int:
    """Handle up to `limit` of the frames waiting on `sock`; how many were taken."""
    recv = sock.recv_multipart
    accept = router.links.accept
    handle = router.handle_frame
    for taken in range(limit):
        try:
            worker, tag, frame = recv(zmq.NOBLOCK, copy=True)
        except zmq.Again:
            return taken
        except ValueError:  # not [identity, tag, records]: not one of our workers (its CURVE key let it in)
            continue
        if accept(worker, tag):
            handle(worker, frame)
    return limit


def _close(ctx: zmq.Context, sock: zmq.Socket, auth: ThreadAuthenticator | None) -> None:
    sock.close(0)
    if auth is not None:
        auth.stop()  # its sockets would keep ctx.term() waiting
    ctx.term()


def commit(store: Store, lease: Lease | None) -> None:
    """`Store.commit`; with a lease, a renewal of it (the commit carries its fence). When it fails:
    without a lease the router ends (status 1: the supervisor restarts it, and the new router starts from
    the last commit; not STORE_FAILED, which means "cannot open": a database that went away for a moment
    may be back); with one it steps down (the fence's division by zero: another router holds the lease;
    any other error: the database is unreachable, and a standby may take over meanwhile)."""
    try:
        with lease.renewal() if lease is not None else nullcontext():
            store.commit()
    except StoreError as exc:
        if lease is None:
            log.critical("router stops: the store failed: %s", exc)
            logging.shutdown()
            os._exit(1)
        if "division by zero" in str(exc) or "division by zero" in str(exc.__cause__):
            raise SteppedDown(f"another router took the lease (epoch {lease.epoch}): stepping down") from exc
        raise SteppedDown(f"router stops: the store failed: {exc}: stepping down") from exc


def _wait_ms(*seconds: float) -> int:
    """Milliseconds the poll may wait: until the soonest of these, rounded up so that it does not
    wake just before it and spin."""
    return max(0, math.ceil(min(seconds) * 1000))


def _expiry_interval(expiration: float) -> float:
    """Seconds between sweeps for expired sessions: often enough for a short expiration."""
    return min(EXPIRY_INTERVAL, expiration / 2) if expiration else EXPIRY_INTERVAL


def apply_reload(router: Router, running: dict) -> float | None:
    """SIGHUP: the limits, log level and tenants of the config the acceptor has just written (kept in
    `running`, whose tenants say what a removed one wanted: `on_remove`); the new session expiry in
    seconds, or None when the file cannot be read."""
    try:
        with open(running["config_path"], "rb") as f:
            config = orjson.loads(f.read())
    except (OSError, orjson.JSONDecodeError) as exc:
        log.error("router cannot reload its settings: %s", exc)
        return None
    logging.getLogger().setLevel(config["log_level"].upper())
    for name, table in running["tenants"].items():
        if name not in config["tenants"] and table["on_remove"] == "drop":
            router.drop_tenant(name)
    running["tenants"] = config["tenants"]
    router.outbox.max_queued = config["max_queued_messages"]
    router.outbox.max_bytes = config["max_queued_bytes"]
    router.expiration = parse_duration(config["persistent_client_expiration"] or "0")
    apply_tenants(router, config)
    log.info("router reloaded its settings")
    return router.expiration


def apply_tenants(router: Router, config: dict) -> None:
    """The declared tenants' limits (`Router.apply_limits`); a tenant no longer declared has none."""
    declared = Tenants.from_config(config).declared
    for name in (router.tenants.keys() | router.declared.keys()) - declared.keys():
        router.apply_limits(name, UNLIMITED)
    for name, limits in declared.items():
        router.apply_limits(name, limits)


def main() -> None:
    config = child_config()
    become_child(config["parent_pid"], config["log_level"], config["log_format"], "router")
    try:
        serve(config)
    except KeyboardInterrupt:
        pass
    except StoreError as exc:
        if exc.unreachable and is_postgres(config["store"]):  # it may be back soon: wait for it as a standby
            log.error("the store does not answer: %s: stepping down", exc)
            logging.shutdown()
            os._exit(STEPPED_DOWN)
        log.critical("cannot open the store: %s", exc)
        sys.exit(STORE_FAILED)
    except SteppedDown as exc:
        log.error("%s", exc)
        logging.shutdown()
        os._exit(STEPPED_DOWN)  # as a standby the supervisor's restart brings it back
    logging.shutdown()
    os._exit(0)  # the store is closed: freeing millions of queued messages one by one would only delay the exit

