"""The Prometheus endpoint (`/metrics`), a health check (`/health`), the connected clients
(`/clients?filter=TEXT&offset=N&limit=N`, JSON) and closing one (`POST /clients/disconnect?client_id=ID`),
served by the router.

A daemon thread with prometheus-client's WSGI app: scrapes read `Stats.snapshot`, which the
router's loop replaces once a second, so the thread never walks the router's live state.
"""

from __future__ import annotations

import logging
import queue
import threading
from urllib.parse import parse_qs

import orjson
from typing import Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Histogram, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from router.listing import ClientDisconnect, ClientListing, Request
from router.stats import Stats

LISTING_WAIT = 5.0  # seconds /clients waits for every worker's answer

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


def serve_metrics(stats: Stats, turns: TurnMetrics, listings: queue.Queue[Request], host: str,
                  port: int) -> tuple[str, int] | None:
    """Start the endpoint; its (host, port), or None when the port cannot be had (logged)."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(stats)  # type: ignore[arg-type]
    registry.register(turns.frames)
    registry.register(turns.seconds)
    metrics = make_wsgi_app(registry)

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/clients/disconnect":
            return disconnect(environ, start_response)
        if environ.get("PATH_INFO") == "/clients":
            query = parse_qs(environ.get("QUERY_STRING", ""))
            try:
                offset, limit = int(query.get("offset", ["0"])[0]), int(query.get("limit", ["100"])[0])
            except ValueError:
                start_response("400 Bad Request", [("Content-Type", "text/plain")])
                return [b"offset and limit are numbers\n"]
            listing = ClientListing(query.get("filter", [""])[0])
            listings.put(listing)
            complete = listing.done.wait(LISTING_WAIT)
            listing.done.set()  # a worker that did not answer in time: the router forgets the request
            clients = sorted(listing.clients)
            body = {"total": len(clients), "complete": complete, "offset": offset,
                    "fields": ["client_id", "worker", "address", "keepalive", "queued", "inflight", "persistent",
                               "protocol"],
                    "clients": clients[offset:offset + limit]}
            start_response("200 OK", [("Content-Type", "application/json")])
            return [orjson.dumps(body)]
        if environ.get("PATH_INFO") == "/health":
            ok = stats.healthy()
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"ok\n" if ok else b"a worker has not reported within link_timeout\n"]
        return metrics(environ, start_response)

    def disconnect(environ: dict, start_response: Callable) -> Iterable[bytes]:
        """POST /clients/disconnect?client_id=ID: 200 when it was connected (now closed), 404 when not."""
        if environ.get("REQUEST_METHOD") != "POST":
            start_response("405 Method Not Allowed", [("Content-Type", "text/plain"), ("Allow", "POST")])
            return [b"POST only\n"]
        client_id = parse_qs(environ.get("QUERY_STRING", "")).get("client_id", [""])[0]
        request = ClientDisconnect(client_id)
        listings.put(request)
        request.done.wait(LISTING_WAIT)
        if request.found:
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [f"disconnected {client_id}\n".encode()]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [f"{client_id} is not connected\n".encode()]

    try:
        server = make_server(host, port, app, ThreadingWSGIServer, handler_class=_QuietHandler)
    except OSError as exc:
        log.error("no metrics endpoint: cannot listen on %s:%d: %s", host, port, exc.strerror)
        return None
    threading.Thread(target=server.serve_forever, name="plexmq-metrics", daemon=True).start()
    bound = server.server_address[:2]
    log.info("metrics on http://%s:%d/metrics", bound[0], bound[1])
    return bound[0], bound[1]
