"""The acceptor's listening sockets, kept in step with the tenants as a reload changes them.

A socket is handed to a worker with one byte: its listener's place in `config["listening"]`
(workers/handoff.py). Sockets may be in flight to a worker when a reload closes their listener, so a
place is never given to another kind of listener: a closed one stays in the list (dead), new ones are
appended, and a place is only reused by a listener of the same scheme and tenant, which the workers
serve the same way. The broker's own listeners never change here (a restart changes them).
"""

from __future__ import annotations

import asyncio
import logging
import socket

from plexmq.acceptor.admission import Admission
from plexmq.acceptor.config import MAX_LISTENERS, listeners
from plexmq.acceptor.listener import Listener
from plexmq.acceptor.supervisor import Child

log = logging.getLogger("plexmq.acceptor")

LISTEN_BACKLOG = 4096

Address = tuple[str, str, int, str]  # scheme, host, port, owning tenant ("": the broker's own)


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # writes are batched per turn already; accepted sockets inherit it (Linux), one call less each in the worker
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(LISTEN_BACKLOG)
    sock.setblocking(False)
    return sock


def _where(address: Address) -> str:
    scheme, host, port, tenant = address
    return f"{host}:{port} ({scheme}{f', tenant {tenant}' if tenant else ''})"


class Listening:
    """The open listeners by address, and `places`: `config["listening"]`, dead places included."""

    def __init__(self, loop: asyncio.AbstractEventLoop, workers: list[Child], admission: Admission,
                 bound: list[tuple[Address, socket.socket]]) -> None:
        self.loop = loop
        self.workers = workers
        self.admission = admission
        self.places: list[list[str]] = [[scheme, tenant] for (scheme, _host, _port, tenant), _sock in bound]
        self.open: dict[Address, Listener] = {address: self._listen(sock, index)
                                              for index, (address, sock) in enumerate(bound)}

    def _listen(self, sock: socket.socket, index: int) -> Listener:
        return Listener(self.loop, sock, bytes([index]), self.workers, self.admission)

    def update(self, config: dict) -> None:
        """A reload: close the listeners `config` no longer has, bind the ones it adds, and set its
        `listening` (before the workers are told to read it). A listener that cannot be bound is
        said in one line and left out; the others go on."""
        wanted = listeners(config)
        for address in [address for address in self.open if address not in wanted]:
            self.open.pop(address).close()
            log.info("SIGHUP: stopped listening on %s", _where(address))
        live = {listener.index[0] for listener in self.open.values()}
        for address in wanted:
            if address in self.open:
                continue
            scheme, host, port, tenant = address
            index = next((i for i, place in enumerate(self.places) if place == [scheme, tenant] and i not in live),
                         len(self.places))
            if index >= MAX_LISTENERS:
                log.error("SIGHUP: cannot listen on %s: %d listeners were opened since the start, the most a "
                          "broker can hand over; restart it", _where(address), MAX_LISTENERS)
                continue
            try:
                sock = bind(host, port)
            except OSError as exc:
                log.error("SIGHUP: cannot listen on %s: %s", _where(address), exc.strerror)
                continue
            if index == len(self.places):
                self.places.append([scheme, tenant])
            live.add(index)
            self.open[address] = self._listen(sock, index)
            log.info("SIGHUP: plexmq listening on %s", _where(address))
        config["listening"] = self.places

    def close(self) -> None:
        for listener in self.open.values():
            listener.close()
