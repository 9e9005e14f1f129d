"""The Prometheus endpoint (`/metrics`) and a health check (`/health`), served by the router.

A daemon thread with prometheus-client's WSGI app: scrapes read `Stats.snapshot`, which the
router's loop replaces once a second, so the thread never walks the router's live state.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Histogram, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from router.stats import Stats

log = logging.getLogger("plexmq.router")


class TurnMetrics:
    """How much one router turn drains and how long it takes from the first frame read to the last
    reply sent (routing latency, store commit included)."""

    def __init__(self) -> None:
        self.frames = Histogram("plexmq_router_batch_frames", "Worker frames drained per router turn",
                                buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500), registry=None)
        self.seconds = Histogram("plexmq_router_turn_seconds", "Router turn: frames in to replies out",
                                 buckets=(1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 1.0),
                                 registry=None)

    def observe(self, frames: int, seconds: float) -> None:
        self.frames.observe(frames)
        self.seconds.observe(seconds)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        """No line per scrape."""


def serve_metrics(stats: Stats, turns: TurnMetrics, host: str, port: int) -> tuple[str, int] | None:
    """Start the endpoint; its (host, port), or None when the port cannot be had (logged)."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(stats)  # type: ignore[arg-type]
    registry.register(turns.frames)
    registry.register(turns.seconds)
    metrics = make_wsgi_app(registry)

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/health":
            ok = stats.healthy()
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"ok\n" if ok else b"a worker has not reported for 5 s\n"]
        return metrics(environ, start_response)

    try:
        server = make_server(host, port, app, ThreadingWSGIServer, handler_class=_QuietHandler)
    except OSError as exc:
        log.error("no metrics endpoint: cannot listen on %s:%d: %s", host, port, exc.strerror)
        return None
    threading.Thread(target=server.serve_forever, name="plexmq-metrics", daemon=True).start()
    bound = server.server_address[:2]
    log.info("metrics on http://%s:%d/metrics", bound[0], bound[1])
    return bound[0], bound[1]
