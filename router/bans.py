"""The banned clients as the router keeps them: it is their authority (plexmq/bans.py says what a ban is).

Why here: a CONNECT must be judged where it arrives, in its worker, without asking anyone (a clean
session's CONNACK leaves the worker before the router hears of it). So the router keeps the bans in its
store (router/store/journal.py: `ban_saved`, `ban_dropped`; a restart, or a standby taking over a shared
store, starts from them) and tells every worker: the whole set when it joins, then each change (`BANS`),
which the worker applies to its copy and to its connected clients (the ones a new ban names are closed:
workers/from_router.py `bans`). A change is answered once every joined worker has acknowledged it
(`BANS_ACK`, with how many clients it closed), so that after the answer no banned client connects. An
expired ban is lifted at the loop's once-a-second `sweep` (the workers also ignore it from its expiry on).

`ban` and `unban` are the one place an operator's ban is made or lifted (the admin API and the console
both come through them); `answer_*` are their HTTP requests, shared by both.
"""

from __future__ import annotations

import heapq
import logging
import time
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

import orjson

from plexmq import wire
from plexmq.bans import BROKER, KINDS, BadBan, Ban, BanSet, Key, canonical, make
from plexmq.router.asks import Ask, Asks, ask
from plexmq.router.console.http import json_body
from plexmq.router.ops import audit
from plexmq.units import parse_duration

if TYPE_CHECKING:
    from collections.abc import Callable

    from plexmq.router.core import Router
    from plexmq.router.listing import Answer
    from plexmq.router.store.journal import Journal

log = logging.getLogger("plexmq.router")

MAX_ROWS = 100_000  # offset + limit of a listing
LATE = " (a worker has not acknowledged it yet)"  # said when the answer came before every worker's BANS_ACK
FIELDS = list(Ban._fields)  # a listing's row


class BanChange(Ask):
    """Make `ban` (replacing one of its key) or lift the ban of `lift`; answered once every joined
    worker applied it. `found`: the ban it replaced or lifted (None: none); `closed`: the connected
    clients the new ban closed."""

    def __init__(self, ban: Ban | None = None, lift: Key | None = None) -> None:
        super().__init__()
        self.ban = ban
        self.lift = lift
        self.found: Ban | None = None
        self.closed = 0
        self.gen = 0  # the generation of the set every joined worker must have acknowledged

    def start(self, router: Router) -> None:
        router.bans.apply(router, self)


class BanListing(Ask):
    """The bans of tenant `tenant` (None: all; BROKER: those of every tenant) whose value, reason or
    maker contains `text`: how many, and the first `most` in (tenant, kind, value) order."""

    def __init__(self, text: str, tenant: str | None, most: int) -> None:
        super().__init__()
        self.text = text
        self.tenant = tenant
        self.most = most
        self.rows: list[Ban] = []
        self.total = 0

    def start(self, router: Router) -> None:
        text, tenant = self.text, self.tenant
        found = [ban for ban in router.bans.set if (tenant is None or ban.tenant == tenant)
                 and (text in ban.value or text in ban.reason or text in ban.by)]
        self.total = len(found)
        self.rows = heapq.nsmallest(self.most, found, key=lambda ban: ban.key)
        self.done.set()


class Banning:
    """The router's bans, changed by the loop only, and which generation of them each joined worker has."""

    def __init__(self, journal: Journal) -> None:
        self.set = BanSet()
        self.journal = journal
        self.gen = 0  # of the set: one more at each change
        self.acked: dict[bytes, int] = {}  # each joined worker -> the generation it applied
        self.waiting: list[BanChange] = []  # answered once every joined worker has the change
        self.ends: list[tuple[float, Key]] = []  # heap: when bans expire (a ban replaced since leaves a stale entry)

    def restore(self, bans: list[Ban]) -> None:
        """The bans the store kept (the expired among them are lifted at the first `sweep`)."""
        for ban in bans:
            self._add(ban)

    def _add(self, ban: Ban) -> None:
        self.set.add(ban)
        if ban.expires:
            heapq.heappush(self.ends, (ban.expires, ban.key))

    def apply(self, router: Router, change: BanChange) -> None:
        """(the loop) An operator's ban or unban: into the set and the store, to every joined worker."""
        if change.ban is not None:
            ban = change.ban
            change.found = self.set.get(ban.key)
            self._add(ban)
            self.journal.ban_saved(ban)
            log.info("ban of %s %r in %s by %r: %s%s", ban.kind, ban.value, _where(ban.tenant), ban.by,
                     ban.reason or "no reason given", f", until {_when(ban.expires)}" if ban.expires else "")
            change.gen = self._tell(router, [ban], [])
        elif change.lift is not None:
            change.found = self.set.remove(change.lift)
            if change.found is None:
                change.done.set()
                return
            self.journal.ban_dropped(change.lift)
            tenant, kind, value = change.lift
            log.info("ban of %s %r in %s lifted", kind, value, _where(tenant))
            change.gen = self._tell(router, [], [change.lift])
        self.waiting.append(change)
        self.applied()

    def _tell(self, router: Router, added: list[Ban], removed: list[Key]) -> int:
        """A change: its generation to every joined worker; that generation."""
        self.gen += 1
        told = wire.Bans(self.gen, False, [list(ban) for ban in added], [list(key) for key in removed])
        for worker in self.acked:
            router.out(worker).bans(told)
        return self.gen

    def hello(self, worker: bytes, out: Callable[[bytes], wire.ToWorker]) -> None:
        """(the loop) A worker joins (new, restarted, or again; this router may be new to it): the whole set,
        in place of whatever it held."""
        self.acked[worker] = 0
        out(worker).bans(wire.Bans(self.gen, True, [list(ban) for ban in self.set], []))

    def forget(self, worker: bytes) -> None:
        """(the loop) A worker whose frames went missing or that is taken for dead: nobody waits for it."""
        self.acked.pop(worker, None)

    def on_ack(self, worker: bytes, header: bytes, payload: bytes) -> None:
        """BANS_ACK: the worker holds that generation's set, and closed so many clients by it."""
        if worker in self.acked:
            gen, closed = wire.BansAck.decode(header)
            self.acked[worker] = gen
            for change in self.waiting:
                if change.gen == gen:
                    change.closed += closed
            self.applied()

    def applied(self) -> None:
        """(the loop) Answer the changes every joined worker has acknowledged; after each BANS_ACK and
        each second (a worker taken for dead acknowledges nothing more)."""
        waiting = []
        for change in self.waiting:
            if all(gen >= change.gen for gen in self.acked.values()):
                change.done.set()
            elif not change.done.is_set():  # else its thread stopped waiting (ASK_WAIT)
                waiting.append(change)
        self.waiting = waiting

    def sweep(self, router: Router, now: float) -> None:
        """(the loop, once a second) Lift the bans whose time is up: from the store, and from the workers."""
        ends, lifted = self.ends, []
        while ends and ends[0][0] <= now:
            _at, key = heapq.heappop(ends)
            ban = self.set.get(key)
            if ban is not None and ban.expires and ban.expires <= now:
                self.set.remove(key)
                self.journal.ban_dropped(key)
                lifted.append(key)
        if lifted:
            log.info("%d bans expired", len(lifted))
            self._tell(router, [], lifted)
        if self.waiting:
            self.applied()


def _where(tenant: str) -> str:
    return "every tenant" if tenant == BROKER else f"tenant {tenant!r}" if tenant else "the default tenant"


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(at))


# -- the operator's actions ----------------------------------------------------------------------------

def ban(asks: Asks, made: Ban) -> tuple[BanChange, bool]:
    """Ban: every worker refuses its CONNECTs and closes its clients now (the one place a ban is made);
    the change, and whether every worker acknowledged it in time."""
    change = BanChange(ban=made)
    return change, ask(asks, change)


def unban(asks: Asks, key: Key) -> tuple[BanChange, bool]:
    """Lift the ban of `key` (the one place a ban is lifted by hand); as `ban`."""
    change = BanChange(lift=key)
    return change, ask(asks, change)


def answer_bans(asks: Asks, environ: dict, only: str | None = None) -> Answer:
    """GET /bans?filter=TEXT&offset=N&limit=N[&tenant=NAME]: one page of the bans (of that tenant only:
    "" the default tenant, * those that hold in every tenant), in (tenant, kind, value) order; `total`
    counts every match. `only`: this tenant's, whatever is asked."""
    query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
    try:
        offset, limit = int(query.get("offset", ["0"])[0]), int(query.get("limit", ["100"])[0])
    except ValueError:
        return "400 Bad Request", "text/plain", b"offset and limit are numbers\n", "bad offset or limit"
    if offset < 0 or limit < 1 or offset + limit > MAX_ROWS:
        return ("400 Bad Request", "text/plain", f"offset >= 0, limit >= 1, offset + limit <= {MAX_ROWS}\n".encode(),
                "bad offset or limit")
    tenant = query["tenant"][0] if "tenant" in query else None
    listing = BanListing(query.get("filter", [""])[0], tenant if only is None else only, offset + limit)
    complete = ask(asks, listing)
    body = {"total": listing.total, "complete": complete, "offset": offset, "fields": FIELDS,
            "bans": [list(ban) for ban in listing.rows[offset:]]}
    return "200 OK", "application/json", orjson.dumps(body), f"listed {listing.total} bans"


def _asked(environ: dict, only: str | None) -> tuple[dict, Key]:
    """The JSON body of a ban or unban and the key it names (its tenant `only`, where set; else as
    named, every tenant when it names none); BadBan when it names none."""
    body = json_body(environ)
    if not isinstance(body, dict):
        raise BadBan('the body is {"kind": "client_id|username|address", "value": "...", "tenant": "NAME or *", ...}')
    kind, value, tenant = body.get("kind"), body.get("value"), body.get("tenant", BROKER)
    if not isinstance(kind, str) or not isinstance(value, str) or not isinstance(tenant, str):
        raise BadBan(f"kind ({', '.join(KINDS)}), value and tenant are strings")
    tenant = tenant if only is None else only
    return body, (tenant, kind, canonical(kind, value))


def answer_ban(asks: Asks, environ: dict, by: str, only: str | None = None, admin: str = audit.ADMIN_API) -> Answer:
    """POST /bans/add, body {"kind": KIND, "value": V, "tenant": NAME, "reason": TEXT, "duration": "1h"}
    (tenant optional: * every tenant; reason and duration optional: none, for ever): 200 once every
    worker holds it, saying how many connected clients it closed. `by`: who asks, kept with the ban;
    `admin`: who asks, for the audit log (the admin API's token, or a console admin)."""
    address = environ.get("REMOTE_ADDR", "")
    try:
        body, (tenant, kind, value) = _asked(environ, only)
        reason, duration = body.get("reason", ""), body.get("duration", "")
        if not isinstance(reason, str) or not isinstance(duration, (str, int, float)) or isinstance(duration, bool):
            raise BadBan("reason is a string, duration a number of seconds or a duration (30m, 2h, 7d)")
        try:
            seconds = parse_duration(str(duration)) if duration not in ("", 0) else 0.0
        except ValueError as exc:
            raise BadBan(str(exc)) from None
        made = make(tenant, kind, value, reason, seconds, by)
    except BadBan as exc:
        audit.record(asks, admin, address, audit.BAN, only or "", "", f"refused: {exc}")
        return "400 Bad Request", "text/plain", f"{exc}\n".encode(), f"refused: {exc}"
    change, complete = ban(asks, made)
    said = f"{'banned again' if change.found else 'banned'} {kind} {value!r} in {_where(tenant)}" + \
        (f" until {_when(made.expires)}" if made.expires else "") + f"; {change.closed} connected clients closed"
    audit.record(asks, admin, address, audit.BAN, tenant, f"{kind} {value}", said)
    return "200 OK", "text/plain", f"{said}{'' if complete else LATE}\n".encode(), said


def answer_unban(asks: Asks, environ: dict, only: str | None = None, admin: str = audit.ADMIN_API) -> Answer:
    """POST /bans/remove, body {"kind": KIND, "value": V, "tenant": NAME} (tenant optional: * every
    tenant): 200 once every worker has lifted it, 404 when there was no such ban; `admin` as `answer_ban`."""
    address = environ.get("REMOTE_ADDR", "")
    try:
        _body, key = _asked(environ, only)
    except BadBan as exc:
        audit.record(asks, admin, address, audit.UNBAN, only or "", "", f"refused: {exc}")
        return "400 Bad Request", "text/plain", f"{exc}\n".encode(), f"refused: {exc}"
    change, complete = unban(asks, key)
    tenant, kind, value = key
    what = f"{kind} {value!r} in {_where(tenant)}"
    said = f"no ban of {what}" if change.found is None else f"lifted the ban of {what}"
    audit.record(asks, admin, address, audit.UNBAN, tenant, f"{kind} {value}", said)
    if change.found is None:
        return "404 Not Found", "text/plain", f"{said}\n".encode(), said
    return "200 OK", "text/plain", f"{said}{'' if complete else LATE}\n".encode(), said
