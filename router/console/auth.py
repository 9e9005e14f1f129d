"""Who may use the web console: its admins (a file of `user:hash` lines, the password file's format,
checked by workers/auth/passwords.py; the broker's `console_admins` see every tenant, a tenant's
`tenants.NAME.console_admins` log in with the tenant's name and see that tenant only; a line that ends
with ` role=read-only` is an admin who sees every page but whose every action is refused), their
sessions (a random cookie, forgotten after IDLE or past SESSIONS_EACH of one admin), each session's
CSRF token, and bounds on failed logins per address (an IPv6 one by its /64) and per admin name from
every address together (a password cannot be guessed at HTTP speed, nor by a guesser that changes its
address), in a memory of at most TRACKED addresses and names. Each login is counted before its slow
hash, and every login costs one hash, whether its tenant or user exists or not.

Sessions live in the router's memory only: a restart logs every operator out, which is the safe way.
A reload (SIGHUP) reads the admins files again (`Admins.reload`): an admin no longer in them, or whose
tenant was removed or disabled, is logged out at once.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import secrets
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from plexmq.workers.auth.passwords import PasswordFile, PasswordFileError

log = logging.getLogger("plexmq.router")

IDLE = 12 * 3600.0  # seconds a session lasts unused
FAILURES = 5  # failed logins an address may make per FAILURE_WINDOW
ACCOUNT_FAILURES = 20  # failed logins for one admin name (of a tenant) per FAILURE_WINDOW, from every address
FAILURE_WINDOW = 60.0  # seconds
TRACKED = 10_000  # addresses and names whose failed logins are remembered (past it, the longest quiet forgotten)
SESSIONS_EACH = 20  # sessions one admin may hold: a login past it ends the one least recently used
STREAMS_EACH = 2  # live overviews (event streams) one admin may hold, of the console's few (events.STREAMS)
COOKIE = "plexmq_console"
NOBODY = "\0"  # no admin's name (workers/auth/passwords.py `username_error`): a check of it costs a file's dummy hash


class Throttled(Exception):
    """A login refused unchecked: its address or admin name has used up its failed logins for now."""


@dataclass
class Session:
    user: str
    tenant: str | None = None  # a tenant admin's tenant; None: a broker admin (every tenant)
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    seen: float = field(default_factory=time.monotonic)
    token: str = ""  # its cookie's value
    read_only: bool = False  # role=read-only in the admins file: may look, not act (router/console/app.py `act`)


class Admins:
    """Logins, sessions and the failed-login bound; safe to use from the HTTP threads."""

    def __init__(self, path: str, tenants: dict[str, str] | None = None) -> None:
        """`path`: the broker's admins file ("": none); `tenants`: tenant name -> its admins file (`files`).
        A file that cannot be read raises PasswordFileError (the acceptor checked them all at startup)."""
        self.file = PasswordFile.load(path) if path else None
        self.tenants = {name: PasswordFile.load(file) for name, file in (tenants or {}).items() if file}
        self._sessions: dict[str, Session] = {}
        self._failures: OrderedDict[tuple[str, ...], deque[float]] = OrderedDict()  # the last failure last
        self._streams: dict[tuple[str, str | None], int] = {}  # (user, tenant) -> its open event streams
        self._lock = threading.Lock()

    def reload(self, path: str, tenants: dict[str, str]) -> None:
        """SIGHUP (the router's loop: the files are parsed, nothing hashed): the admins files again, and
        the sessions of every admin no longer in them (deleted, or of a tenant removed, disabled or
        without admins now) end at once (their event streams at their next event). A file that cannot be
        read gives no admins, logged (the acceptor checked it before it signalled)."""
        file = _reloaded(path) if path else None
        files = {name: found for name, where in tenants.items() if where and (found := _reloaded(where)) is not None}
        with self._lock:
            self.file, self.tenants = file, files
            ended = [session for session in self._sessions.values() if not self._listed(session)]
            for session in ended:
                del self._sessions[session.token]
            for session in self._sessions.values():  # a role changed applies at once
                session.read_only = _read_only(self._file_of(session.tenant), session.user)
        whose = sorted({repr(s.user) + (f" of tenant {s.tenant!r}" if s.tenant else "") for s in ended})
        log.info("console: admins reloaded%s", f"; logged out, no longer admins: {', '.join(whose)}" if whose else "")

    def _file_of(self, tenant: str | None) -> PasswordFile | None:
        """The admins file of `tenant`'s admins (None: the broker's), if it has one."""
        return self.file if tenant is None else self.tenants.get(tenant)

    def _listed(self, session: Session) -> bool:
        """Whether `session`'s admin is in her admins file still."""
        file = self._file_of(session.tenant)
        return file is not None and session.user in file

    @property
    def any(self) -> bool:
        """Whether anyone at all may log in."""
        return self.file is not None or bool(self.tenants)

    def login(self, user: str, password: str, address: str, tenant: str = "") -> str | None:
        """A new session's cookie value when `user` and `password` match an admin (of `tenant`, "": the
        broker's), else None (logged). Throttled, before any hash, when `address` or that admin name has
        used up its failed logins. Slow (the hash): called from an HTTP thread, never the loop."""
        now = time.monotonic()
        counted = self._count(now, address, user, tenant)
        file = self._file_of(tenant or None)
        who = f"{user!r} of tenant {tenant!r}" if tenant else repr(user)
        if not self._check(file, user, password):
            log.warning("console login refused for %s from %s", who, address)
            return None
        token = secrets.token_urlsafe(32)
        with self._lock:
            if file is not self._file_of(tenant or None):  # a reload came during the hash: it may have revoked her
                return None
            for key in counted:  # not a failure after all
                failures = self._failures.get(key)
                if failures is not None and now in failures:
                    failures.remove(now)
                    if not failures:
                        del self._failures[key]
            mine = sorted((s.seen, t) for t, s in self._sessions.items() if (s.user, s.tenant) == (user, tenant or None))
            for _seen, old in mine[:max(len(mine) + 1 - SESSIONS_EACH, 0)]:
                del self._sessions[old]
            self._sessions[token] = Session(user, tenant or None, token=token, read_only=_read_only(file, user))
        log.info("console login by %s from %s", who, address)
        return token

    def _count(self, now: float, address: str, user: str, tenant: str) -> tuple[tuple[str, ...], ...]:
        """Count a login as failed before its hash is checked (the hash is slow: concurrent guesses
        must not all pass the bound before the first is counted); the keys it was counted under, which a
        success gives back. Throttled when `address` or the admin name has no failed login left."""
        keys = ((_address(address), FAILURES), (("admin", tenant, user), ACCOUNT_FAILURES))
        with self._lock:
            self._forget(now)
            if any(len(self._failures.get(key, ())) >= most for key, most in keys):
                raise Throttled
            for key, most in keys:
                self._failures.setdefault(key, deque(maxlen=most)).append(now)
                self._failures.move_to_end(key)
            while len(self._failures) > TRACKED:
                self._failures.popitem(last=False)
        return tuple(key for key, _most in keys)

    def _check(self, file: PasswordFile | None, user: str, password: str) -> bool:
        """Whether `password` is `user`'s in `file`. With no such file (a tenant without admins, or none
        at all) one hash is checked all the same, against a file's dummy (NOBODY is no user's name),
        so that timing does not tell which tenants have admins."""
        if file is not None:
            return file.check(user, password)
        decoy = self.file if self.file is not None else next(iter(self.tenants.values()), None)
        if decoy is not None:
            decoy.check(NOBODY, password)
        return False

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

    def alive(self, session: Session) -> bool:
        """Whether `session` is still live (not logged out, ended or idle too long), without using it."""
        with self._lock:
            return self._sessions.get(session.token) is session and time.monotonic() - session.seen <= IDLE

    def open_stream(self, session: Session) -> bool:
        """Count a new event stream of `session`'s admin; False (nothing counted) when that admin already
        has STREAMS_EACH: one admin (a tenant's, say) cannot take every overview slot of the console."""
        admin = (session.user, session.tenant)
        with self._lock:
            if self._streams.get(admin, 0) >= STREAMS_EACH:
                return False
            self._streams[admin] = self._streams.get(admin, 0) + 1
            return True

    def close_stream(self, session: Session) -> None:
        admin = (session.user, session.tenant)
        with self._lock:
            left = self._streams.pop(admin, 1) - 1
            if left:
                self._streams[admin] = left

    def logout(self, cookie_header: str) -> None:
        token = _cookie(cookie_header)
        with self._lock:
            self._sessions.pop(token or "", None)

    @staticmethod
    def csrf_ok(session: Session, given: str) -> bool:
        """`given` is the session's CSRF token (compared in constant time)."""
        return hmac.compare_digest(given.encode(), session.csrf.encode())

    def _forget(self, now: float) -> None:
        """Forget the failed logins older than the window (the addresses and names with none left first,
        then the old ones of the rest); under the lock. A success gives its count back, which may leave
        a name with none, or out of order: the loops allow for both."""
        while self._failures:
            key, failures = next(iter(self._failures.items()))
            if failures and now - failures[-1] <= FAILURE_WINDOW:
                break
            del self._failures[key]
        for failures in self._failures.values():
            while failures and now - failures[0] > FAILURE_WINDOW:
                failures.popleft()


def files(config: dict) -> tuple[str, dict[str, str]]:
    """The admins files `config` names: the broker's ("": none), and each enabled tenant's (a disabled
    tenant's admins cannot log in, as its clients cannot)."""
    return config["console_admins"], {name: table["console_admins"] for name, table in config["tenants"].items()
                                      if table["enabled"] and table["console_admins"]}


def _read_only(file: PasswordFile | None, user: str) -> bool:
    return file is not None and file.role(user) == "read-only"


def _reloaded(path: str) -> PasswordFile | None:
    try:
        return PasswordFile.load(path)
    except PasswordFileError as exc:
        log.error("console: %s: its admins cannot log in until it is fixed and reloaded", exc)
        return None


def _address(address: str) -> tuple[str, ...]:
    """Whose failed logins an address counts as: its own, or an IPv6 one's /64 (one host may have it all)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return ("address", address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is None:
        return ("address", str(ipaddress.ip_network(f"{ip}/64", strict=False)))
    return ("address", address)


def _cookie(header: str) -> str | None:
    """The console's session token in a Cookie header, or None."""
    for part in header.split(";"):
        name, _, value = part.strip().partition("=")
        if name == COOKIE and value:
            return value
    return None
