"""The Prometheus endpoint (`/metrics`) and a health check (`/health`), served by the router.

A daemon thread with prometheus-client's WSGI app: scrapes read `Stats.snapshot`, which the
router's loop replaces once a second, so the thread never walks the router's live state.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from router.stats import Stats

log = logging.getLogger("plexmq.router")


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        """No line per scrape."""


def serve_metrics(stats: Stats, host: str, port: int) -> tuple[str, int] | None:
    """Start the endpoint; its (host, port), or None when the port cannot be had (logged)."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(stats)  # type: ignore[arg-type]
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
