"""The console's live figures: a server-sent-event stream per open overview, one JSON event each time
the router's loop refreshes `Stats` (once a second): the broker's figures, store, lease and alarms
(router/ops/alarms.py) for a broker admin, a tenant's own figures and alarms for that tenant's admin.

A stream holds its connection and a thread for minutes, so streams never take the endpoint's few
answering threads (router/ops/httpd.py): `StreamingEndpoint` answers them on STREAMS threads of their own,
at most STREAMS at once (one more is answered 503 by an ordinary thread), each ending when its client
goes (the next write fails) or after LIFETIME (the browser's EventSource reconnects by itself).
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import orjson

from plexmq import version
from plexmq.router.ops.history import rate
from plexmq.router.ops.httpd import Endpoint
from plexmq.router.ops.stats import COUNTED, Stats
from plexmq.router.store import Store

STREAMS = 8  # open at once
LIFETIME = 600.0  # seconds a stream lasts
STREAM = "plexmq.stream"  # environ key: this request is answered on a stream thread
WAIT = 2.0  # seconds a stream waits for a refresh before it looks again (the router may be busy)


class StreamingEndpoint(Endpoint):
    """An `Endpoint` that answers the requests `is_stream` picks (from their bytes) on threads of their own."""

    def __init__(self, address: tuple[str, int], app: Callable, is_stream: Callable[[bytes], bool],
                 context: ssl.SSLContext | None = None) -> None:
        super().__init__(address, app, context)
        self._is_stream = is_stream
        self._streams = ThreadPoolExecutor(STREAMS, thread_name_prefix="plexmq-console-stream")
        self._free = threading.BoundedSemaphore(STREAMS)

    def _hand(self, sock: socket.socket, address: tuple, data: bytes) -> None:
        if self._is_stream(data) and self._free.acquire(blocking=False):
            self._streams.submit(self._stream, sock, address, data)
        else:
            super()._hand(sock, address, data)

    def _stream(self, sock: socket.socket, address: tuple, data: bytes) -> None:
        try:
            self._answer(sock, address, data, {STREAM: True})
        finally:
            self._free.release()


def events(stats: Stats, tenant: str | None, store: dict[str, str], alive: Callable[[], bool]) -> Iterator[bytes]:
    """Server-sent events, each `data: JSON` with the overview's figures (of `tenant` only for a tenant
    admin; `store`: `describe_store`'s), until LIFETIME is over or the session that opened the stream is
    not `alive` (logged out, ended: its figures are no longer for whoever holds the connection)."""
    ends = time.monotonic() + LIFETIME
    last: dict | None = None
    yield b"retry: 2000\n\n"
    while time.monotonic() < ends and alive():
        with stats.refreshed:
            stats.refreshed.wait(WAIT)
        snapshot = stats.snapshot
        if not snapshot or snapshot is last:
            continue
        shown = figures(stats, snapshot, last, store) if tenant is None else tenant_figures(stats, snapshot, last, tenant)
        yield b"data: " + orjson.dumps(shown) + b"\n\n"
        last = snapshot


def figures(stats: Stats, now: dict, before: dict | None, store: dict[str, str]) -> dict:
    """What a broker admin's overview shows of one snapshot; the rates per second against the one before
    (None at first)."""
    reporting = stats.reporting()
    return {
        **_moving(now, before, now["clients"], stats.counted),
        "held": {name: now[name] for name in ("subscriptions", "topics", "retained")},
        "workers": {label: {"node": w.get("node") or "", "clients": w["clients"], "cpu": w["cpu"], "rss": w["rss"],
                            "state": "up" if reporting.get(label) else "late"} for label, w in now["workers"].items()},
        "nodes": now["nodes"],
        "store": store,
        "router": now["router"],  # the lease (epoch, members) of a shared store; {} without one
        "alarms": now["alarms"].get(None, []),
        "uptime": int(now["at"] - stats.started),
        "version": version(),
    }


def tenant_figures(stats: Stats, now: dict, before: dict | None, tenant: str) -> dict:
    """What a tenant admin's overview shows: the tenant's own figures (None each where the broker keeps
    none per tenant: metrics_tenants = false) and alarms, nothing of the broker's workers, nodes or store."""
    def numbers(snap: dict) -> dict[str, int | None]:
        mine = snap["tenants"].get(tenant, {})
        return {key: mine.get(key, 0) if stats.per_tenant else None for key in COUNTED}

    mine = now["tenants"].get(tenant, {})
    held = {name: mine.get(name, 0) if stats.per_tenant else None for name in ("subscriptions", "retained")}
    return {**_moving(now, before, mine.get("connections", 0) if stats.per_tenant else None, numbers),
            "tenant": tenant, "held": {**held, "topics": None}, "alarms": now["alarms"].get(tenant, []),
            "uptime": int(now["at"] - stats.started), "version": version()}


def _moving(now: dict, before: dict | None, connections: int | None,
            read: Callable[[dict], dict[str, int | None]]) -> dict:
    """The connections, the totals of COUNTED (`read` of a snapshot) and their rates per second against
    the snapshot before."""
    totals = read(now)
    rates: dict[str, float | None] = dict.fromkeys(totals)
    if before is not None:
        earlier = read(before)
        for name, count in totals.items():
            rates[name] = rate(count, earlier[name], now["at"] - before["at"])
    return {"at": now["at"], "connections": connections, "totals": totals, "rates": rates}


def describe_store(store: Store | None) -> dict[str, str]:
    """The store as the overview names it: its kind and where it is (a PostgreSQL one without its user and
    password: `Store.name`)."""
    if store is None:
        return {"kind": "none", "where": "persistence = false: sessions and retained messages in memory only"}
    return {"kind": "PostgreSQL" if store.shared else "SQLite", "where": store.name}
