"""The console's live figures: a server-sent-event stream per open overview, one JSON event each time
the router's loop refreshes `Stats` (once a second).

A stream holds its connection and a thread for minutes, so streams never take the endpoint's few
answering threads (router/httpd.py): `StreamingEndpoint` answers them on STREAMS threads of their own,
at most STREAMS at once (one more is answered 503 by an ordinary thread), each ending when its client
goes (the next write fails) or after LIFETIME (the browser's EventSource reconnects by itself).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import orjson

from plexmq import VERSION
from plexmq.router.httpd import Endpoint
from plexmq.router.stats import Stats

STREAMS = 8  # open at once
LIFETIME = 600.0  # seconds a stream lasts
STREAM = "plexmq.stream"  # environ key: this request is answered on a stream thread
WAIT = 2.0  # seconds a stream waits for a refresh before it looks again (the router may be busy)


class StreamingEndpoint(Endpoint):
    """An `Endpoint` that answers the requests `is_stream` picks (from their bytes) on threads of their own."""

    def __init__(self, address: tuple[str, int], app: Callable, is_stream: Callable[[bytes], bool]) -> None:
        super().__init__(address, app)
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


def events(stats: Stats) -> Iterator[bytes]:
    """Server-sent events, each `data: JSON` with the overview's figures, until LIFETIME is over."""
    ends = time.monotonic() + LIFETIME
    last: dict | None = None
    yield b"retry: 2000\n\n"
    while time.monotonic() < ends:
        with stats.refreshed:
            stats.refreshed.wait(WAIT)
        snapshot = stats.snapshot
        if not snapshot or snapshot is last:
            continue
        yield b"data: " + orjson.dumps(figures(stats, snapshot, last)) + b"\n\n"
        last = snapshot


def figures(stats: Stats, now: dict, before: dict | None) -> dict:
    """What the overview shows of one snapshot; the rates per second against the one before (None at first)."""
    totals = {"received": now["received"], "sent": now["sent"], "dropped": now["dropped"] + now["routed_dropped"]}
    rates: dict[str, float | None] = dict.fromkeys(totals)
    if before is not None and now["at"] > before["at"]:
        elapsed = now["at"] - before["at"]
        earlier = {"received": before["received"], "sent": before["sent"],
                   "dropped": before["dropped"] + before["routed_dropped"]}
        rates = {name: max(0.0, (totals[name] - earlier[name]) / elapsed) for name in totals}
    reporting = stats.reporting()
    return {
        "at": now["at"],
        "connections": now["clients"],
        "totals": totals,
        "rates": rates,
        "workers": {label: {"node": w.get("node") or "", "clients": w["clients"],
                            "state": "up" if reporting.get(label) else "late"} for label, w in now["workers"].items()},
        "nodes": now["nodes"],
        "uptime": int(now["at"] - stats.started),
        "version": VERSION,
    }
