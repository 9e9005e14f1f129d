"""The operators' web console (`console_port`, `console_host`): sessions, the pages' frame and the
routing, served by the router on a listener of its own.

Every page and request needs a session (router/console/auth.py) but the login page and the assets;
every request must name this console (`admin.Names`: Host and Origin; the others are logged, a bounded
number of lines: `Refusals`), and every POST must carry the session's CSRF token (form field `csrf` or
header X-CSRF-Token). A failed login counts toward the failed-logins alarm (router/ops/alarms.py), as an
MQTT one does. Each page's module (router/console/*.py, listed in FEATURES) brings its pages and routes
(router/console/http.py); what they need of the router's state they ask its loop (router/asks.py), the
live figures come from `Stats` (router/console/events.py), a trace's messages from its ring (`Traces`,
router/trace.py). The pages,
scripts and styles are files of the package (router/console/assets/): nothing is loaded from elsewhere,
and the Content-Security-Policy says so to the browser. With a `[tls]` certificate (and `console_tls`,
the default) it speaks HTTPS only, and its cookie is Secure.
"""

from __future__ import annotations

import html
import logging
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from importlib import resources

from plexmq.router.asks import Asks
from plexmq.router.console import alarms, audit, bans, bridges, clients, history, retained, sessions, subscriptions, trace
from plexmq.router.console.auth import COOKIE, STREAMS_EACH, Admins, Session, Throttled, files
from plexmq.router.console.events import STREAM, StreamingEndpoint, describe_store, events
from plexmq.router.console.http import Page, Reply, Routes, form, text
from plexmq.router.ops.admin import Names
from plexmq.router.ops.stats import Stats
from plexmq.router.store import Store
from plexmq.router.trace import Traces
from plexmq.workers import tls

log = logging.getLogger("plexmq.router")

ASSETS = resources.files("plexmq.router.console") / "assets"
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
         ".svg": "image/svg+xml"}
SECURITY = [("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'; form-action 'self'"),
            ("X-Content-Type-Options", "nosniff"), ("Referrer-Policy", "same-origin"), ("Cache-Control", "no-store")]
OVERVIEW: Page = ("/", "Overview", "overview.html")
# each with PAGES and ROUTES, in the navigation's order
FEATURES = (history, alarms, clients, sessions, subscriptions, retained, trace, bans, bridges, audit)
SESSION = "plexmq.session"  # environ key: the session that opened an event stream
REFUSALS_LOGGED = 10  # requests refused for their Host or Origin logged per REFUSALS_WINDOW; the rest counted
REFUSALS_WINDOW = 60.0  # seconds


def asset(name: str) -> bytes:
    return (ASSETS / name).read_bytes()


class Console:
    """The WSGI app: the routes of every feature, behind the login."""

    def __init__(self, admins: Admins, stats: Stats, asks: Asks, traces: Traces, names: Names, store: dict[str, str],
                 secure: bool = False) -> None:
        self.admins = admins
        self.stats = stats
        self.asks = asks
        self.traces = traces  # read by the Trace page's threads, changed by the loop (router/trace.py)
        self.names = names
        self.store = store  # `describe_store`'s, for the overview
        self.secure = secure  # served over HTTPS: the cookie says Secure
        self.assets = {item.name for item in ASSETS.iterdir() if not item.name.endswith(".html")}
        self.refusals = Refusals()
        self.pages: list[Page] = [OVERVIEW]
        self.routes: Routes = {}
        for feature in FEATURES:
            self.pages.extend(feature.PAGES)
            self.routes.update(feature.ROUTES)

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        status, headers, body = self.route(environ)
        if status == "stream":
            start_response("200 OK", [("Content-Type", "text/event-stream"), *SECURITY])
            return self.stream(environ[SESSION])
        start_response(status, [*headers, *SECURITY])
        return [body]

    def stream(self, opened: Session) -> Stream:
        """The overview's events for `opened` while it lives; its admin's stream count is given back when
        the server closes it (the client went, the session ended, its lifetime is over)."""
        return Stream(events(self.stats, opened.tenant, self.store, lambda: self.admins.alive(opened)),
                      lambda: self.admins.close_stream(opened))

    def route(self, environ: dict) -> Reply:
        """The answer; status "stream" for the event stream (`__call__` streams it)."""
        refused = self.names.refusal(environ)
        if refused is not None:
            self.refusals.said(environ, refused[1])
            return text(refused[0], refused[1])
        method, path = environ.get("REQUEST_METHOD", "GET"), environ.get("PATH_INFO", "/")
        if path.startswith("/assets/"):
            name = path[len("/assets/"):]
            if name not in self.assets:
                return text("404 Not Found", "no such asset")
            return "200 OK", [("Content-Type", TYPES.get(name[name.rfind("."):], "application/octet-stream"))], asset(name)
        if path == "/login":
            return self.login(environ) if method == "POST" else self.login_page()
        session = self.admins.session(environ.get("HTTP_COOKIE", ""))
        page = next((p for p in self.pages if p[0] == path), None)
        if session is None:
            if method == "GET" and page is not None:
                return "303 See Other", [("Location", "/login")], b""
            return text("401 Unauthorized", "log in first")
        if method == "POST":  # pages and /events are GET only; any POST is an action
            return self.act(environ, session, path)
        if page is not None:
            return "200 OK", [("Content-Type", TYPES[".html"])], self.render(page, session)
        if path == "/events":
            if not environ.get(STREAM):
                return text("503 Service Unavailable", "too many open consoles: close one")
            if not self.admins.open_stream(session):
                return text("429 Too Many Requests", f"{session.user} has {STREAMS_EACH} overviews open: close one")
            environ[SESSION] = session  # the stream shows its tenant's figures only (None: the broker's), while it lives
            return "stream", [], b""
        handler = self.routes.get((method, path))
        return text("404 Not Found", "no such page") if handler is None else handler(self, environ, session)

    def render(self, page: Page, session: Session) -> bytes:
        """A page's HTML with the frame filled in: the navigation (this page marked), who is logged in,
        the CSRF token."""
        links = " ".join(f'<a href="{path}"{" class=here" if path == page[0] else ""}>{name}</a>'
                         for path, name, _ in self.pages if name)
        who = session.user if session.tenant is None else f"{session.user} (tenant {session.tenant})"
        who += " (read-only)" if session.read_only else ""
        marked = " class=read-only" if session.read_only else ""
        nav = (f'<nav{marked}><b>plexmq</b> {links} <span class="who">{html.escape(who)} <form method="post" action="/logout">'
               f'<input type="hidden" name="csrf" value="{session.csrf}"><button>Log out</button></form></span></nav>')
        return asset(page[2]).replace(b"{{nav}}", nav.encode()).replace(b"{{csrf}}", session.csrf.encode())

    def act(self, environ: dict, session: Session, path: str) -> Reply:
        """A POST: only with the session's CSRF token, and (a logout aside) never a read-only admin's;
        logged with who asked."""
        fields: dict[str, list[str]] = {}
        if environ.get("CONTENT_TYPE", "").startswith("application/x-www-form-urlencoded"):
            fields = form(environ)
        given = environ.get("HTTP_X_CSRF_TOKEN") or fields.get("csrf", [""])[0]
        if not self.admins.csrf_ok(session, given):
            log.warning("console: %s %s by %r from %s refused: no valid CSRF token", "POST", path, session.user,
                        environ.get("REMOTE_ADDR"))
            return text("403 Forbidden", "no valid CSRF token: reload the page")
        if path == "/logout":
            self.admins.logout(environ.get("HTTP_COOKIE", ""))
            return "303 See Other", [("Location", "/login"), ("Set-Cookie", _cookie("", 0, self.secure))], b""
        if session.read_only:  # every other POST acts (a trace's read takes what it reads)
            log.warning("console: POST %s by %r from %s refused: read-only", path, session.user, environ.get("REMOTE_ADDR"))
            return text("403 Forbidden", f"{session.user} is read-only: looking only")
        handler = self.routes.get(("POST", path))
        return text("404 Not Found", "no such action") if handler is None else handler(self, environ, session)

    def login_page(self, error: str = "", status: str = "200 OK") -> Reply:
        if not self.admins.any:
            error = "The console has no admins (console_admins is empty): every login is refused."
        tenant = ('<label>Tenant <input name="tenant" id="tenant" placeholder="empty: the broker\'s admins"></label>'
                  if self.admins.tenants else "")
        page = asset("login.html").replace(b"{{error}}", html.escape(error).encode()).replace(b"{{tenant}}", tenant.encode())
        return status, [("Content-Type", TYPES[".html"])], page

    def login(self, environ: dict) -> Reply:
        address = environ.get("REMOTE_ADDR", "")
        fields = form(environ)
        user, tenant = fields.get("user", [""])[0], fields.get("tenant", [""])[0]
        try:
            token = self.admins.login(user, fields.get("password", [""])[0], address, tenant)
        except Throttled:
            log.warning("console login for %r%s from %s refused: too many failed logins", user,
                        f" of tenant {tenant!r}" if tenant else "", address)
            status, headers, body = self.login_page("Too many failed logins: wait a minute.", "429 Too Many Requests")
            return status, [*headers, ("Retry-After", "60")], body
        if token is None:
            self.stats.alarms.console_login_failed(tenant if tenant in self.admins.tenants else None, address)
            return self.login_page("Wrong user or password.", "401 Unauthorized")
        return "303 See Other", [("Location", "/"), ("Set-Cookie", _cookie(token, None, self.secure))], b""


class Refusals:
    """The log of requests refused for their Host or Origin (another site's page, a DNS-rebound name):
    a WARNING line each, at most REFUSALS_LOGGED per REFUSALS_WINDOW, so that a page that keeps sending
    them cannot flood the log; the next line logged says how many were left out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the HTTP threads share it
        self._since = -REFUSALS_WINDOW  # time.monotonic() the window began
        self._logged = 0  # lines in the window
        self._unsaid = 0  # refusals left out since the last line

    def said(self, environ: dict, why: str) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._since >= REFUSALS_WINDOW:
                self._since, self._logged = now, 0
            if self._logged >= REFUSALS_LOGGED:
                self._unsaid += 1
                return
            self._logged += 1
            unsaid, self._unsaid = self._unsaid, 0
        log.warning("console: %s %s from %s refused: %s%s", environ.get("REQUEST_METHOD"), environ.get("PATH_INFO"),
                    environ.get("REMOTE_ADDR"), why, f" ({unsaid} more refused, not logged, before it)" if unsaid else "")


class Stream:
    """A WSGI body that calls `ended` once when the server closes it, which it does however the answer
    ends (wsgiref's handler closes every body), even before the first event."""

    def __init__(self, events: Iterator[bytes], ended: Callable[[], None]) -> None:
        self._events = events
        self._ended: Callable[[], None] | None = ended

    def __iter__(self) -> Iterator[bytes]:
        return self._events

    def close(self) -> None:
        if self._ended is not None:
            ended, self._ended = self._ended, None
            ended()


def _cookie(value: str, max_age: int | None, secure: bool) -> str:
    """The session cookie; Secure over HTTPS (a browser then never sends it in the clear)."""
    return (f"{COOKIE}={value}; HttpOnly; SameSite=Strict; Path=/" + ("; Secure" if secure else "")
            + ("" if max_age is None else f"; Max-Age={max_age}"))


def tls_context(config: dict) -> ssl.SSLContext | None:
    """The `[tls]` certificate's context when the console serves HTTPS (workers/tls.py `console_wanted`),
    else None. No client certificate is asked: an operator's browser logs in with a password."""
    if not tls.console_wanted(config):
        return None
    context = tls.server_context(config["tls"])  # checked at startup (acceptor/config.py): no ValueError here
    context.verify_mode = ssl.CERT_NONE
    return context


def serve_console(stats: Stats, asks: Asks, traces: Traces, config: dict, store: Store | None) -> Admins | None:
    """Start the console (`console_host`, `console_port`, the admins, `console_tls`); its admins (a
    reload rereads them: `Admins.reload`), or None when the port cannot be had (logged)."""
    host, port = config["console_host"], config["console_port"]
    admins = Admins(*files(config))
    context = tls_context(config)
    scheme = "http" if context is None else "https"
    console: Console | None = None

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        assert console is not None  # made before the first request can arrive
        return console(environ, start_response)

    try:
        server = StreamingEndpoint((host, port), app, lambda data: data.startswith(b"GET /events "), context)
    except OSError as exc:
        log.error("no console: cannot listen on %s:%d: %s", host, port, exc.strerror)
        return None
    bound = server.socket.getsockname()[:2]
    console = Console(admins, stats, asks, traces, Names(host, bound[1], scheme), describe_store(store), context is not None)
    threading.Thread(target=server.run, name="plexmq-console", daemon=True).start()
    log.info("console on %s://%s:%d/%s", scheme, bound[0], bound[1],
             "" if admins.any else " (no console_admins: every login refused)")
    return admins
