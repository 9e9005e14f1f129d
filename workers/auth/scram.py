"""SCRAM-SHA-256 (RFC 5802, RFC 7677), the server side of one MQTT 5.0 enhanced authentication
exchange, over scramp: SCRAM is not written here, only carried. client-first in, server-first out;
client-final in, server-final out. The client pays the PBKDF2 and the broker only a few HMACs, so
each step runs on the event loop."""

from __future__ import annotations

from collections.abc import Callable

import scramp
from scramp.utils import ServerError

METHOD = "SCRAM-SHA-256"  # the MQTT Authentication Method, as IANA names the SASL mechanism
_MECHANISM = scramp.ScramMechanism(METHOD)

# a user name -> (salt, stored key, server key, iterations); keys that match no password for a
# user that has none, so that an unknown name fails as a wrong password does, at the proof
KeyLookup = Callable[[str], tuple[bytes, bytes, bytes, int]]


class Failed(Exception):
    """The exchange cannot succeed. `bad_proof`: the messages were fine but the proof was wrong (a
    wrong password or an unknown user); else a message was not SCRAM."""

    def __init__(self, reason: str, bad_proof: bool) -> None:
        super().__init__(reason)
        self.bad_proof = bad_proof


class Exchange:
    """One conversation; `username` is the SCRAM user once client-first has been read."""

    __slots__ = ("_server", "_names")

    def __init__(self, keys: KeyLookup) -> None:
        names: list[str] = []  # the lookup records the name it was asked for (no cycle through self)

        def lookup(username: str) -> tuple[bytes, bytes, bytes, int]:
            names.append(username)
            return keys(username)

        self._server = _MECHANISM.make_server(lookup)
        self._names = names

    @property
    def username(self) -> str:
        return self._names[0] if self._names else ""

    def first(self, client_first: bytes) -> bytes:
        """server-first for the client's first message; Failed when it is not one."""
        try:
            self._server.set_client_first(client_first.decode())
            return self._server.get_server_first().encode()
        except (UnicodeDecodeError, scramp.ScramException) as exc:
            raise Failed(f"SCRAM client-first refused: {exc}", False) from None

    def final(self, client_final: bytes) -> bytes:
        """server-final (the server's signature, which proves the broker knew the keys) for the
        client's final message; Failed when its proof is wrong or it is not one."""
        try:
            self._server.set_client_final(client_final.decode())
            return self._server.get_server_final().encode()
        except (UnicodeDecodeError, scramp.ScramException) as exc:
            bad_proof = isinstance(exc, scramp.ScramException) and exc.server_error is ServerError.INVALID_PROOF
            raise Failed("wrong password or unknown user" if bad_proof else f"SCRAM client-final refused: {exc}",
                         bad_proof) from None
