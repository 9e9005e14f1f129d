"""The console's Trace page: the messages of a topic filter, live, of every publisher or of one client
id, username or address (router/trace.py holds the trace and says why it is bounded and what it costs
the broker), and what the page read of them as a file to download.

Starting and stopping a trace are asks (router/asks.py): they change the router's set of traces, which
every worker is told. Reading one is not: the page polls `POST /api/trace/read` once a second, and its
thread drains the trace's ring itself (`Trace.take`), so a page costs the loop nothing, and a poll never
waits for a loop turn. Polling rather than a server-sent-event stream: a trace needs no thread of the 8
stream slots the overview uses (router/console/events.py), and a page that stops polling is how a
trace learns that nobody watches it (it ends after `trace.IDLE`). So a read acts (it takes what it
reads and keeps the trace alive): a POST with the CSRF token, like every action, and not a GET, which a
page of another origin (or another port of this host: the same site) can make a browser send.

A tenant admin starts, lists, reads and stops traces of their own tenant only, whatever the request
names; a broker admin names the tenant ("" the default). Starts and stops are logged with who asked.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import orjson

from plexmq.mqtt.topics import shared, valid_subscription
from plexmq.router import trace
from plexmq.router.asks import ask
from plexmq.router.console.http import Page, Reply, Routes, json, json_body, query, text
from plexmq.router.ops import audit

if TYPE_CHECKING:
    from plexmq.router.console.app import Console
    from plexmq.router.console.auth import Session

log = logging.getLogger("plexmq.router")

MAX_FILTER = 1024  # characters of a traced filter


def traces(console: Console, environ: dict, session: Session) -> Reply:
    """GET /api/trace: the live traces this session may see, with their counts, and the bounds."""
    now = time.monotonic()
    return json({"tenant": session.tenant, "most": trace.MOST, "tenant_most": trace.TENANT_MOST, "ring": trace.RING,
                 "rate": trace.RATE, "payload": trace.PAYLOAD, "idle": trace.IDLE, "lifetime": trace.LIFETIME,
                 "traces": [_described(t, now) for t in console.traces.visible(session.tenant)]})


def start(console: Console, environ: dict, session: Session) -> Reply:
    """POST /api/trace/start, body {"filter": F, "tenant": NAME[, "by": "client_id"|"username"|"address",
    "value": V]}: 200 with the trace once every worker watches it (`applied`); 400 for a filter that
    cannot be traced or a `by` without a value, 404 for no such tenant, 429 while trace.MOST are live
    or, for a tenant admin, trace.TENANT_MOST of its tenant."""
    body = json_body(environ)
    fields: dict = body if isinstance(body, dict) else {}
    topic_filter, tenant, by, value = (fields.get("filter", 0), fields.get("tenant", ""), fields.get("by", ""),
                                       fields.get("value", ""))  # the filter is asked for: missing, not a string
    if not all(isinstance(field, str) for field in (topic_filter, tenant, by, value)):
        return text("400 Bad Request", 'the body is {"filter": "FILTER", "tenant": "NAME", "by": "client_id", "value": "ID"}')
    if len(topic_filter) > MAX_FILTER or not valid_subscription(topic_filter) or shared(topic_filter) is not None:
        return text("400 Bad Request", f"{topic_filter!r} is not a topic filter that can be traced (no shared ones)")
    if by not in trace.WHO or bool(by) != bool(value) or len(value) > MAX_FILTER:
        return text("400 Bad Request", f"by is one of {', '.join(trace.WHO[1:])}, with a value (or neither)")
    question = trace.TraceStart(topic_filter, tenant if session.tenant is None else session.tenant, session.user,
                                session.tenant is not None, by, value)
    applied = ask(console.asks, question)
    of = f" of {by} {value!r}" if by else ""
    if question.trace is None:
        said = question.refusal or "the router did not answer: try again"
        log.info("console: %r from %s: trace of %r%s in tenant %r refused: %s", session.user, environ.get("REMOTE_ADDR"),
                 topic_filter, of, question.tenant, said)
        audit.record(console.asks, session.user, environ.get("REMOTE_ADDR", ""), audit.TRACE_START, question.tenant,
                     f"{topic_filter}{of}", f"refused: {said}")
        return text(question.status or "503 Service Unavailable", said)
    log.info("console: %r from %s started trace %d of %r%s in tenant %r", session.user, environ.get("REMOTE_ADDR"),
             question.trace.id, topic_filter, of, question.tenant)
    audit.record(console.asks, session.user, environ.get("REMOTE_ADDR", ""), audit.TRACE_START, question.tenant,
                 f"{topic_filter}{of}", f"started trace {question.trace.id}")
    # applied False: a worker had not acknowledged the set of traces in time; the trace runs, and may miss
    # what that worker's clients publish until it does
    return json({**_described(question.trace, time.monotonic()), "applied": applied})


def read(console: Console, environ: dict, session: Session) -> Reply:
    """POST /api/trace/read, body {"id": N}: the messages the trace kept since the last read, and its
    counts; 404 once it has ended (or is another tenant's)."""
    number = _number(environ)
    if number is None:
        return text("400 Bad Request", 'the body is {"id": N}')
    found = console.traces.find(number, session.tenant)
    if found is None:
        return text("404 Not Found", "no such trace: it has ended (stopped, unread, or too old)")
    taken = found.take()
    return json({**_described(found, time.monotonic()), "messages": [_message(entry) for entry in taken]})


def download(console: Console, environ: dict, session: Session) -> Reply:
    """GET /api/trace/download?id=N: the messages the trace's page has read (the last trace.SAVED), one
    JSON object a line, as a file; 404 once it has ended (or is another tenant's). A GET: it changes
    nothing, and a page of another origin cannot read the answer."""
    try:
        number = int(query(environ).get("id", ""))
    except ValueError:
        return text("400 Bad Request", "which trace? (id=N)")
    found = console.traces.find(number, session.tenant)
    if found is None:
        return text("404 Not Found", "no such trace: it has ended (stopped, unread, or too old)")
    lines = b"".join(orjson.dumps(_message(entry)) + b"\n" for entry in found.kept_for_download())
    return ("200 OK", [("Content-Type", "application/x-ndjson"),
                       ("Content-Disposition", f'attachment; filename="plexmq-trace-{number}.jsonl"')], lines)


def stop(console: Console, environ: dict, session: Session) -> Reply:
    """POST /api/trace/stop, body {"id": N}: 200 with the trace's last counts; 404 for no such trace of
    this session's tenant."""
    number = _number(environ)
    if number is None:
        return text("400 Bad Request", 'the body is {"id": N}')
    question = trace.TraceStop(number, session.tenant)
    ask(console.asks, question)
    if question.found is None:
        return text("404 Not Found", f"no trace {number}: it has ended")
    log.info("console: %r from %s stopped trace %d of %r in tenant %r", session.user, environ.get("REMOTE_ADDR"),
             number, question.found.filter, question.found.tenant.name)
    audit.record(console.asks, session.user, environ.get("REMOTE_ADDR", ""), audit.TRACE_STOP, question.found.tenant.name,
                 question.found.filter, f"stopped trace {number}")
    return json(_described(question.found, time.monotonic()))


def _number(environ: dict) -> int | None:
    """The trace a body {"id": N} names, or None."""
    body = json_body(environ)
    number = body.get("id") if isinstance(body, dict) else None
    return number if isinstance(number, int) and not isinstance(number, bool) else None


def _described(found: trace.Trace, now: float) -> dict:
    """A trace as the page shows it (counts read from the loop's writes: each one whole)."""
    return {"id": found.id, "filter": found.filter, "by": found.by, "value": found.value, "tenant": found.tenant.name,
            "user": found.user,
            "age": round(now - found.started, 1), "matched": found.matched, "kept": found.kept,
            "skipped": found.skipped, "lost": found.lost}


def _message(entry: trace.Entry) -> dict:
    """One traced message: its payload as text when it is UTF-8, else as hex."""
    seq, at, topic, qos, retain, size, payload, client = entry
    cut = size > len(payload)
    try:
        shown, form = payload.decode(), "text"
    except UnicodeDecodeError as exc:
        if cut and exc.start >= len(payload) - 3 and exc.reason == "unexpected end of data":  # a character cut in two
            shown, form = payload[:exc.start].decode(), "text"
        else:
            shown, form = payload.hex(" "), "hex"
    return {"seq": seq, "at": at, "topic": topic.decode(errors="replace"), "qos": qos, "retain": retain, "size": size,
            "payload": shown, "form": form, "cut": cut, "client": client}


PAGES: list[Page] = [("/trace", "Trace", "trace.html")]
ROUTES: Routes = {("GET", "/api/trace"): traces, ("POST", "/api/trace/start"): start,
                  ("POST", "/api/trace/read"): read, ("POST", "/api/trace/stop"): stop,
                  ("GET", "/api/trace/download"): download}
