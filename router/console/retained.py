"""The console's retained messages page: browse them by topic filter (a page at a time), view one (its
payload as text, JSON or hex, and its MQTT 5 properties), delete one.

Each is an ask to the router's loop (router/asks.py), bounded there: a listing looks at SCAN_MOST
retained messages at most and stops counting COUNT_MORE matches past its page; a view copies
VIEW_MOST bytes of the payload. A delete clears the topic as an empty retained PUBLISH does
(`Router.retain`: memory and store), and delivers nothing. A tenant admin sees and deletes only the
tenant's messages (`http.scope`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from itertools import islice
from typing import TYPE_CHECKING

import orjson

from plexmq.mqtt import kinds, properties
from plexmq.mqtt.framing import encode_remaining_length
from plexmq.mqtt.topics import matches, shared, valid_filter
from plexmq.router.asks import Ask, ask
from plexmq.router.console.http import Page, Reply, Routes, json, json_body, query, scope, text
from plexmq.router.message import Message
from plexmq.router.ops import audit

if TYPE_CHECKING:
    from plexmq.router.console.app import Console
    from plexmq.router.console.auth import Session
    from plexmq.router.core import Router
    from plexmq.router.tenants import Tenant

log = logging.getLogger("plexmq.router")

PAGE_MOST = 100  # rows a page may ask for
SCAN_MOST = 20_000  # retained messages one listing looks at (~20 ms of the loop at worst): past it, "at least"
COUNT_MORE = 1_000  # matches counted past the page (then "at least"): enough to say whether to page on
VIEW_MOST = 65_536  # payload bytes a view returns (the rest is said to be cut)
FIELDS = ["topic", "qos", "size", "expires_at", "tenant"]  # a listing's row; expires_at: time.time() s, 0 never


class RetainedListing(Ask):
    """One page of the retained messages matching a filter, in the order the router holds them (a
    replaced message keeps its place), not expired; of one tenant, or of every tenant (None)."""

    def __init__(self, topic_filter: str, tenant: str | None, offset: int, limit: int) -> None:
        super().__init__()
        self.filter = topic_filter
        self.tenant = tenant
        self.offset = offset
        self.limit = limit
        self.rows: list[list] = []
        self.total = 0  # matches counted
        self.whole = True  # whether `total` counts every match (else: at least that many)

    def start(self, router: Router) -> None:
        now = time.time()
        exact = "+" not in self.filter and "#" not in self.filter
        last = self.offset + self.limit + COUNT_MORE
        budget = SCAN_MOST
        for tenant in _tenants(router, self.tenant):
            messages = tenant.retained.messages
            looked: Iterable[tuple[str, Message]]
            if exact:  # a topic name: one lookup
                found = messages.get(self.filter)
                looked = () if found is None else ((self.filter, found),)
            else:
                looked = islice(messages.items(), budget)
            for topic, message in looked:
                budget -= 1
                if message.expires_at and message.expires_at <= now or not (exact or matches(self.filter, topic)):
                    continue
                if self.offset <= self.total < self.offset + self.limit:
                    self.rows.append([topic, message.qos, len(message.payload), message.expires_at, tenant.name])
                self.total += 1
                if self.total >= last:
                    break
            budget -= 1  # a tenant looked at costs too (thousands may be declared)
            if self.total >= last or budget <= 0:
                self.whole = False
                break
        self.done.set()


class RetainedView(Ask):
    """One retained message: its first VIEW_MOST payload bytes and what else it holds (None: none)."""

    def __init__(self, tenant: str, topic: str) -> None:
        super().__init__()
        self.tenant = tenant
        self.topic = topic
        self.found: Message | None = None  # a copy: its payload cut to VIEW_MOST
        self.size = 0

    def start(self, router: Router) -> None:
        tenant = router.tenants.get(self.tenant)
        message = tenant.retained.messages.get(self.topic) if tenant is not None else None
        if message is not None and not (message.expires_at and message.expires_at <= time.time()):
            self.size = len(message.payload)
            self.found = Message(message.topic, message.payload[:VIEW_MOST], message.qos, True, message.props,
                                 message.expires_at)
        self.done.set()


class RetainedDelete(Ask):
    """Clear one topic's retained message as an empty retained PUBLISH would; `found`: whether it had one."""

    def __init__(self, tenant: str, topic: str) -> None:
        super().__init__()
        self.tenant = tenant
        self.topic = topic
        self.found = False

    def start(self, router: Router) -> None:
        tenant = router.tenants.get(self.tenant)
        if tenant is not None and self.topic in tenant.retained.messages:
            router.retain(tenant, self.topic, Message(self.topic.encode(), b"", 0, True))
            self.found = True
        self.done.set()


def _tenants(router: Router, name: str | None) -> list[Tenant]:
    if name is None:
        return list(router.tenants.values())
    tenant = router.tenants.get(name)
    return [] if tenant is None else [tenant]


def listing(console: Console, environ: dict, session: Session) -> Reply:
    """GET /api/retained?filter=F&offset=N&limit=N[&tenant=NAME]: a page of the matching retained messages."""
    asked = query(environ)
    topic_filter = asked.get("filter") or "#"
    try:
        offset, limit = max(int(asked.get("offset", "0")), 0), min(max(int(asked.get("limit", "100")), 1), PAGE_MOST)
    except ValueError:
        return text("400 Bad Request", "offset and limit are numbers")
    if not valid_filter(topic_filter) or shared(topic_filter) is not None:
        return text("400 Bad Request", f"not a topic filter: {topic_filter!r}")
    page = RetainedListing(topic_filter, scope(session, asked.get("tenant")), offset, limit)
    complete = ask(console.asks, page)
    return json({"filter": topic_filter, "offset": offset, "total": page.total, "whole": page.whole and complete,
                 "fields": FIELDS, "messages": page.rows})


def view(console: Console, environ: dict, session: Session) -> Reply:
    """GET /api/retained/message?topic=T[&tenant=NAME]: one message, its payload as text (valid UTF-8),
    pretty JSON (when it parses) and hex, and its MQTT 5 properties; 404 when the tenant has none there."""
    asked = query(environ)
    tenant, topic = scope(session, asked.get("tenant", "")) or "", asked.get("topic", "")
    found = RetainedView(tenant, topic)
    ask(console.asks, found)
    message = found.found
    if message is None:
        return text("404 Not Found", f"no retained message on {topic!r}")
    cut = found.size > len(message.payload)
    shown = _text(message.payload, cut)
    return json({"topic": topic, "tenant": tenant, "qos": message.qos, "size": found.size, "cut": cut,
                 "text": shown, "json": None if shown is None or cut else _pretty(shown), "hex": message.payload.hex(),
                 "expires_at": message.expires_at, "properties": _properties(message.props)})


def delete(console: Console, environ: dict, session: Session) -> Reply:
    """POST /api/retained/delete, body {"topic": T, "tenant": NAME} (tenant optional, default ""): 200
    when it was there (now gone, from the store too), 404 when not; logged with who asked."""
    body = json_body(environ)
    topic = body.get("topic") if isinstance(body, dict) else None
    tenant = body.get("tenant", "") if isinstance(body, dict) else None
    if not isinstance(topic, str) or not isinstance(tenant, str):
        return text("400 Bad Request", 'the body is {"topic": "TOPIC", "tenant": "NAME"}')
    gone = RetainedDelete(scope(session, tenant) or "", topic)
    ask(console.asks, gone)
    where = f"{topic!r} of tenant {gone.tenant}" if gone.tenant else repr(topic)
    audit.record(console.asks, session.user, environ.get("REMOTE_ADDR", ""), audit.RETAINED_DELETE, gone.tenant, topic,
                 "deleted" if gone.found else "none there")
    if not gone.found:
        return text("404 Not Found", f"no retained message on {where}")
    log.info("console: %r from %s: deleted the retained message on %s", session.user, environ.get("REMOTE_ADDR"), where)
    return text("200 OK", f"deleted the retained message on {where}")


def _text(payload: bytes, cut: bool) -> str | None:
    """The payload as UTF-8 text, or None when it is not; a cut one may end inside a character."""
    for trim in range(4 if cut else 1):
        try:
            return payload[:len(payload) - trim].decode()
        except UnicodeDecodeError:
            continue
    return None


def _pretty(shown: str) -> str | None:
    try:
        return orjson.dumps(orjson.loads(shown), option=orjson.OPT_INDENT_2).decode()
    except orjson.JSONDecodeError:
        return None


def _properties(props: bytes) -> dict[str, object]:
    """The properties that say what the payload is and where an answer goes (the router keeps them as
    they travel; the message expiry is `expires_at`)."""
    found, _end = properties.decode(encode_remaining_length(len(props)) + props, 0, kinds.PUBLISH)
    correlation = found.get(properties.CORRELATION_DATA)
    return {"payload_format_indicator": found.get(properties.PAYLOAD_FORMAT_INDICATOR),
            "content_type": found.get(properties.CONTENT_TYPE),
            "response_topic": found.get(properties.RESPONSE_TOPIC),
            "correlation_data": correlation.hex() if isinstance(correlation, bytes) else None,
            "user_properties": found.get(properties.USER_PROPERTY, [])}


PAGES: list[Page] = [("/retained", "Retained", "retained.html")]
ROUTES: Routes = {("GET", "/api/retained"): listing, ("GET", "/api/retained/message"): view,
                  ("POST", "/api/retained/delete"): delete}
