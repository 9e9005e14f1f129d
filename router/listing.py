"""`plexmq clients`: requests from the metrics thread about the connected clients, answered through
the router: a listing (every worker answers) and a disconnect (the router knows where the client is).

The metrics thread hands a request to the router's loop (a thread-safe queue), the loop asks the
workers in their batches, and the thread waits for the answers (bounded) on an event.
"""

from __future__ import annotations

import itertools
import threading

_ids = itertools.count(1)


class ClientListing:
    def __init__(self, text: str) -> None:
        self.id = next(_ids)
        self.filter = text
        self.clients: list[list] = []
        self.done = threading.Event()
        self.answered: set[str] = set()  # worker labels
        self._waiting = 0

    def expect(self, workers: int) -> None:
        self._waiting = workers
        if not workers:
            self.done.set()

    def answer(self, worker: str, clients: list[list]) -> None:
        if worker in self.answered:
            return
        self.answered.add(worker)
        self.clients.extend([c[0], worker, *c[1:]] for c in clients)
        self._waiting -= 1
        if self._waiting <= 0:
            self.done.set()


class ClientDisconnect:
    """`plexmq clients --disconnect ID`: close that client's connection (its session stays, its will
    is published, a 5.0 client hears DISCONNECT 0x98); `found`: whether it was connected."""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self.found = False
        self.done = threading.Event()


Request = ClientListing | ClientDisconnect
