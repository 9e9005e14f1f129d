"""Who may connect and what they may touch, decided in the worker that holds the connection.

Why here: authentication runs in every worker, so it scales with them (DESIGN.md). Password hashes
are slow on purpose, so they are checked on a small thread pool (hashlib.scrypt releases the GIL) and
never on the event loop; a check that succeeded is remembered (keyed by a keyed hash of the
password, never the password) so that a fleet reconnecting after an outage does not pay the slow
hash again. Failed logins from one address are answered later and later, so guessing is slow
without costing the worker anything while it waits.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
import time
from concurrent.futures import ThreadPoolExecutor

from workers.acl import AclFile, Checker
from workers.passwords import PasswordFile
from workers.tokens import TokenVerifier

log = logging.getLogger("plexmq.worker")

ACCEPTED, SERVER_UNAVAILABLE, BAD_CREDENTIALS, NOT_AUTHORIZED = 0x00, 0x03, 0x04, 0x05  # CONNACK return codes
HASH_THREADS = 2  # each scrypt check holds 16 MiB while it runs
GOOD_LOGINS_MAX = 100_000  # remembered successful (user, password) pairs; emptied when full
GOOD_LOGIN_SECONDS = 600.0
FAILED_ADDRESSES_MAX = 10_000
FAILURE_DELAY_MAX = 5.0  # seconds: 0.1, 0.2, 0.4 ... after each failure from the same address
FAILURE_MEMORY = 300.0  # seconds after which an address's failures are forgotten


class Auth:
    """The password file and ACL of one worker; `reload` re-reads both (SIGHUP)."""

    def __init__(self, config: dict, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.passwords: PasswordFile | None = None
        self.tokens: TokenVerifier | None = None
        self.acl: AclFile | None = None
        self.pool: ThreadPoolExecutor | None = None
        self._key = secrets.token_bytes(32)
        self._good: dict[tuple[str, bytes], float] = {}
        self._failures: dict[str, tuple[int, float]] = {}  # address -> (failures, last one)
        self.denied = 0  # PUBLISHes the ACL dropped
        self.refused = 0  # logins refused
        self.configure(config)

    def configure(self, config: dict) -> None:
        """Take the files and the anonymous rule from `config` and load them (at start, on SIGHUP)."""
        self.password_path: str = config["password_file"]
        self.acl_path: str = config["acl_file"]
        self.allow_anonymous: bool = config["allow_anonymous"]
        self.jwt = (config["jwt_jwks_file"], config["jwt_audience"], config["jwt_issuer"])
        if self.password_path and self.pool is None:
            self.pool = ThreadPoolExecutor(HASH_THREADS, "plexmq-auth")
        self.reload()

    def reload(self) -> None:
        """Load the files; on an error keep what was loaded before (at start there is nothing to
        keep: the acceptor has loaded them once already, so they were good a moment ago)."""
        try:
            passwords = PasswordFile.load(self.password_path) if self.password_path else None
            tokens = TokenVerifier(*self.jwt) if self.jwt[0] else None
            acl = AclFile.load(self.acl_path) if self.acl_path else None
        except ValueError as exc:
            log.error("keeping the previous authentication settings: %s", exc)
            return
        self.passwords, self.tokens, self.acl = passwords, tokens, acl
        self._good.clear()

    @property
    def required(self) -> bool:
        """Whether a CONNECT must wait for `login` (a password file or token keys make it so)."""
        return self.passwords is not None or self.tokens is not None

    async def login(self, username: str | None, password: bytes | None, address: str) -> tuple[int, str | None]:
        """The CONNACK return code for these credentials and the username the client is known by
        (a token's subject); failures come back after a delay."""
        code, identity = await self._check(username, password)
        if code == ACCEPTED:
            return code, identity
        self.refused += 1
        now = time.monotonic()
        count, last = self._failures.get(address, (0, now))
        count = 1 if now - last > FAILURE_MEMORY else count + 1
        if len(self._failures) >= FAILED_ADDRESSES_MAX:
            self._failures.clear()
        self._failures[address] = (count, now)
        await asyncio.sleep(min(0.1 * 2 ** (count - 1), FAILURE_DELAY_MAX))
        return code, None

    async def _check(self, username: str | None, password: bytes | None) -> tuple[int, str | None]:
        tokens = self.tokens
        if tokens is not None and tokens.looks_like_token(password):
            claims = tokens.verify(password)  # type: ignore[arg-type]  # a signature check: tens of µs
            subject = None if claims is None else str(claims.get("sub", "")) or username
            if claims is None or username and username != subject:  # any name but the token's own
                return BAD_CREDENTIALS, None
            return ACCEPTED, subject
        passwords = self.passwords
        if username is None:
            return (ACCEPTED if self.allow_anonymous else NOT_AUTHORIZED), None
        if passwords is None:
            return BAD_CREDENTIALS, None  # tokens only, and this is not one
        secret = password or b""
        key = (username, hmac.digest(self._key, secret, hashlib.sha256))
        now = time.monotonic()
        if now - self._good.get(key, -GOOD_LOGIN_SECONDS) < GOOD_LOGIN_SECONDS:
            return ACCEPTED, username
        if not await self.loop.run_in_executor(self.pool, passwords.check, username, secret):
            return BAD_CREDENTIALS, None
        if self.passwords is passwords:  # not reloaded meanwhile
            if len(self._good) >= GOOD_LOGINS_MAX:
                self._good.clear()
            self._good[key] = now
        return ACCEPTED, username

    def checker(self, username: str | None, client_id: str) -> Checker | None:
        """The connection's ACL checker; None when there is no ACL (everything allowed)."""
        return None if self.acl is None else self.acl.checker(username, client_id)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
