"""`plexmq clients`: requests from the metrics thread about the connected clients, answered through
the router: a listing (every worker answers) and a disconnect (the router knows where the client is).

Both are asks (router/asks.py): the loop asks the workers in their batches for a listing, and the
thread waits for the answers (bounded).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

import orjson

from plexmq import wire
from plexmq.mqtt import PROTOCOLS
from plexmq.router.asks import Ask, Asks, ask
from plexmq.router.ops import audit

if TYPE_CHECKING:
    from plexmq.router.core import Router

_ids = itertools.count(1)
MAX_ROWS = 100_000  # offset + limit of a listing: what each worker sends at most

Answer = tuple[str, str, bytes, str]  # HTTP status, content type, body, and what was done (for the admin log)
# a row: connected_at is the time.time() of its CONNACK; messages and bytes are counted by its worker
# (workers/connection.py) since then
FIELDS = ["client_id", "worker", "address", "keepalive", "queued", "inflight", "persistent", "protocol", "tenant",
          "username", "connected_at", "messages_in", "messages_out", "bytes_in", "bytes_out"]
ORDERS = {"asc": False, "desc": True}  # order=: descending?


class ClientListing(Ask):
    """Which clients the workers hold (`wire.ListClients` says which); `clients` the rows they sent, at
    most `most` of each, `matched` how many matched in all."""

    def __init__(self, text: str, tenant: str | None = None, protocol: str = "", exact: bool = False,
                 most: int = 0, sort: str = "client_id", descending: bool = False) -> None:
        super().__init__()
        self.id = next(_ids)
        self.asked = wire.ListClients(self.id, text, tenant, protocol, exact, most, sort, descending)
        self.clients: list[list] = []
        self.matched = 0
        self.answered: set[str] = set()  # worker labels
        self._waiting = 0

    def start(self, router: Router) -> None:
        router.list_clients(self)

    def expect(self, workers: int) -> None:
        self._waiting = workers
        if not workers:
            self.done.set()

    def answer(self, worker: str, clients: list[list], matched: int) -> None:
        if worker in self.answered:
            return
        self.answered.add(worker)
        self.clients.extend([c[0], worker, *c[1:]] for c in clients)
        self.matched += matched
        self._waiting -= 1
        if self._waiting <= 0:
            self.done.set()


class ClientDisconnect(Ask):
    """`plexmq clients --disconnect ID [--tenant NAME]`: close that client's connection (its session
    stays, its will is published, a 5.0 client hears DISCONNECT 0x98); `found`: whether it was connected.
    A client id names a client only within its tenant ("": the default tenant)."""

    def __init__(self, client_id: str, tenant: str = "") -> None:
        super().__init__()
        self.client_id = client_id
        self.tenant = tenant
        self.found = False

    def start(self, router: Router) -> None:
        router.disconnect_client(self)


def answer_listing(asks: Asks, environ: dict, only: str | None = None) -> Answer:
    """GET /clients?filter=TEXT&offset=N&limit=N[&tenant=NAME][&protocol=V][&sort=FIELD][&order=asc|desc]:
    one page of the connected clients (of that tenant only, "" the default tenant; of that MQTT version
    only), sorted by that field of FIELDS (default client_id; ties by client id, then tenant), so that the
    pages of one order follow each other; `total` counts every match. Each worker sends at most the page's
    end (MAX_ROWS at most) in that order, so a listing of 100,000 clients moves a page, not all of them.
    `only`: this tenant's, whatever is asked."""
    query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)  # tenant= names the default tenant
    try:
        offset, limit = int(query.get("offset", ["0"])[0]), int(query.get("limit", ["100"])[0])
    except ValueError:
        return "400 Bad Request", "text/plain", b"offset and limit are numbers\n", "bad offset or limit"
    protocol, sort, order = query.get("protocol", [""])[0], query.get("sort", ["client_id"])[0], query.get("order", ["asc"])[0]
    if offset < 0 or limit < 1 or offset + limit > MAX_ROWS or protocol not in ("", *PROTOCOLS.values()):
        return ("400 Bad Request", "text/plain", f"offset >= 0, limit >= 1, offset + limit <= {MAX_ROWS}, protocol one of "
                f"{', '.join(PROTOCOLS.values())}\n".encode(), "bad offset, limit or protocol")
    if sort not in FIELDS or order not in ORDERS:
        return ("400 Bad Request", "text/plain", f"sort is one of {', '.join(FIELDS)}; order asc or desc\n".encode(),
                "bad sort or order")
    tenant = query["tenant"][0] if "tenant" in query else None
    listing = ClientListing(query.get("filter", [""])[0], tenant if only is None else only, protocol, most=offset + limit,
                            sort=sort, descending=ORDERS[order])
    complete = ask(asks, listing)
    at = FIELDS.index(sort)
    clients = sorted(listing.clients, key=lambda row: (row[at], row[0], row[8]), reverse=ORDERS[order])
    body = {"total": listing.matched, "complete": complete, "offset": offset, "sort": sort, "order": order,
            "fields": FIELDS, "clients": clients[offset:offset + limit]}
    return "200 OK", "application/json", orjson.dumps(body), f"listed {listing.matched} clients"


def answer_disconnect(asks: Asks, environ: dict, only: str | None = None, admin: str = audit.ADMIN_API) -> Answer:
    """POST /clients/disconnect, body {"client_id": ID, "tenant": NAME} (tenant optional, default ""): 200
    when it was connected (now closed), 404 when not. `only`: a client of this tenant, whatever is asked;
    `admin`: who asked, for the audit log (the admin API's token, or a console admin)."""
    try:
        body = orjson.loads(environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)))
        client_id, tenant = body["client_id"], body.get("tenant", "")
    except (ValueError, TypeError, KeyError, AttributeError):
        client_id = tenant = None
    if not isinstance(client_id, str) or not isinstance(tenant, str):
        return "400 Bad Request", "text/plain", b'the body is {"client_id": "ID", "tenant": "NAME"}\n', "no client id"
    request = ClientDisconnect(client_id, tenant if only is None else only)
    ask(asks, request)
    who = f"{client_id} of tenant {request.tenant}" if request.tenant else client_id  # the one acted on
    audit.record(asks, admin, environ.get("REMOTE_ADDR", ""), audit.DISCONNECT, request.tenant, client_id,
                 "disconnected" if request.found else "not connected")
    if request.found:
        return "200 OK", "text/plain", f"disconnected {who}\n".encode(), f"disconnected {who!r}"
    return "404 Not Found", "text/plain", f"{who} is not connected\n".encode(), f"{who!r} is not connected"
