"""The metrics endpoint's HTTP server holds the router's threads and descriptors to fixed bounds:
idle connections cost no thread, are closed after the read timeout, are never more than the cap,
and /health answers through a crowd of them."""

from __future__ import annotations

import selectors
import socket
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import psutil

from plexmq.router.ops.httpd import CONNECTIONS, THREADS, TIMEOUT
from tests.cli import health, metrics_url
from tests.conftest import Broker, wait_for

IDLE = 200


def open_on(router: psutil.Process, port: int) -> int:
    """Connections to `port` the router holds open."""
    return sum(1 for c in router.net_connections(kind="tcp")
               if c.laddr and c.laddr.port == port and c.status == "ESTABLISHED")


def test_idle_connections_take_no_thread_are_capped_and_closed_after_the_timeout(
        start_broker: Callable[..., Broker]) -> None:
    b = start_broker("--workers", "1")
    url = metrics_url(b)
    parts = urlsplit(url)
    assert parts.port is not None
    router = b.router()
    assert router is not None
    wait_for(lambda: health(url) == 200, 15, "/health to answer 200")
    threads = router.num_threads()  # the pool has started a thread for that request at least
    idle = [socket.create_connection((parts.hostname, parts.port)) for _ in range(IDLE)]
    opened = time.monotonic()
    assert health(url) == 200  # through the crowd: the longest-waiting idle one made room
    assert router.num_threads() <= threads + THREADS
    assert open_on(router, parts.port) <= CONNECTIONS
    with selectors.DefaultSelector() as selector:  # each idle connection reads its close (EOF)
        for sock in idle:
            selector.register(sock, selectors.EVENT_READ)
        while selector.get_map() and time.monotonic() < opened + TIMEOUT + 10:
            for key, _ in selector.select(1.0):
                assert key.fileobj.recv(1) == b""  # type: ignore[union-attr]  # only sockets are registered
                selector.unregister(key.fileobj)
        assert not selector.get_map(), f"{len(selector.get_map())} idle connections still open"
    for sock in idle:
        sock.close()
    assert health(url) == 200
