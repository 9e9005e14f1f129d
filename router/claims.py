"""Claims that wait: a CONNECT that resumes a session (not a clean start, the router answers it) is taken
only once every other worker of its host has answered a SYNC sent after it came.

Why: a new clean session's worker writes the CONNACK itself and sends its CONNECT after it (the connect
rate), and the records of two workers reach the router in no order. A client that connects clean on one
worker, leaves, and resumes on another could have its resuming CONNECT read first, and be told of the
session its clean start ended. A worker answers SYNC behind whatever it sent before, so once each of the
others has answered, every claim made before the resuming CONNECT has been read. Nodes on other hosts
are not waited for: their claims are taken in the order they come (router/lifecycle.py, "Claims")."""

from __future__ import annotations


class Waiting:
    """One CONNECT held back: its connection, its record, and the workers whose SYNCED it waits for."""

    __slots__ = ("number", "key", "header", "payload", "pending")

    def __init__(self, number: int, key: tuple[bytes, int], header: bytes, payload: bytes, pending: set[bytes]) -> None:
        self.number = number  # the SYNC it waits for
        self.key = key  # (worker, conn_id)
        self.header = header
        self.payload = payload
        self.pending = pending


class Claims:
    """The CONNECTs held back, in the order they came, and this turn's SYNC (one per worker a turn)."""

    __slots__ = ("asked", "told", "waiting")

    def __init__(self) -> None:
        self.asked = 0  # the number of the last SYNC
        self.told: set[bytes] | None = None  # the workers this turn's SYNC goes to (None: none goes yet)
        self.waiting: list[Waiting] = []

    def hold(self, key: tuple[bytes, int], header: bytes, payload: bytes, others: set[bytes]) -> set[bytes]:
        """Hold a CONNECT until `others` have answered a SYNC sent after it; the workers that SYNC
        `asked` must still go to this turn."""
        if self.told is None:
            self.asked += 1
            self.told = set()
        new = others - self.told
        self.told |= new
        self.waiting.append(Waiting(self.asked, key, header, payload, set(others)))
        return new

    def turn_ended(self) -> None:
        """This turn's SYNC has gone: a CONNECT of the next turn waits for the next one."""
        self.told = None

    def synced(self, worker: bytes, number: int) -> list[Waiting]:
        """`worker` answered SYNC `number`: the CONNECTs now free to go on, in the order they came."""
        for waiting in self.waiting:
            if waiting.number <= number:
                waiting.pending.discard(worker)
        return self._ready()

    def gone(self, worker: bytes) -> list[Waiting]:
        """`worker` will not answer (taken for dead, its frames lost, stopped): its own CONNECTs are void,
        the others wait for it no more; those free to go on."""
        self.waiting = [waiting for waiting in self.waiting if waiting.key[0] != worker]
        for waiting in self.waiting:
            waiting.pending.discard(worker)
        return self._ready()

    def forget(self, key: tuple[bytes, int]) -> None:
        """The connection ended before its CONNECT went on (if it waited: most never do)."""
        if self.waiting:
            self.waiting = [waiting for waiting in self.waiting if waiting.key != key]

    def _ready(self) -> list[Waiting]:
        ready = [waiting for waiting in self.waiting if not waiting.pending]
        if ready:
            self.waiting = [waiting for waiting in self.waiting if waiting.pending]
        return ready
