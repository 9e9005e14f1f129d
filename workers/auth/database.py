"""Users and ACL rules in a MySQL or MariaDB database (`auth_database`), for fleets whose accounts
are managed there rather than in files.

Why this shape: a worker must never wait on the database, so every query runs on a thread of the
worker's pool (workers.auth.logins) under connect and read timeouts, and the worker gives up waiting after
`auth_database_timeout`: a database that is down or slow costs a client CONNACK 0x03, never the
worker its event loop. Answers are cached for `auth_database_cache` seconds, so a reconnecting
fleet does not query once per client and a change in the tables takes effect within that time. A
row's password hash has the password file's format and is checked by workers.auth.passwords; the ACL
rows are the ACL file's lines and are read by workers.auth.acl, so both sources mean the same. The
tables are described in README.md (Securing plexmq).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import secrets
import threading
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from plexmq.workers.auth import passwords
from plexmq.workers.auth.acl import AclBuilder, AclFile

if TYPE_CHECKING:  # pymysql itself is imported by the first query: ~25 ms of every worker's start otherwise
    import pymysql

USERS, ACL = "plexmq_users", "plexmq_acl"
CACHED_MAX = 100_000  # cached users and remembered good passwords; emptied when full
URL_FORM = "mysql://user:password@host:3306/database"
# what the password of a user without a row is checked against, so that timing does not tell which
# names exist (an all-zero hash: no password derives it)
_NOBODY = (f"$scrypt$n={passwords.SCRYPT_N},r={passwords.SCRYPT_R},p={passwords.SCRYPT_P}"
           f"${base64.b64encode(bytes(passwords.SALT_BYTES)).decode()}"
           f"${base64.b64encode(bytes(passwords.HASH_BYTES)).decode()}")


class DatabaseError(Exception):
    """The database cannot answer (down, refused, a missing table) or holds a row that is no rule or hash."""


def connect_args(url: str) -> dict[str, Any]:
    """pymysql.connect's arguments for `url`; ValueError (which never repeats the password) when it is no such URL."""
    parts = urlsplit(url)
    try:
        port = parts.port or 3306
    except ValueError:
        port = 0
    database = unquote(parts.path[1:])
    if (parts.scheme not in ("mysql", "mariadb") or not parts.hostname or not parts.username or not port
            or not database or "/" in database or parts.query or parts.fragment):
        raise ValueError(f"must be a URL like {URL_FORM} (special characters percent-encoded)")
    return {"host": parts.hostname, "port": port, "user": unquote(parts.username),
            "password": unquote(parts.password or ""), "database": database}


def _rows(connection: pymysql.connections.Connection, sql: str, args: tuple[Any, ...] | None) -> tuple[Any, ...]:
    with connection.cursor() as cursor:
        cursor.execute(sql, args)
        return cursor.fetchall()


class UserDatabase:
    """One worker's view of the tables. `password_hash`, `check` and `rules` block: call them on a thread pool."""

    def __init__(self, url: str, cache_seconds: float, timeout: float, with_acl: bool, tenant_column: str = "") -> None:
        args = connect_args(url)
        self.source = f"{urlsplit(url).scheme}://{args['user']}@{args['host']}:{args['port']}/{args['database']}"
        self.cache_seconds = cache_seconds
        self.timeout = timeout
        self.with_acl = with_acl
        # auth_database_tenant_column (checked to be a plain column name): the user's tenant, "" none
        self._select = f"SELECT username, password_hash, {tenant_column or 'NULL'} FROM {USERS} WHERE username = %s"
        # autocommit: a kept connection inside one transaction would read the same snapshot forever
        self._connect = {**args, "connect_timeout": timeout, "read_timeout": timeout, "write_timeout": timeout,
                         "autocommit": True, "charset": "utf8mb4"}
        self._local = threading.local()  # one connection per thread: a pymysql connection is not thread-safe
        self._users: dict[str, tuple[str | None, str, float]] = {}  # user -> (hash or None, tenant, when it was read)
        self._key = secrets.token_bytes(32)
        self._good: set[bytes] = set()  # keyed hashes of (hash, password) pairs that matched
        self.acl: AclFile | None = None  # the rules read last
        self._acl_read = -math.inf

    def password_hash(self, username: str) -> tuple[str | None, str]:
        """The user's stored hash (None when the user has no row) and the tenant its row names ("": none); cached."""
        now = time.monotonic()
        cached = self._users.get(username)
        if cached is not None and now - cached[2] < self.cache_seconds:
            return cached[0], cached[1]
        rows = self._query(self._select, (username,))
        # compared here too: the column's collation may ignore case or trailing spaces
        stored, tenant = next(((h, t or "") for name, h, t in rows if name == username), (None, ""))
        if len(self._users) >= CACHED_MAX:
            self._users.clear()
        self._users[username] = (stored, tenant, now)
        return stored, tenant

    def check(self, username: str, stored: str | None, password: bytes) -> bool:
        """True when `password` is the one `stored` (from `password_hash`) was made from. Slow (the
        hash), unless the same pair matched before: a password change makes a new hash."""
        key = hmac.digest(self._key, (stored or "").encode() + b"\0" + password, hashlib.sha256)
        if stored is not None and key in self._good:
            return True
        try:
            if not passwords.verify(stored or _NOBODY, password) or stored is None:
                return False
        except ValueError as exc:
            raise DatabaseError(f"{self.source} {USERS}: the password_hash of {username!r}: {exc}") from None
        if len(self._good) >= CACHED_MAX:
            self._good.clear()
        self._good.add(key)
        return True

    def acl_is_fresh(self) -> bool:
        return time.monotonic() - self._acl_read < self.cache_seconds

    def rules(self) -> AclFile:
        """The ACL table's rules, read again when older than the cache time. A bad row is an error,
        not a rule left out: leaving out a deny row would allow what it denies."""
        now = time.monotonic()
        if self.acl is not None and now - self._acl_read < self.cache_seconds:
            return self.acl
        builder = AclBuilder()
        rows = self._query(f"SELECT id, kind, name, access, topic FROM {ACL} ORDER BY id")
        for row_id, kind, name, access, topic in rows:
            try:
                builder.add(kind, name or "", access, topic)
            except ValueError as exc:
                raise DatabaseError(f"{self.source} {ACL} row id {row_id}: {exc}") from None
        self.acl, self._acl_read = builder.build(f"{self.source} {ACL}"), now
        return self.acl

    def _query(self, sql: str, args: tuple[Any, ...] | None = None) -> tuple[Any, ...]:
        """The rows of one query on this thread's connection, made again once when the one kept has
        gone away (servers close idle connections)."""
        import pymysql

        kept: pymysql.connections.Connection | None = getattr(self._local, "connection", None)
        try:
            if kept is not None:
                try:
                    return _rows(kept, sql, args)
                except (pymysql.OperationalError, pymysql.InterfaceError):
                    self._local.connection = None
            self._local.connection = pymysql.connect(**self._connect)
            return _rows(self._local.connection, sql, args)
        except (pymysql.Error, OSError) as exc:
            raise DatabaseError(f"{self.source}: {exc}") from None

