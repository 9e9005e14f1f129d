"""Bridges to other brokers (`[bridges.NAME]`): one child process of the acceptor, `plexmq-bridge`,
runs them all. Each bridge is an MQTT client of both brokers, as mosquitto's are: of the remote one,
and of this broker's own listener on loopback, where it logs in with a token the acceptor makes at
each start (and a reload, for a bridge it adds) and hands over in the private run dir's config.json
(`prepare`, `logins`); the workers take that token for the bridge's client id alone, and put the
connection in the bridge's tenant."""

from __future__ import annotations

import secrets
import socket
from typing import Any

from plexmq.bridge_status import local_client_id

ANY = {"0.0.0.0": "127.0.0.1", "::": "::1"}  # a listener on every address is reached on loopback


def prepare(config: dict[str, Any], listener: socket.socket) -> None:
    """Where the bridges (those of now and those a reload adds) reach this broker (its plain listener,
    bound) and a new token for each."""
    host, port = listener.getsockname()[:2]
    config["bridge_local"] = [ANY.get(host, host), port]
    config["bridge_logins"] = logins(config["bridges"], {})


def logins(bridges: dict[str, Any], before: dict[str, list[str]]) -> dict[str, list[str]]:
    """The local client id of each bridge -> [its token, its tenant]: the token of `before` for a bridge
    it has (a reload: the running bridge still logs in), a new one for the others."""
    return {client_id: [before.get(client_id, [secrets.token_urlsafe(32)])[0], bridge["tenant"]]
            for client_id, bridge in ((local_client_id(name), bridge) for name, bridge in bridges.items())}
