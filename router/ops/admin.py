"""The admin credential of the broker's HTTP endpoint: who may list and disconnect clients
(`/clients`, `POST /clients/disconnect`), apart from who may read `/metrics` and `/health` (anyone
who reaches the port, as Prometheus does).

At each start the router writes a random token to `RUN_DIR/admin-PORT.token` (mode 0600 in the 0700
run dir), so only the broker's user (and root) can read it; an admin request carries it as
`Authorization: Bearer TOKEN`. A request must also name this endpoint in its `Host` (a DNS-rebound
name reaches us under the attacker's name) and carry no foreign `Origin`, and one that changes
something must be JSON (a browser's cross-site form POST is neither). `plexmq clients` finds the
token among this user's running routers (`find`). Every admin request is logged with its requester.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
from urllib.parse import urlsplit

from plexmq.process import own_run_dirs

log = logging.getLogger("plexmq.router")

Refusal = tuple[str, str]  # (HTTP status line, why), logged and answered


def token_path(run_dir: str, port: int) -> str:
    return os.path.join(run_dir, f"admin-{port}.token")


def issue(run_dir: str, port: int) -> str:
    """A fresh token for the endpoint on `port`, written 0600 whatever the umask (replaced whole, so
    a reader never sees half of one); the token."""
    token = secrets.token_urlsafe(32)
    path = token_path(run_dir, port)
    part = path + ".part"
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, 0o600)  # a .part left by a crash may have had another mode
        f.write(token + "\n")
    os.replace(part, path)
    return token


def read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def find(port: int) -> list[str]:
    """The token files of this user's running routers for an endpoint on `port`."""
    paths = (token_path(run_dir, port) for run_dir in own_run_dirs("plexmq.router"))
    return [path for path in paths if os.path.exists(path)]


class Names:
    """Whether a request names the endpoint on `port` (bound to `host`) as its own: a DNS-rebound name
    reaches us under the attacker's name, and a page of another origin says so in `Origin`. Shared by
    the admin requests and the web console (router/console/app.py)."""

    def __init__(self, host: str, port: int, scheme: str = "http") -> None:
        self._names = {"localhost", host.lower()}
        self._port = port
        self._origin = f"{scheme}://"  # an Origin of ours starts so (the console may serve https)

    def refusal(self, environ: dict) -> Refusal | None:
        """Why this request is not one of ours (Host, Origin), or None."""
        local = environ.get("SERVER_ADDR", "")
        if not self._ours(environ.get("HTTP_HOST", ""), local):
            return "421 Misdirected Request", f"Host {environ.get('HTTP_HOST', '(none)')!r} is not this endpoint"
        origin = environ.get("HTTP_ORIGIN")
        if origin is not None and not (origin.startswith(self._origin) and self._ours(origin[len(self._origin):], local)):
            return "403 Forbidden", f"Origin {origin!r} is not this endpoint"
        return None

    def _ours(self, authority: str, local: str) -> bool:
        """`authority` (HOST:PORT) names this endpoint: its port, and localhost, the configured
        host or the address the request came in on."""
        try:
            parts = urlsplit(f"//{authority}")
            name, port = parts.hostname, parts.port
        except ValueError:
            return False
        return port == self._port and name is not None and (name in self._names or name == local)


class Gate(Names):
    """Admits or refuses each admin request to the endpoint on `port` (bound to `host`) and logs it."""

    def __init__(self, token: str, host: str, port: int) -> None:
        super().__init__(host, port)
        self._token = token.encode()

    def refusal(self, environ: dict) -> Refusal | None:
        """Why this request may not act, or None. Checked without the token first, so a request a
        browser was made to send is refused whatever it guessed."""
        misdirected = super().refusal(environ)
        if misdirected is not None:
            return misdirected
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD") and \
                environ.get("CONTENT_TYPE", "").split(";")[0].strip().lower() != "application/json":
            return "415 Unsupported Media Type", "a request that acts must be application/json"
        scheme, _, given = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self._token):
            return "401 Unauthorized", "no valid admin token"
        return None

    @staticmethod
    def record(environ: dict, outcome: str) -> None:
        """One line per admin request: the requester, what it asked, what came of it."""
        query = environ.get("QUERY_STRING")
        log.info("admin request from %s:%s: %s %s%s: %s", environ.get("REMOTE_ADDR"), environ.get("REMOTE_PORT"),
                 environ.get("REQUEST_METHOD"), environ.get("PATH_INFO"), f"?{query}" if query else "", outcome)
