"""The operators' web console (`console_port`, `console_host`): its routes and pages, served by the
router on a listener of its own.

Every page and request needs a session (router/console_auth.py) but the login page and the assets;
every request must name this console (`admin.Names`: Host and Origin), and every POST must carry the
session's CSRF token (form field `csrf` or header X-CSRF-Token). The clients are listed and
disconnected through the admin endpoint's own path (router/listing.py and the `listings` queue), the
live figures come from `Stats` (router/console_events.py). The pages, scripts and styles are files of
the package (router/console_assets/): nothing is loaded from elsewhere, and the Content-Security-Policy
says so to the browser.
"""

from __future__ import annotations

import html
import logging
import queue
import threading
from collections.abc import Callable, Iterable
from importlib import resources
from urllib.parse import parse_qs

from plexmq.router import listing
from plexmq.router.admin import Names
from plexmq.router.console_auth import COOKIE, Admins, Session
from plexmq.router.console_events import STREAM, StreamingEndpoint, events
from plexmq.router.stats import Stats

log = logging.getLogger("plexmq.router")

ASSETS = resources.files("plexmq.router") / "console_assets"
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
         ".svg": "image/svg+xml"}
SECURITY = [("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'; form-action 'self'"),
            ("X-Content-Type-Options", "nosniff"), ("Referrer-Policy", "same-origin"), ("Cache-Control", "no-store")]
PAGES = {"/": "overview.html", "/clients": "clients.html"}
MAX_FORM = 4096  # bytes of a login or logout form

Reply = tuple[str, list[tuple[str, str]], bytes]


def asset(name: str) -> bytes:
    return (ASSETS / name).read_bytes()


class Console:
    """The WSGI app: one method per route."""

    def __init__(self, admins: Admins, stats: Stats, listings: queue.Queue[listing.Request], names: Names) -> None:
        self.admins = admins
        self.stats = stats
        self.listings = listings
        self.names = names
        self.assets = {item.name for item in ASSETS.iterdir() if not item.name.endswith(".html")}

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        status, headers, body = self.route(environ)
        if status == "stream":
            start_response("200 OK", [("Content-Type", "text/event-stream"), *SECURITY])
            return events(self.stats)
        start_response(status, [*headers, *SECURITY])
        return [body]

    def route(self, environ: dict) -> Reply:
        """The answer; status "stream" for the event stream (`__call__` streams it)."""
        refused = self.names.refusal(environ)
        if refused is not None:
            return _text(refused[0], refused[1])
        method, path = environ.get("REQUEST_METHOD", "GET"), environ.get("PATH_INFO", "/")
        if path.startswith("/assets/"):
            name = path[len("/assets/"):]
            if name not in self.assets:
                return _text("404 Not Found", "no such asset")
            return "200 OK", [("Content-Type", TYPES.get(name[name.rfind("."):], "application/octet-stream"))], asset(name)
        if path == "/login":
            return self.login(environ) if method == "POST" else self.login_page()
        session = self.admins.session(environ.get("HTTP_COOKIE", ""))
        if session is None:
            if method == "GET" and path in PAGES:
                return "303 See Other", [("Location", "/login")], b""
            return _text("401 Unauthorized", "log in first")
        if method == "POST":  # pages and /events are GET only; any POST is an action
            return self.act(environ, session, path)
        if path in PAGES:
            page = asset(PAGES[path]).replace(b"{{csrf}}", session.csrf.encode())
            page = page.replace(b"{{user}}", html.escape(session.user).encode())
            return "200 OK", [("Content-Type", TYPES[".html"])], page
        if path == "/events":
            if not environ.get(STREAM):
                return _text("503 Service Unavailable", "too many open consoles: close one")
            return "stream", [], b""
        if path == "/api/clients":
            status, kind, body, _outcome = listing.answer_listing(self.listings, environ)
            return status, [("Content-Type", kind)], body
        return _text("404 Not Found", "no such page")

    def act(self, environ: dict, session: Session, path: str) -> Reply:
        """A POST: only with the session's CSRF token; logged with who asked."""
        form: dict[str, list[str]] = {}
        if environ.get("CONTENT_TYPE", "").startswith("application/x-www-form-urlencoded"):
            form = _form(environ)
        given = environ.get("HTTP_X_CSRF_TOKEN") or form.get("csrf", [""])[0]
        if not self.admins.csrf_ok(session, given):
            log.warning("console: %s %s by %r from %s refused: no valid CSRF token", "POST", path, session.user,
                        environ.get("REMOTE_ADDR"))
            return _text("403 Forbidden", "no valid CSRF token: reload the page")
        if path == "/logout":
            self.admins.logout(environ.get("HTTP_COOKIE", ""))
            return "303 See Other", [("Location", "/login"), ("Set-Cookie", _cookie("", 0))], b""
        if path == "/api/clients/disconnect":
            status, kind, body, outcome = listing.answer_disconnect(self.listings, environ)
            log.info("console: %r from %s: %s", session.user, environ.get("REMOTE_ADDR"), outcome)
            return status, [("Content-Type", kind)], body
        return _text("404 Not Found", "no such action")

    def login_page(self, error: str = "", status: str = "200 OK") -> Reply:
        if self.admins.file is None:
            error = "The console has no admins (console_admins is empty): every login is refused."
        page = asset("login.html").replace(b"{{error}}", html.escape(error).encode())
        return status, [("Content-Type", TYPES[".html"])], page

    def login(self, environ: dict) -> Reply:
        address = environ.get("REMOTE_ADDR", "")
        if self.admins.throttled(address):
            log.warning("console login from %s refused: too many failed logins", address)
            return "429 Too Many Requests", [("Content-Type", TYPES[".html"]), ("Retry-After", "60")], \
                asset("login.html").replace(b"{{error}}", b"Too many failed logins: wait a minute.")
        form = _form(environ)
        token = self.admins.login(form.get("user", [""])[0], form.get("password", [""])[0], address)
        if token is None:
            return self.login_page("Wrong user or password.", "401 Unauthorized")
        return "303 See Other", [("Location", "/"), ("Set-Cookie", _cookie(token, None))], b""


def _form(environ: dict) -> dict[str, list[str]]:
    length = min(int(environ.get("CONTENT_LENGTH") or 0), MAX_FORM)
    return parse_qs(environ["wsgi.input"].read(length).decode(errors="replace"))


def _cookie(value: str, max_age: int | None) -> str:
    """The session cookie (no Secure flag: the console has no TLS yet)."""
    return f"{COOKIE}={value}; HttpOnly; SameSite=Strict; Path=/" + ("" if max_age is None else f"; Max-Age={max_age}")


def _text(status: str, text: str) -> Reply:
    return status, [("Content-Type", "text/plain; charset=utf-8")], f"{text}\n".encode()


def serve_console(stats: Stats, listings: queue.Queue[listing.Request], host: str, port: int,
                  admins_path: str) -> tuple[str, int] | None:
    """Start the console; its (host, port), or None when the port cannot be had (logged)."""
    admins = Admins(admins_path)
    console: Console | None = None

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        assert console is not None  # made before the first request can arrive
        return console(environ, start_response)

    try:
        server = StreamingEndpoint((host, port), app, lambda data: data.startswith(b"GET /events "))
    except OSError as exc:
        log.error("no console: cannot listen on %s:%d: %s", host, port, exc.strerror)
        return None
    bound = server.socket.getsockname()[:2]
    console = Console(admins, stats, listings, Names(host, bound[1]))
    threading.Thread(target=server.run, name="plexmq-console", daemon=True).start()
    log.info("console on http://%s:%d/%s", bound[0], bound[1], "" if admins.file else " (no console_admins: every login refused)")
    return bound[0], bound[1]
