"""`plexmq clients`: requests from the metrics thread about the connected clients, answered through
the router: a listing (every worker answers) and a disconnect (the router knows where the client is).

The metrics thread hands a request to the router's loop (a thread-safe queue), the loop asks the
workers in their batches, and the thread waits for the answers (bounded) on an event.
"""

from __future__ import annotations

import itertools
import queue
import threading
from urllib.parse import parse_qs

import orjson

LISTING_WAIT = 5.0  # seconds an HTTP request waits for the router's (and the workers') answer

_ids = itertools.count(1)

Answer = tuple[str, str, bytes, str]  # HTTP status, content type, body, and what was done (for the admin log)


class ClientListing:
    def __init__(self, text: str, tenant: str | None = None) -> None:
        self.id = next(_ids)
        self.filter = text
        self.tenant = tenant  # only this tenant's clients (None: every tenant's)
        self.clients: list[list] = []
        self.done = threading.Event()
        self.answered: set[str] = set()  # worker labels
        self._waiting = 0

    def expect(self, workers: int) -> None:
        self._waiting = workers
        if not workers:
            self.done.set()

    def answer(self, worker: str, clients: list[list]) -> None:
        if worker in self.answered:
            return
        self.answered.add(worker)
        self.clients.extend([c[0], worker, *c[1:]] for c in clients)
        self._waiting -= 1
        if self._waiting <= 0:
            self.done.set()


class ClientDisconnect:
    """`plexmq clients --disconnect ID [--tenant NAME]`: close that client's connection (its session
    stays, its will is published, a 5.0 client hears DISCONNECT 0x98); `found`: whether it was connected.
    A client id names a client only within its tenant ("": the default tenant)."""

    def __init__(self, client_id: str, tenant: str = "") -> None:
        self.client_id = client_id
        self.tenant = tenant
        self.found = False
        self.done = threading.Event()


Request = ClientListing | ClientDisconnect


def answer_listing(requests: queue.Queue[Request], environ: dict) -> Answer:
    """GET /clients?filter=TEXT&offset=N&limit=N[&tenant=NAME]: one page of the connected clients (of that
    tenant only, "" the default tenant), sorted by client id."""
    query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)  # tenant= names the default tenant
    try:
        offset, limit = int(query.get("offset", ["0"])[0]), int(query.get("limit", ["100"])[0])
    except ValueError:
        return "400 Bad Request", "text/plain", b"offset and limit are numbers\n", "bad offset or limit"
    listing = ClientListing(query.get("filter", [""])[0], query["tenant"][0] if "tenant" in query else None)
    requests.put(listing)
    complete = listing.done.wait(LISTING_WAIT)
    listing.done.set()  # a worker that did not answer in time: the router forgets the request
    clients = sorted(listing.clients)
    body = {"total": len(clients), "complete": complete, "offset": offset,
            "fields": ["client_id", "worker", "address", "keepalive", "queued", "inflight", "persistent", "protocol",
                       "tenant"],
            "clients": clients[offset:offset + limit]}
    return "200 OK", "application/json", orjson.dumps(body), f"listed {len(clients)} clients"


def answer_disconnect(requests: queue.Queue[Request], environ: dict) -> Answer:
    """POST /clients/disconnect, body {"client_id": ID, "tenant": NAME} (tenant optional, default ""): 200
    when it was connected (now closed), 404 when not."""
    try:
        body = orjson.loads(environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)))
        client_id, tenant = body["client_id"], body.get("tenant", "")
    except (ValueError, TypeError, KeyError, AttributeError):
        client_id = tenant = None
    if not isinstance(client_id, str) or not isinstance(tenant, str):
        return "400 Bad Request", "text/plain", b'the body is {"client_id": "ID", "tenant": "NAME"}\n', "no client id"
    request = ClientDisconnect(client_id, tenant)
    requests.put(request)
    request.done.wait(LISTING_WAIT)
    who = f"{client_id} of tenant {tenant}" if tenant else client_id
    if request.found:
        return "200 OK", "text/plain", f"disconnected {who}\n".encode(), f"disconnected {who!r}"
    return "404 Not Found", "text/plain", f"{who} is not connected\n".encode(), f"{who!r} is not connected"
