"""Questions the HTTP threads (the admin endpoint, the console) ask the router's loop, which alone may
touch the router's state.

A thread puts an `Ask` on the loop's queue (`Asks`) and waits on its `done` event (bounded: `ASK_WAIT`);
the loop calls `start` once per turn for each queued ask, on its own thread. An ask the loop can answer
at once sets `done` in `start`; one that needs the workers (a clients listing) sets it when the last
answer comes. Whatever the ask holds when `done` is set is its answer: the thread reads it only after.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from plexmq.router.core import Router

ASK_WAIT = 5.0  # seconds a thread waits for the loop's (and the workers') answer
SCAN = 100_000  # sessions, filters or groups one page's ask looks at (`Paged.scanned`)


class Ask:
    """One question; `start` runs on the loop's thread."""

    def __init__(self) -> None:
        self.done = threading.Event()

    def start(self, router: Router) -> None:
        """Answer now and set `done`, or arrange for it to be set later."""
        raise NotImplementedError


Asks = queue.Queue[Ask]


class Paged(Ask):
    """A page (`offset`, `limit`) of what one scan found, `total` of them; `complete`: nothing left unscanned."""

    def __init__(self, tenant: str | None, offset: int, limit: int) -> None:
        super().__init__()
        self.tenant = tenant
        self.offset = offset
        self.limit = limit
        self.total = 0
        self.complete = True
        self.rows: list = []

    def scanned(self, items: Iterable, size: int) -> Iterator:
        """At most SCAN of `items` (of `size` in all)."""
        self.complete = size <= SCAN
        return itertools.islice(items, SCAN)


def ask(asks: Asks, question: Ask) -> bool:
    """Put `question` to the loop and wait for its answer; whether it came in time. After a timeout `done`
    is set anyway, so that the loop forgets an ask whose workers did not answer."""
    asks.put(question)
    complete = question.done.wait(ASK_WAIT)
    question.done.set()
    return complete


def start_asked(asks: Asks, router: Router) -> None:
    """The loop's part, once a turn: start every ask queued since the last turn."""
    while True:
        try:
            question = asks.get_nowait()
        except queue.Empty:
            return
        question.start(router)
