"""What every route of the web console uses: the reply it returns, plain-text, JSON and form helpers,
and the shape of a feature (its pages and routes), so that each page's module (router/console/*.py)
adds its routes to `router/console/app.py` without touching the others.

A handler answers one (method, path) for a logged-in session; it gets the `Console` (the stats, the
asks queue to the router's loop) and the session, whose `tenant` it must honour: a tenant admin
(`session.tenant` set) sees and acts on that tenant only, whatever the request names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

import orjson

if TYPE_CHECKING:
    from plexmq.router.console.app import Console
    from plexmq.router.console.auth import Session

Reply = tuple[str, list[tuple[str, str]], bytes]  # HTTP status, headers, body
Handler = Callable[["Console", dict, "Session"], Reply]
Routes = dict[tuple[str, str], Handler]  # (method, path) -> its handler; a POST only with the CSRF token
Page = tuple[str, str, str]  # path, its name in the navigation ("": none, a page reached by links), its HTML asset

MAX_FORM = 4096  # bytes of a form (login, logout)
MAX_JSON = 65536  # bytes of a JSON request body


def text(status: str, said: str) -> Reply:
    return status, [("Content-Type", "text/plain; charset=utf-8")], f"{said}\n".encode()


def json(body: object, status: str = "200 OK") -> Reply:
    return status, [("Content-Type", "application/json")], orjson.dumps(body)


def form(environ: dict) -> dict[str, list[str]]:
    """A url-encoded body (at most MAX_FORM bytes are read)."""
    return parse_qs(environ["wsgi.input"].read(_length(environ, MAX_FORM)).decode(errors="replace"))


def query(environ: dict) -> dict[str, str]:
    """The query string, the first value of each name (blank values kept)."""
    return {name: values[0] for name, values in parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True).items()}


def scope(session: Session, asked: str | None) -> str | None:
    """The tenant a request may see and act on: a tenant admin's own, whatever it names; for a broker
    admin the one it names ("": the default tenant; None: every tenant, where a page can show them all)."""
    return asked if session.tenant is None else session.tenant


def json_body(environ: dict) -> object:
    """A JSON request body (at most MAX_JSON bytes); None when it is not JSON."""
    try:
        return orjson.loads(environ["wsgi.input"].read(_length(environ, MAX_JSON)))
    except orjson.JSONDecodeError:
        return None


def _length(environ: dict, most: int) -> int:
    """The body's Content-Length, at most `most`; 0 when it is missing, negative or not a number (the
    endpoint read the request whole with it so: router/ops/httpd.py), which the handler then refuses as an
    empty body rather than failing with a 500."""
    try:
        return min(max(int(environ.get("CONTENT_LENGTH") or 0), 0), most)
    except ValueError:  # "x", "1e3", "²", or more digits than int() takes
        return 0
