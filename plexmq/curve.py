"""The two ends of a CURVE-encrypted ZeroMQ link between hosts: a router's link with its nodes, and
the direct links between nodes' workers (workers/peers.py). Both use the key pairs a router and its
nodes share (`plexmq keys`, router_curve_dir): the server pair for the bound end, the client pair for
the connecting end, and the bound end lets in only the client key."""

from __future__ import annotations

from types import SimpleNamespace

import zmq
from zmq.auth.thread import ThreadAuthenticator


def server(ctx: zmq.Context, sock: zmq.Socket, keys: dict[str, str]) -> ThreadAuthenticator:
    """Make `sock` (not yet bound) the server end, open only to the client key, which a ZAP handler (a
    thread on `ctx`, stopped by the caller) checks: without one ZeroMQ lets any client key in."""
    auth = ThreadAuthenticator(ctx)
    auth.start()
    allowed = keys["client_public"].encode()
    auth.configure_curve_callback("*", SimpleNamespace(callback=lambda _domain, key: key == allowed))
    sock.setsockopt(zmq.IPV6, 1)  # tcp://[::1]:port needs it; IPv4 works as before
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys["server_secret"].encode())
    return auth


def client(sock: zmq.Socket, keys: dict[str, str]) -> None:
    """Make `sock` (not yet connected) the client end, which knows the server's public key."""
    sock.setsockopt(zmq.IPV6, 1)
    sock.setsockopt(zmq.CURVE_SERVERKEY, keys["server_public"].encode())
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys["client_public"].encode())
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys["client_secret"].encode())
