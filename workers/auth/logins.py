"""Who may connect and what they may touch, decided in the worker that holds the connection.

Why here: authentication runs in every worker, so it scales with them. Password hashes
are slow on purpose, so they are checked on a small thread pool (hashlib.scrypt releases the GIL) and
never on the event loop; a check that succeeded is remembered (keyed by a keyed hash of the
password, never the password) so that a fleet reconnecting after an outage does not pay the slow
hash again. Failed logins from one address are answered later and later, so guessing is slow
without costing the worker anything while it waits. Users and rules in a database
(workers.auth.database) are read on a pool of their own, so a slow database never holds up the hashing,
and a query that takes longer than `auth_database_timeout` answers CONNACK 0x03.

A tenant with logins, an ACL or an anonymous rule of its own has a `TenantAuth` (`Auth.of`): its own
files or database where it has them, the broker's loaded ones (shared, not read twice) where it has not.
A tenant's database is queried on the broker's database pool, with the broker's cache and timeout.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from plexmq.tenants import Tenant, tenant
from plexmq.workers.auth.acl import NO_RULES, AclFile, Checker
from plexmq.workers.auth.database import DatabaseError, UserDatabase
from plexmq.workers.auth.passwords import PasswordFile
from plexmq.workers.auth.tokens import TokenVerifier

log = logging.getLogger("plexmq.worker")

ACCEPTED, SERVER_UNAVAILABLE, BAD_CREDENTIALS, NOT_AUTHORIZED = 0x00, 0x03, 0x04, 0x05  # CONNACK return codes
HASH_THREADS = 2  # each scrypt check holds 16 MiB while it runs
DATABASE_THREADS = 4  # queries wait on the network, not the CPU; each thread keeps a connection
GOOD_LOGINS_MAX = 100_000  # remembered successful (user, password) pairs; emptied when full
GOOD_LOGIN_SECONDS = 600.0
FAILED_ADDRESSES_MAX = 10_000
FAILURE_DELAY_MAX = 5.0  # seconds: 0.1, 0.2, 0.4 ... after each failure from the same address
FAILURE_MEMORY = 300.0  # seconds after which an address's failures are forgotten


class Auth:
    """The password file (or user table) and ACL of one worker; `reload` re-reads both (SIGHUP)."""

    local = False  # whether its logins know tenant-local usernames (a tenant's own): the broker's know them whole
    local_acl = False  # whether its ACL's %u is the tenant-local username (a tenant's own ACL)

    def __init__(self, config: dict, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.passwords: PasswordFile | None = None
        self.tokens: TokenVerifier | None = None
        self.acl: AclFile | None = None
        self.database: UserDatabase | None = None
        self.database_acl: UserDatabase | None = None  # the database whose ACL table applies
        self.tenants: dict[str, TenantAuth] = {}  # those of tenants with logins, an ACL or an anonymous rule of their own
        self.pool: ThreadPoolExecutor | None = None
        self.database_pool: ThreadPoolExecutor | None = None
        self._database_down = False  # an outage is logged when it starts and when it ends
        self._reading: asyncio.Future[None] | None = None  # the ACL table, read for `checker`
        self._judged: AclFile | None = None  # the table's rules that live connections were last given
        self._key = secrets.token_bytes(32)
        self._good: dict[tuple[str, bytes], float] = {}
        self._failures: dict[str, tuple[int, float]] = {}  # address -> (failures, last one)
        self.refused = 0  # logins refused
        self.configure(config)

    def configure(self, config: dict) -> None:
        """Take the files and the anonymous rule from `config` and load them (at start, on SIGHUP)."""
        self.password_path: str = config["password_file"]
        self.acl_path: str = config["acl_file"]
        self.allow_anonymous: bool = config["allow_anonymous"]
        self.jwt = (config["jwt_jwks_file"], config["jwt_audience"], config["jwt_issuer"], config["jwt_username_claim"],
                    config["jwt_tenant_claim"])
        self.disconnect_on_expiry: bool = config["jwt_disconnect_on_expiry"]
        self.database_settings = (config["auth_database"], config["auth_database_cache"],
                                  config["auth_database_timeout"], config["auth_database_acl"],
                                  config["auth_database_tenant_column"])
        declared = [tenant(name, table) for name, table in config["tenants"].items()]
        databases = config["auth_database"] or any(t.auth_database for t in declared)
        if (self.password_path or databases or any(t.password_file for t in declared)) and self.pool is None:
            self.pool = ThreadPoolExecutor(HASH_THREADS, "plexmq-auth")
        if databases and self.database_pool is None:
            self.database_pool = ThreadPoolExecutor(DATABASE_THREADS, "plexmq-authdb")
        self.reload()
        kept, self.tenants = self.tenants, {}
        for found in declared:
            if not (found.own_logins or found.acl_file or found.allow_anonymous is not None):
                continue
            same = kept.get(found.name)
            if same is not None and same.tenant == found:
                same.reload()  # its files, and the broker's it shares, may have changed
            else:
                same = TenantAuth(self, found)
            self.tenants[found.name] = same

    def of(self, name: str) -> Auth:
        """The logins and ACL of tenant `name`'s clients."""
        return self.tenants.get(name, self) if name else self

    def reload(self) -> None:
        """Load the files; on an error keep what was loaded before (at start there is nothing to
        keep: the acceptor has loaded them once already, so they were good a moment ago)."""
        try:
            passwords = PasswordFile.load(self.password_path) if self.password_path else None
            tokens = TokenVerifier(*self.jwt) if self.jwt[0] else None
            acl = AclFile.load(self.acl_path) if self.acl_path else None
            database = UserDatabase(*self.database_settings) if self.database_settings[0] else None
        except ValueError as exc:
            log.error("keeping the previous authentication settings: %s", exc)
            return
        self.passwords, self.tokens, self.acl, self.database = passwords, tokens, acl, database
        self.database_acl = database if database is not None and database.with_acl else None
        self._good.clear()

    @property
    def required(self) -> bool:
        """Whether a CONNECT must wait for `login` (a password file, a database or token keys make it so)."""
        return self.passwords is not None or self.tokens is not None or self.database is not None

    async def login(self, username: str | None, password: bytes | None, address: str) -> tuple[int, str | None, float, str]:
        """The CONNACK return code for these credentials, the username the client is known by (a
        token's subject), when its session must end (0: never) and the tenant the login names (a
        token's jwt_tenant_claim, the user row's auth_database_tenant_column; "": none); failures
        come back after a delay, a database that cannot answer at once."""
        database = self.database_acl or self.database
        try:
            code, identity, expires, named = await self._check(username, password)
            if code == ACCEPTED and self.database_acl is not None:
                await self._ask(self.database_acl, self.database_acl.rules)  # for `checker`, which cannot wait
        except (DatabaseError, TimeoutError) as exc:
            self._unavailable(database, exc)
            return SERVER_UNAVAILABLE, None, 0.0, ""
        if code == ACCEPTED:
            return code, identity, expires, named
        await asyncio.sleep(self.failed(address))
        return code, None, 0.0, ""

    def failed(self, address: str) -> float:
        """Count a refused login from `address` (a password, or a SCRAM exchange); the seconds to
        wait before answering it, longer with each failure from that address."""
        self.refused += 1
        now = time.monotonic()
        count, last = self._failures.get(address, (0, now))
        count = 1 if now - last > FAILURE_MEMORY else count + 1
        if len(self._failures) >= FAILED_ADDRESSES_MAX:
            self._failures.clear()
        self._failures[address] = (count, now)
        return min(0.1 * 2 ** (count - 1), FAILURE_DELAY_MAX)

    async def _check(self, username: str | None, password: bytes | None) -> tuple[int, str | None, float, str]:
        """(code, identity, the time.time() at which the session ends: a token's expiry with
        jwt_disconnect_on_expiry, else 0; the tenant the login names)."""
        tokens = self.tokens
        passwords = self.passwords
        if tokens is not None and tokens.looks_like_token(password):
            verified = tokens.verify(password)  # type: ignore[arg-type]  # a signature check: tens of µs
            if verified is not None:
                subject, expires, named = verified
                if username and username != subject:  # any name but the token's own
                    return BAD_CREDENTIALS, None, 0.0, ""
                return ACCEPTED, subject, expires if self.disconnect_on_expiry else 0.0, named
            if passwords is None and self.database is None:
                return BAD_CREDENTIALS, None, 0.0, ""
            # not a token the keys accept: a password with two dots, checked as any other password
        if username is None:
            return (ACCEPTED if self.allow_anonymous else NOT_AUTHORIZED), None, 0.0, ""
        secret = password or b""
        database = self.database
        if database is not None:
            stored, named = await self._ask(database, database.password_hash, username)
            if not await self.loop.run_in_executor(self.pool, database.check, username, stored, secret):
                return BAD_CREDENTIALS, None, 0.0, ""
            return ACCEPTED, username, 0.0, named
        if passwords is None:
            return BAD_CREDENTIALS, None, 0.0, ""  # tokens only, and this is not one
        key = (username, hmac.digest(self._key, secret, hashlib.sha256))
        now = time.monotonic()
        if now - self._good.get(key, -GOOD_LOGIN_SECONDS) < GOOD_LOGIN_SECONDS:
            return ACCEPTED, username, 0.0, ""
        if not await self.loop.run_in_executor(self.pool, passwords.check, username, secret):
            return BAD_CREDENTIALS, None, 0.0, ""
        if self.passwords is passwords:  # not reloaded meanwhile
            if len(self._good) >= GOOD_LOGINS_MAX:
                self._good.clear()
            self._good[key] = now
        return ACCEPTED, username, 0.0, ""

    async def _ask(self, database: UserDatabase, call: Callable[..., Any], *args: Any) -> Any:
        """`call` on the database pool; TimeoutError when it takes longer than the database's timeout."""
        result = await asyncio.wait_for(self.loop.run_in_executor(self.database_pool, call, *args), database.timeout)
        if self._database_down:
            self._database_down = False
            log.info("the authentication database %s answers again", database.source)
        return result

    def _unavailable(self, database: UserDatabase | None, exc: BaseException) -> None:
        if not self._database_down and database is not None:
            self._database_down = True
            reason = exc if isinstance(exc, DatabaseError) else f"{database.source}: no answer in {database.timeout} s"
            log.error("answering CONNACK 0x03 while the authentication database cannot answer: %s", reason)

    async def _read_rules(self, database: UserDatabase) -> None:
        """Read the ACL table for the next certificate login (those skip `login`, so `checker` had only stale rules)."""
        try:
            await self._ask(database, database.rules)
        except (DatabaseError, TimeoutError) as exc:
            self._unavailable(database, exc)

    def _refresh_rules(self, database: UserDatabase) -> None:
        """Read the ACL table again in the background once it is older than its cache time (one read at a time)."""
        if not database.acl_is_fresh() and (self._reading is None or self._reading.done()):
            self._reading = asyncio.ensure_future(self._read_rules(database))

    def checker(self, username: str | None, client_id: str) -> Checker | None:
        """The connection's ACL checker; None when there is no ACL (everything allowed)."""
        database = self.database_acl
        if database is None:
            return None if self.acl is None else self.acl.checker(username, client_id)
        self._refresh_rules(database)
        acl = database.acl  # None before they were read once: nothing is allowed
        return Checker(NO_RULES) if acl is None else acl.checker(username, client_id)

    def rules_changed(self) -> bool:
        """Whether the database's ACL table, or a tenant's own, has other rules than live connections were
        given (once a second: the table is read again when older than auth_database_cache), so that a
        changed row takes effect for them too, not only for the next login."""
        changed = self._table_changed()
        for auth in self.tenants.values():
            if auth.tenant.auth_database_acl:
                changed = auth._table_changed() or changed  # each asked: each remembers what it judged
        return changed

    def _table_changed(self) -> bool:
        database = self.database_acl
        if database is None:
            return False
        self._refresh_rules(database)
        acl, judged = database.acl, self._judged
        if acl is None or acl is judged:
            return False
        self._judged = acl
        return judged is None or not acl.same_rules(judged)

    def close(self) -> None:
        for pool in (self.pool, self.database_pool):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)


class TenantAuth(Auth):
    """A tenant's logins, ACL and anonymous rule: its own where its table sets them (`local`: its logins
    know the tenant-local usernames; its ACL's %u is one), else the broker's (`broker`) as loaded there.
    The broker's pools and its count of failures from each address serve it too."""

    def __init__(self, broker: Auth, found: Tenant) -> None:
        self.broker = broker
        self.tenant = found
        self.local = found.own_logins
        self.local_acl = bool(found.acl_file or found.auth_database_acl)
        self.loop = broker.loop
        self.pool, self.database_pool = broker.pool, broker.database_pool
        self.passwords, self.tokens, self.acl, self.database, self.database_acl = None, None, None, None, None
        self.allow_anonymous = False
        self.tenants = {}
        self._database_down = False
        self._reading = None
        self._judged = None
        self._key = broker._key
        self._good = {}
        self.reload()

    @property
    def required(self) -> bool:
        return self.local or self.broker.required  # own logins that could not be read refuse every login

    def reload(self) -> None:
        """Load its own files, take the broker's loaded ones (called again after each broker reload)."""
        found, broker = self.tenant, self.broker
        try:
            passwords = PasswordFile.load(found.password_file) if found.password_file else None
            tokens = (TokenVerifier(found.jwt_jwks_file, found.jwt_audience, found.jwt_issuer, *broker.jwt[3:])
                      if found.jwt_jwks_file else None)
            acl = AclFile.load(found.acl_file) if found.acl_file else broker.acl
            database = (UserDatabase(found.auth_database, *broker.database_settings[1:3], found.auth_database_acl)
                        if found.auth_database else None)
        except ValueError as exc:
            log.error("tenant %s: keeping the previous authentication settings: %s", found.name, exc)
            return
        if self.local:
            self.passwords, self.tokens, self.database = passwords, tokens, database
        else:
            self.passwords, self.tokens, self.database = broker.passwords, broker.tokens, broker.database
        self.acl = acl
        self.database_acl = database if found.auth_database_acl else None if self.local_acl else broker.database_acl
        self.allow_anonymous = broker.allow_anonymous if found.allow_anonymous is None else found.allow_anonymous
        self.disconnect_on_expiry = broker.disconnect_on_expiry
        self._good.clear()

    def failed(self, address: str) -> float:
        return self.broker.failed(address)  # one count per address, whichever tenant it tried

    def close(self) -> None:
        """Its pools are the broker's, closed there."""
