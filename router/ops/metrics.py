"""The Prometheus endpoint (`/metrics`), a health check (`/health`), and the admin requests: the
connected clients (`GET /clients?filter=TEXT&offset=N&limit=N`, JSON) and closing one (`POST
/clients/disconnect`, body `{"client_id": ID, "tenant": NAME}`); the bans (`GET /bans`, `POST /bans/add`,
`POST /bans/remove`: router/bans.py), served by the router. The first two are open to
read; the admin ones pass `admin.Gate` (token, Host, Origin, JSON) and are logged.

prometheus-client's WSGI app served by `router/ops/httpd.py` (bounded threads, connections and time):
scrapes read `Stats.snapshot`, which the router's loop replaces once a second, so no HTTP thread walks
the router's live state, and the router's loop never waits on HTTP (it takes the admin requests
from a queue).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from functools import partial

from prometheus_client import CollectorRegistry, Histogram, make_wsgi_app

from plexmq.router import bans, listing
from plexmq.router.asks import Asks
from plexmq.router.ops import admin
from plexmq.router.ops.admin import Gate
from plexmq.router.ops.bridge_metrics import BridgeMetrics
from plexmq.router.ops.httpd import Endpoint
from plexmq.router.ops.stats import Stats

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


def serve_metrics(stats: Stats, turns: TurnMetrics, asks: Asks, host: str,
                  port: int, run_dir: str) -> tuple[str, int] | None:
    """Start the endpoint, its admin token in `run_dir`; its (host, port), or None when the port cannot be
    had (logged)."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(stats)
    registry.register(turns.frames)
    registry.register(turns.seconds)
    registry.register(BridgeMetrics(stats))  # plexmq_bridge_*, where bridges run (none: nothing)
    metrics = make_wsgi_app(registry)

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO")
        if path in ADMIN:
            return act(environ, start_response, *ADMIN[path])
        if path == "/health":
            ok = stats.healthy()
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"ok\n" if ok else b"a worker has not reported within link_timeout\n"]
        return metrics(environ, start_response)

    def act(environ: dict, start_response: Callable, method: str, action: Callable[[dict], listing.Answer]) -> Iterable[bytes]:
        """An admin request: refused unless the gate admits it and its method fits; logged either way."""
        refused = gate.refusal(environ)
        if refused is None and environ.get("REQUEST_METHOD") != method:
            refused = "405 Method Not Allowed", f"{method} only"
        if refused is None:
            status, kind, body, outcome = action(environ)
            Gate.record(environ, f"allowed: {outcome}")
        else:
            status, kind, body = refused[0], "text/plain", f"{refused[1]}\n".encode()
            Gate.record(environ, f"refused ({status}): {refused[1]}")
        headers = [("Content-Type", kind)]
        if status.startswith("401"):
            headers.append(("WWW-Authenticate", "Bearer"))
        start_response(status, headers)
        return [body]

    def ban(environ: dict) -> listing.Answer:
        return bans.answer_ban(asks, environ, f"admin API from {environ.get('REMOTE_ADDR')}")

    ADMIN: dict[str, tuple[str, Callable[[dict], listing.Answer]]] = {
        "/clients": ("GET", partial(listing.answer_listing, asks)),
        "/clients/disconnect": ("POST", partial(listing.answer_disconnect, asks)),
        "/bans": ("GET", partial(bans.answer_bans, asks)), "/bans/add": ("POST", ban),
        "/bans/remove": ("POST", partial(bans.answer_unban, asks))}

    try:
        server = Endpoint((host, port), app)
    except OSError as exc:
        log.error("no metrics endpoint: cannot listen on %s:%d: %s", host, port, exc.strerror)
        return None
    bound = server.socket.getsockname()[:2]  # (host, port): what server_address holds, typed
    gate = Gate(admin.issue(run_dir, bound[1]), host, bound[1])
    threading.Thread(target=server.run, name="plexmq-metrics", daemon=True).start()
    log.info("metrics on http://%s:%d/metrics", bound[0], bound[1])
    log.info("admin token (for /clients) in %s", admin.token_path(run_dir, bound[1]))
    return bound[0], bound[1]
