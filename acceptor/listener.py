"""Accepting connections and handing each socket to the least-loaded worker, with its listener's index.

Accepts are taken in bursts; the sockets of one burst bound for the same worker travel in one
sendmsg (SCM_RIGHTS). The acceptor keeps a socket only for the moment it takes to pass it on.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import time

from plexmq.acceptor.admission import Admission
from plexmq.acceptor.supervisor import Child
from plexmq.workers import handoff

log = logging.getLogger("plexmq.acceptor")

ACCEPT_BURST = 512
OUT_OF_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class Listener:
    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, index: bytes, workers: list[Child],
                 admission: Admission) -> None:
        self.loop = loop
        self.admission = admission
        self.sock = sock
        self.index = index  # one byte: its place in config["listening"], which tells the worker how to serve its sockets
        self.workers = workers
        self.refused = 0
        self.refused_logged_at = 0.0
        loop.add_reader(sock.fileno(), self._accept)

    def _accept(self) -> None:
        bound: dict[int, list[int]] = {}
        live = [w for w in self.workers if w.channel is not None]
        held = sum(w.load for w in live)
        admit = self.admission.admit
        accept = self.sock._accept  # type: ignore[attr-defined]  # CPython's, not in the stubs
        for _ in range(ACCEPT_BURST):
            try:
                fd, addr = accept()  # the bare fd: no socket object to make and detach
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno in OUT_OF_FDS:
                    self._out_of_fds(exc)
                break
            if not admit(addr[0], held):
                os.close(fd)
                continue
            if not live:
                os.close(fd)  # no worker alive right now: the client retries
                continue
            held += 1
            worker = min(live, key=lambda w: w.load)
            worker.handed += 1
            bound.setdefault(worker.worker_id, []).append(fd)  # type: ignore[arg-type]  # a live worker has its id
        for worker_id, fds in bound.items():
            self._hand(self.workers[worker_id], fds)

    def _hand(self, worker: Child, fds: list[int]) -> None:
        sent = 0
        try:
            for start in range(0, len(fds), handoff.MAX_FDS_PER_MESSAGE):
                chunk = fds[start:start + handoff.MAX_FDS_PER_MESSAGE]
                handoff.send_fds(worker.channel, chunk, self.sock.family, self.index * len(chunk))  # type: ignore[arg-type]  # a live worker has its channel
                sent += len(chunk)
        except OSError as exc:
            worker.handed -= len(fds) - sent  # never arrive: they must not count as load
            log.warning("cannot hand sockets to %s: %s", worker.name, exc)
        finally:
            for fd in fds:
                os.close(fd)

    def _out_of_fds(self, exc: OSError) -> None:
        """Stop accepting for a moment instead of spinning on a listener we cannot serve."""
        now = time.monotonic()
        if now - self.refused_logged_at >= 1.0:
            self.refused_logged_at = now
            log.warning("acceptor cannot accept: %s; pausing 100 ms", exc.strerror)
        self.loop.remove_reader(self.sock.fileno())
        self.loop.call_later(0.1, self.loop.add_reader, self.sock.fileno(), self._accept)

    def close(self) -> None:
        self.loop.remove_reader(self.sock.fileno())
        self.sock.close()
