"""The password file: one `username:hash` line per user, with salted, deliberately slow hashes.

Lines written here look like `alice:$scrypt$n=16384,r=8,p=1$<salt>$<hash>` (standard base64), so
each line carries its own cost parameters and old lines keep working when the default changes.
PBKDF2-SHA512 lines, `$pbkdf2-sha512$<iterations>$<salt>$<hash>`, are accepted too, and so is
mosquitto's `$7$` spelling of the same thing, so a file made by `mosquitto_passwd` loads as it is.
Blank lines and lines starting with `#` are ignored. The hash never contains `:`, so a user name may.

Lines written here also carry, after the hash and one space, the user's SCRAM-SHA-256 keys for MQTT 5.0
enhanced authentication: `$scram-sha-256$<iterations>$<salt>$<stored key>$<server key>`. A hash
cannot give them (SCRAM needs PBKDF2-SHA256 of the password), so they are made when the password is
set; a line without them (older plexmq, mosquitto_passwd) still logs in with a password, not with
SCRAM. They are PBKDF2-SHA256 at `SCRAM_ITERATIONS`: cheaper to guess against than the scrypt hash,
so the file stays as private as ever.

A line may end with ` role=read-only` (after the hash and the SCRAM keys): a web console admin who may
look at every page but act on nothing (router/console/auth.py). It is the one role there is; a line
without it is a full admin's. MQTT logins do not read it. `plexmq passwd --role` sets it, and a new
password keeps the role the line had.

Checking a password costs tens of milliseconds of CPU on purpose. The worker calls `check` through
`loop.run_in_executor`: hashlib.scrypt and hashlib.pbkdf2_hmac release the GIL, so the event loop
keeps serving the other connections meanwhile.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import secrets
import tempfile
from dataclasses import dataclass
from typing import NamedTuple

import scramp

SCRYPT_N = 2 ** 14
SCRYPT_R = 8
SCRYPT_P = 1
SALT_BYTES = 16
HASH_BYTES = 32
MAX_SCRYPT_MEMORY = 1 << 30  # a line that asks for more is refused when the file is read
MAX_FIELD_BYTES = 65535  # an MQTT string or binary field cannot be longer
# RFC 7677's minimum (and scramp's, PostgreSQL's and Kafka's default): each SCRAM client computes
# this many PBKDF2 rounds at every login, the broker none
SCRAM_ITERATIONS = 4096
SCRAM_MAX_ITERATIONS = 10_000_000  # scramp refuses more
SCRAM_MIN_SALT = 12  # bytes; scramp refuses less
SCRAM_KEY_BYTES = 32  # SHA-256
ROLES = ("admin", "read-only")  # "admin": no role on the line
_NUMBER = re.compile(r"[0-9]{1,10}")
_SCRAM = scramp.ScramMechanism("SCRAM-SHA-256")


class PasswordFileError(ValueError):
    """One line that says what is wrong and where: `file:line: reason`."""


@dataclass(frozen=True, slots=True)
class _Hash:
    """A parsed hash: `params` is (n, r, p) for scrypt and (iterations,) for PBKDF2-SHA512."""

    scheme: str
    params: tuple[int, ...]
    salt: bytes
    digest: bytes

    def derive(self, password: bytes) -> bytes:
        if self.scheme == "scrypt":
            n, r, p = self.params
            # OpenSSL needs 128 * r * (n + p + 2) bytes; its default cap (32 MiB) would refuse n = 2**15
            return hashlib.scrypt(password, salt=self.salt, n=n, r=r, p=p, dklen=len(self.digest),
                                  maxmem=128 * r * (n + p + 2) + (1 << 20))
        return hashlib.pbkdf2_hmac("sha512", password, self.salt, self.params[0], len(self.digest))

    def matches(self, password: bytes) -> bool:
        return hmac.compare_digest(self.derive(password), self.digest)


class ScramKeys(NamedTuple):
    """What the server side of SCRAM-SHA-256 knows of a user (scramp's auth_fn answer); the password
    cannot be read back from it, only guessed."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


def _scrypt_params_error(n: int, r: int, p: int) -> str | None:
    if n < 2 or n & (n - 1):
        return "scrypt n must be a power of two, at least 2"
    if not 1 <= r <= 64 or not 1 <= p <= 64:
        return "scrypt r and p must be between 1 and 64"
    if 128 * r * (n + p + 2) > MAX_SCRYPT_MEMORY:
        return "scrypt parameters need more than 1 GiB of memory"
    return None


def _b64(text: str, what: str) -> bytes:
    try:
        value = base64.b64decode(text, validate=True)
    except binascii.Error:
        raise ValueError(f"{what} is not valid base64") from None
    if not value:
        raise ValueError(f"empty {what}")
    return value


def _parse(stored: str) -> _Hash:
    """The hash in `stored`; a ValueError says why it is not one."""
    fields = stored.split("$")
    if len(fields) < 2 or fields[0]:
        raise ValueError("not a hash of the form $scheme$params$salt$hash")
    if fields[1] not in ("scrypt", "pbkdf2-sha512", "7"):
        raise ValueError(f"unknown hash scheme {fields[1]!r} (scrypt, pbkdf2-sha512 or 7)")
    if len(fields) != 5:
        raise ValueError(f"not a hash of the form ${fields[1]}$params$salt$hash")
    _, scheme, params, salt_text, digest_text = fields
    numbers: tuple[int, ...]
    if scheme == "scrypt":
        values = dict(item.partition("=")[::2] for item in params.split(","))
        if params.count(",") != 2 or sorted(values) != ["n", "p", "r"] or not all(map(_NUMBER.fullmatch, values.values())):
            raise ValueError(f"scrypt parameters must be n=N,r=R,p=P, got {params!r}")
        numbers = (int(values["n"]), int(values["r"]), int(values["p"]))
        error = _scrypt_params_error(*numbers)
        if error:
            raise ValueError(error)
    else:  # "7" is mosquitto_passwd's name for PBKDF2-SHA512
        if not _NUMBER.fullmatch(params) or int(params) < 1:
            raise ValueError(f"PBKDF2 iterations must be a positive integer, got {params!r}")
        scheme, numbers = "pbkdf2-sha512", (int(params),)
    digest = _b64(digest_text, "hash")
    if len(digest) < 16:
        raise ValueError("hash shorter than 16 bytes")
    return _Hash(scheme, numbers, _b64(salt_text, "salt"), digest)


def _parse_scram(stored: str) -> ScramKeys:
    """The SCRAM keys in `stored`; a ValueError says why they are not."""
    fields = stored.split("$")
    if len(fields) != 6 or fields[0] or fields[1] != "scram-sha-256":
        raise ValueError("SCRAM keys not of the form $scram-sha-256$iterations$salt$storedkey$serverkey")
    _, _, iterations, salt_text, stored_text, server_text = fields
    if not _NUMBER.fullmatch(iterations) or not SCRAM_ITERATIONS <= int(iterations) <= SCRAM_MAX_ITERATIONS:
        raise ValueError(f"SCRAM iterations must be between {SCRAM_ITERATIONS} and {SCRAM_MAX_ITERATIONS}, "
                         f"got {iterations!r}")
    salt = _b64(salt_text, "SCRAM salt")
    if len(salt) < SCRAM_MIN_SALT:
        raise ValueError(f"SCRAM salt shorter than {SCRAM_MIN_SALT} bytes")
    keys = _b64(stored_text, "SCRAM stored key"), _b64(server_text, "SCRAM server key")
    if any(len(key) != SCRAM_KEY_BYTES for key in keys):
        raise ValueError(f"SCRAM keys must be {SCRAM_KEY_BYTES} bytes each")
    return ScramKeys(salt, *keys, int(iterations))


def _parse_entry(stored: str) -> tuple[_Hash, ScramKeys | None, str]:
    """What follows `user:` on a line: the hash, the SCRAM keys when a space and they follow it, and the
    role (" role=NAME" at the end; "admin" without)."""
    entry, marker, role = stored.partition(" role=")
    if marker and role.strip() not in ROLES[1:]:
        raise ValueError(f"unknown role {role.strip()!r} (the one role a line may name is read-only)")
    hashed, scheme, scram = entry.rstrip().partition(" $scram-")
    return _parse(hashed), _parse_scram(scheme.lstrip() + scram) if scheme else None, role.strip() or ROLES[0]


def _bytes(password: str | bytes) -> bytes:
    return password.encode() if isinstance(password, str) else password


def hash_password(password: str | bytes, *, n: int = SCRYPT_N, r: int = SCRYPT_R, p: int = SCRYPT_P) -> str:
    """A new salted scrypt hash of `password`; tests pass a small `n` to stay fast."""
    error = _scrypt_params_error(n, r, p)
    if error:
        raise ValueError(error)
    h = _Hash("scrypt", (n, r, p), secrets.token_bytes(SALT_BYTES), b"\0" * HASH_BYTES)
    digest = h.derive(_bytes(password))
    return (f"$scrypt$n={n},r={r},p={p}${base64.b64encode(h.salt).decode()}"
            f"${base64.b64encode(digest).decode()}")


def scram_entry(password: str | bytes) -> str | None:
    """New SCRAM-SHA-256 keys of `password` as a line stores them; None for a password SCRAM cannot
    carry (not UTF-8, or refused by SASLprep)."""
    try:
        text = password if isinstance(password, str) else password.decode()
        salt, stored_key, server_key, iterations = _SCRAM.make_auth_info(
            text, SCRAM_ITERATIONS, secrets.token_bytes(SALT_BYTES))
    except (UnicodeDecodeError, scramp.ScramException):
        return None
    return "$".join(("", "scram-sha-256", str(iterations),
                     *(base64.b64encode(value).decode() for value in (salt, stored_key, server_key))))


def verify(stored: str, password: str | bytes) -> bool:
    """True when `password` hashes to `stored` (any accepted scheme, SCRAM keys after it or not);
    ValueError when `stored` is no hash."""
    return _parse_entry(stored)[0].matches(_bytes(password))


def username_error(username: str) -> str | None:
    """Why `username` cannot have a line in the file, or None when it can."""
    if not username:
        return "empty user name"
    if any(c in username for c in "\n\r\0"):
        return "user name contains a line break or U+0000"
    if username.startswith("#"):
        return "user name starts with '#' (a comment in the file)"
    if len(username.encode()) > MAX_FIELD_BYTES:
        return f"user name longer than {MAX_FIELD_BYTES} bytes"
    return None


# one entry per line of the file: (line as read, user name or None for a blank or comment line)
_Lines = list[tuple[str, str | None]]


def _read(path: str, missing_ok: bool) -> tuple[_Lines, dict[str, _Hash], dict[str, ScramKeys], dict[str, str]]:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        if missing_ok:
            return [], {}, {}, {}
        raise PasswordFileError(f"{path}: no such file") from None
    except OSError as exc:
        raise PasswordFileError(f"{path}: {exc.strerror}") from None
    lines: _Lines = []
    users: dict[str, _Hash] = {}
    scram: dict[str, ScramKeys] = {}
    roles: dict[str, str] = {}  # the users with a role other than "admin"
    first_line: dict[str, int] = {}
    for number, data in enumerate(raw.splitlines(), 1):
        try:
            line = data.decode()
        except UnicodeDecodeError:
            raise PasswordFileError(f"{path}:{number}: not UTF-8") from None
        if not line.strip() or line.startswith("#"):
            lines.append((line, None))
            continue
        username, sep, stored = line.rpartition(":")
        try:
            if not sep:
                raise ValueError("expected username:hash")
            error = username_error(username)
            if error:
                raise ValueError(error)
            if username in users:
                raise ValueError(f"user {username!r} again (first on line {first_line[username]})")
            users[username], keys, role = _parse_entry(stored.strip())
            if keys is not None:
                scram[username] = keys
            if role != ROLES[0]:
                roles[username] = role
        except ValueError as exc:
            raise PasswordFileError(f"{path}:{number}: {exc}") from None
        first_line[username] = number
        lines.append((line, username))
    return lines, users, scram, roles


def _write(path: str, lines: _Lines) -> None:
    """Replace the file in one step: a reader sees the old file or the new one, never half of one."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, temp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")  # mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.writelines(line + "\n" for line, _user in lines)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        os.unlink(temp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash
    finally:
        os.close(dir_fd)


def set_password(path: str, username: str, password: str | bytes, *, n: int = SCRYPT_N, role: str | None = None) -> bool:
    """Add `username` or change its password (creating the file when missing); True when it is new.
    `role` (ROLES) replaces the line's; None keeps it (a new user's: "admin", none on the line).

    The other lines, comments included, are kept as they are. PasswordFileError when the file is
    malformed, ValueError when the user name or password cannot be stored.
    """
    error = username_error(username)
    if error:
        raise ValueError(error)
    if len(_bytes(password)) > MAX_FIELD_BYTES:
        raise ValueError(f"password longer than {MAX_FIELD_BYTES} bytes")
    if role is not None and role not in ROLES:
        raise ValueError(f"unknown role {role!r} ({' or '.join(ROLES)})")
    lines, users, _scram, roles = _read(path, missing_ok=True)
    role = roles.get(username, ROLES[0]) if role is None else role
    scram = scram_entry(password)
    line = f"{username}:{hash_password(password, n=n)}" + (f" {scram}" if scram else "") + \
        (f" role={role}" if role != ROLES[0] else "")
    if username in users:
        lines = [(line, user) if user == username else (old, user) for old, user in lines]
    else:
        lines.append((line, username))
    _write(path, lines)
    return username not in users


def delete_user(path: str, username: str) -> bool:
    """Remove `username` from the file; False (and nothing written) when it has no line there."""
    lines, users, _scram, _roles = _read(path, missing_ok=False)
    if username not in users:
        return False
    _write(path, [(line, user) for line, user in lines if user != username])
    return True


class PasswordFile:
    """The users of one password file, parsed once; `load` again (on SIGHUP) to pick up changes."""

    __slots__ = ("path", "_users", "_scram", "_roles", "_dummy", "_decoy_key")

    def __init__(self, path: str, users: dict[str, _Hash], scram: dict[str, ScramKeys], secret: bytes,
                 roles: dict[str, str] | None = None) -> None:
        """`secret`: known only to whoever can read the file; it makes the decoy SCRAM salts."""
        self.path = path
        self._users = users
        self._scram = scram
        self._roles = roles or {}
        # an unknown user costs one hash like the file's own, so timing does not tell which names exist
        model = next(iter(users.values()), None)
        if model is None:
            model = _Hash("scrypt", (SCRYPT_N, SCRYPT_R, SCRYPT_P), b"", b"\0" * HASH_BYTES)
        self._dummy = _Hash(model.scheme, model.params, secrets.token_bytes(len(model.salt) or SALT_BYTES),
                            secrets.token_bytes(len(model.digest)))
        self._decoy_key = secret

    @classmethod
    def load(cls, path: str) -> PasswordFile:
        """Read and check every line; PasswordFileError (`file:line: reason`) for the first bad one."""
        lines, users, scram, roles = _read(path, missing_ok=False)
        return cls(path, users, scram, hashlib.sha256("\n".join(line for line, _user in lines).encode()).digest(), roles)

    def __len__(self) -> int:
        return len(self._users)

    def __contains__(self, username: object) -> bool:
        return username in self._users

    def check(self, username: str, password: str | bytes) -> bool:
        """True when the user exists and the password is theirs. Slow: call it off the event loop."""
        stored = self._users.get(username)
        if stored is None:
            self._dummy.matches(_bytes(password))
            return False
        return stored.matches(_bytes(password))

    def role(self, username: str) -> str:
        """The user's role (ROLES): "read-only" when its line says so, else "admin"."""
        return self._roles.get(username, ROLES[0])

    def has_scram_keys(self, username: str) -> bool:
        return username in self._scram

    def scram_keys(self, username: str) -> ScramKeys:
        """The user's SCRAM keys; for a user without any (unknown, or its line has none) keys that no
        password matches, with a salt that is the same for that name in every worker and at every
        try, so that the exchange does not tell which names exist. Fast: no hashing of a password."""
        keys = self._scram.get(username)
        if keys is not None:
            return keys
        salt = hmac.digest(self._decoy_key, username.encode(), "sha256")[:SALT_BYTES]
        return ScramKeys(salt, secrets.token_bytes(SCRAM_KEY_BYTES), secrets.token_bytes(SCRAM_KEY_BYTES),
                         SCRAM_ITERATIONS)
