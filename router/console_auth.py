"""Who may use the web console: its admins (a file of `user:hash` lines, the password file's format,
checked by workers/passwords.py; the broker's `console_admins` see every tenant, a tenant's
`tenants.NAME.console_admins` log in with the tenant's name and see that tenant only), their
sessions (a random cookie, forgotten after IDLE), each session's CSRF token, and a bound on failed
logins per address (a password cannot be guessed at HTTP speed).

Sessions live in the router's memory only: a restart logs every operator out, which is the safe way.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from plexmq.workers.passwords import PasswordFile

log = logging.getLogger("plexmq.router")

IDLE = 12 * 3600.0  # seconds a session lasts unused
FAILURES = 5  # failed logins an address may make per FAILURE_WINDOW
FAILURE_WINDOW = 60.0  # seconds
COOKIE = "plexmq_console"


@dataclass
class Session:
    user: str
    tenant: str | None = None  # a tenant admin's tenant; None: a broker admin (every tenant)
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    seen: float = field(default_factory=time.monotonic)


class Admins:
    """Logins, sessions and the failed-login bound; safe to use from the HTTP threads."""

    def __init__(self, path: str, tenants: dict[str, str] | None = None) -> None:
        """`path`: the broker's admins file ("": none); `tenants`: tenant name -> its admins file. Read
        once, at start."""
        self.file = PasswordFile.load(path) if path else None
        self.tenants = {name: PasswordFile.load(file) for name, file in (tenants or {}).items() if file}
        self._sessions: dict[str, Session] = {}
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def throttled(self, address: str) -> bool:
        """Whether `address` has used up its failed logins for now."""
        with self._lock:
            return self._recent(address) >= FAILURES

    @property
    def any(self) -> bool:
        """Whether anyone at all may log in."""
        return self.file is not None or bool(self.tenants)

    def login(self, user: str, password: str, address: str, tenant: str = "") -> str | None:
        """A new session's cookie value when `user` and `password` match an admin (of `tenant`, "": the
        broker's), else None (logged, and counted against `address`). Slow (the hash): called from an
        HTTP thread, never the loop."""
        file = self.tenants.get(tenant) if tenant else self.file
        who = f"{user!r} of tenant {tenant!r}" if tenant else repr(user)
        if file is not None and file.check(user, password):
            token = secrets.token_urlsafe(32)
            with self._lock:
                self._sessions[token] = Session(user, tenant or None)
            log.info("console login by %s from %s", who, address)
            return token
        with self._lock:
            self._failures.setdefault(address, deque()).append(time.monotonic())
        log.warning("console login refused for %s from %s", who, address)
        return None

    def session(self, cookie_header: str) -> Session | None:
        """The live session the request's Cookie header names (its idle time restarts), or None."""
        token = _cookie(cookie_header)
        now = time.monotonic()
        with self._lock:
            for old in [t for t, s in self._sessions.items() if now - s.seen > IDLE]:
                del self._sessions[old]
            found = self._sessions.get(token) if token else None
            if found is not None:
                found.seen = now
            return found

    def logout(self, cookie_header: str) -> None:
        token = _cookie(cookie_header)
        with self._lock:
            self._sessions.pop(token or "", None)

    @staticmethod
    def csrf_ok(session: Session, given: str) -> bool:
        """`given` is the session's CSRF token (compared in constant time)."""
        return hmac.compare_digest(given.encode(), session.csrf.encode())

    def _recent(self, address: str) -> int:
        """The failed logins of `address` within the window (older ones, and then the address, forgotten);
        under the lock."""
        failures = self._failures.get(address)
        if failures is None:
            return 0
        while failures and time.monotonic() - failures[0] > FAILURE_WINDOW:
            failures.popleft()
        if not failures:
            del self._failures[address]
        return len(failures)


def _cookie(header: str) -> str | None:
    """The console's session token in a Cookie header, or None."""
    for part in header.split(";"):
        name, _, value = part.strip().partition("=")
        if name == COOKIE and value:
            return value
    return None
