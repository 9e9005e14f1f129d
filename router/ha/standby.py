"""A standby router: bound and answering, but not routing, until it holds the lease (issue 24).

Why it binds at once: a node tries its routers in turn, and a standby that answers every frame with
STANDBY (naming the active's endpoint when the lease names one) sends it on at once, where a socket
that is not there would cost it a silence timeout (docs/architecture.md §12). It tries to acquire the
lease every lease/8 and says in router_members that it is a standby; database errors are logged once
per outage and it keeps trying: a standby never exits for them. A router that finds its own previous
run holding the lease (killed, or stepped down) waits a lease before trying: the other standbys first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import psycopg
import zmq

from plexmq import wire
from plexmq.router.ha.lease import Holder, Lease, Taken, one_line

log = logging.getLogger("plexmq.router")

TRY_EVERY = 1 / 8  # of the lease


def wait_for_lease(sock: zmq.Socket, lease: Lease, stopping: Callable[[], bool]) -> Taken | None:
    """Answer the workers with STANDBY until `lease` is acquired (the lease as taken) or `stopping()`
    says so (SIGTERM: None)."""
    holder = Holder("", "", 0)
    said: Holder | None = None  # the active the last "is a standby" line named: one line per change
    failing = False  # a database outage is logged once
    next_try = time.monotonic()
    while not stopping():
        now = time.monotonic()
        if now >= next_try:
            next_try = now + TRY_EVERY * lease.seconds
            try:
                taken = lease.try_acquire()
                if taken is not None:
                    return taken
                holder = lease.holder()
                lease.say("standby")
            except psycopg.Error as exc:
                if not failing:
                    log.warning("router %s: cannot reach the database: %s (trying again every %.2f s)",
                                lease.name, one_line(exc), TRY_EVERY * lease.seconds)
                failing = True
                continue
            if failing:
                log.info("router %s: the database answers again", lease.name)
                failing = False
            mine = holder.name == lease.name and holder.endpoint == lease.endpoint
            if holder.name == lease.name and holder.endpoint and not mine and (said is None or said != holder):
                log.error("router %s: another router (at %s) holds the lease under this router's name: give each "
                          "router its own router_name, or status, $SYS and metrics mix the two up", lease.name,
                          holder.endpoint)
            if said is None and mine:
                # this router's previous run died (or stepped down) holding the lease: another standby,
                # which has not just failed, gets the first chance at it; alone, this one takes it a
                # lease later
                next_try = now + lease.seconds
            if said is None or holder[:2] != said[:2]:
                said = holder
                log.info("router %s is a standby (active: %s)", lease.name,
                         "its own previous run, until its lease lapses: other standbys try first" if mine else
                         f"{holder.name} at {holder.endpoint}" if holder.endpoint else "none yet")
        answer(sock, lease.name, holder.endpoint, max(0, int((next_try - time.monotonic()) * 1000)))
    return None


def answer(sock: zmq.Socket, name: str, active: str, wait_ms: int) -> None:
    """Answer every frame that comes within `wait_ms` with one STANDBY record, tagged with the
    worker's join and seq 0 (router/links.py) so that the worker takes it as the answer to that join."""
    try:
        if not sock.poll(wait_ms):
            return
    except zmq.ZMQError:
        return  # interrupted by a signal: the caller looks at `stopping`
    record = wire.record(wire.STANDBY, wire.Standby(name, active).encode())
    while True:
        try:
            worker, tag, _frame = sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        except ValueError:  # not [identity, tag, records]: not one of our workers
            continue
        if len(tag) != wire.LINK.size:
            continue
        join, _seq = wire.LINK.unpack(tag)
        try:
            sock.send_multipart((worker, wire.LINK.pack(join, 0), record), zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # the worker left: it asks again when it comes back
