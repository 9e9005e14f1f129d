"""Who did what (issue 37): every action an admin takes through the web console or the admin API is
one `Entry` of the audit log: when, who (the console admin, or ADMIN_API for the endpoint's token),
from which address, in which tenant, what (ACTIONS), on what, and what came of it. The console's Audit
page shows it (router/console/audit.py; a tenant admin that tenant's entries only).

An action is audited by one call: its handler calls `record` once, when it knows the outcome. A new
action adds its name to ACTIONS and calls `record` the same way.

Where it goes: `record` puts an `Audited` ask on the router's loop (router/asks.py) without waiting;
the loop adds it to the router's `Audit` (the last KEEP, in memory, which the page reads through an
ask) and to the store's turn (router/store/journal.py `audited`), so it is committed with that turn,
behind a shared store's fence like every write (a router that lost its lease writes none). The store
keeps the last KEEP entries and none older than AGE (each save trims the rest), and a restarted router,
or the standby that takes over, loads them (`Store.load`). Without a store (persistence = false) the
log lives in memory only, until a restart.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import astuple, dataclass
from typing import TYPE_CHECKING

from plexmq.router.asks import Ask, Asks, Paged

if TYPE_CHECKING:
    from plexmq.router.core import Router

KEEP = 10_000  # entries kept, in memory and in the store
AGE = 30 * 86400.0  # seconds an entry is kept at most
ADMIN_API = "(admin API token)"  # who acted through the metrics endpoint's admin requests (router/ops/admin.py)
# what an entry's `action` may be: one per action there is
DISCONNECT, SESSION_REMOVE, RETAINED_DELETE = "disconnect", "session remove", "retained delete"
TRACE_START, TRACE_STOP, ALARM_ACK = "trace start", "trace stop", "alarm acknowledge"
BAN, UNBAN = "ban", "unban"
ACTIONS = (DISCONNECT, SESSION_REMOVE, RETAINED_DELETE, TRACE_START, TRACE_STOP, ALARM_ACK, BAN, UNBAN)


@dataclass(slots=True)
class Entry:
    """One action; the columns of the store's `audit` table, in this order."""

    seq: int  # its place in the log (0 until the loop adds it)
    at: float  # Unix time
    admin: str
    address: str
    tenant: str  # the tenant acted in ("": the default tenant's, or the broker's as a whole)
    action: str  # one of ACTIONS
    target: str  # what it acted on: a client id, a topic, a trace's filter, an alarm
    outcome: str  # what came of it, as the answer said


def record(asks: Asks, admin: str, address: str, action: str, tenant: str, target: str, outcome: str) -> None:
    """Audit one action (any thread): the loop adds it at its next turn; this does not wait for it."""
    asks.put(Audited(Entry(0, time.time(), admin, address, tenant, action, target, outcome)))


class Audit:
    """The last KEEP entries, oldest first; the router's loop alone touches it."""

    def __init__(self) -> None:
        self.entries: deque[Entry] = deque(maxlen=KEEP)
        self.seq = 0  # the last entry's

    def loaded(self, rows: list[tuple]) -> None:
        """The store's entries, oldest first (`Store.load`)."""
        self.entries.extend(Entry(*row) for row in rows)
        self.seq = self.entries[-1].seq if self.entries else 0

    def add(self, entry: Entry) -> None:
        self.seq += 1
        entry.seq = self.seq
        self.entries.append(entry)

    def page(self, tenant: str | None, offset: int, limit: int, now: float) -> tuple[int, list[dict]]:
        """The entries of `tenant` (None: every one) no older than AGE: how many, and the page of them
        from `offset`, newest first."""
        found = [e for e in reversed(self.entries) if (tenant is None or e.tenant == tenant) and now - e.at <= AGE]
        return len(found), [dict(zip(Entry.__slots__, astuple(e), strict=True)) for e in found[offset:offset + limit]]


class Audited(Ask):
    """An entry for the loop to add and store."""

    def __init__(self, entry: Entry) -> None:
        super().__init__()
        self.entry = entry

    def start(self, router: Router) -> None:
        router.audit.add(self.entry)
        router.journal.audited(astuple(self.entry), self.entry.seq - KEEP, self.entry.at - AGE)
        self.done.set()


class AuditPage(Paged):
    """A page of the log (`Audit.page`)."""

    def start(self, router: Router) -> None:
        self.total, self.rows = router.audit.page(self.tenant, self.offset, self.limit, time.time())
        self.done.set()
