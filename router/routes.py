"""The route table the router pushes to every worker, so that a worker can deliver a message to its own
subscribers without a hop through the router when nothing else needs it (docs/architecture.md §4).

A subscription's *place* is the worker of its connection when that worker alone can serve it: a
subscription that is not shared, of a clean session, made while connected there (MQTT 5 options and
identifiers included: the worker resolves them, workers/routes.py). Every other subscription
(persistent sessions, shared groups) has the router's place, `ROUTER`. The table maps each filter to
its places, counted (a filter of one subscription to that place alone: a dict of one is 232 bytes, and
most filters have one subscriber). A worker delivers a message itself only when no filter that matches
its topic has a place other than its own; otherwise the router routes it, to everyone, as before.
Filters are per tenant: the table is keyed by (tenant, filter), and a worker matches a topic only
against its publisher's tenant's filters.

Each turn's changes go to every worker as one `ROUTES` record of a new generation, at the head of its
frame; a worker that says HELLO gets the whole table. Workers acknowledge each generation
(`ROUTES_ACK`). A SUBACK whose subscription gave a filter a new place waits, with all that follows it
for its worker, until every other worker has acknowledged that generation (`Batch.gate`): a client
that has its SUBACK then misses nothing published after it on any worker.
"""

from __future__ import annotations

from collections.abc import Iterable

from plexmq import wire

ROUTER = b""  # the place of a subscription only the router can serve
Places = bytes | dict[bytes, int]  # one subscription's place, or each place with its subscriptions
Key = tuple[str, str]  # (tenant, filter)


def _each(places: Places | tuple[()]) -> Iterable[bytes]:
    """The places of a filter's entry."""
    return (places,) if isinstance(places, bytes) else places


class RouteTable:
    """(tenant, filter) -> places (worker identities, or ROUTER) with their subscription counts; the generations
    the workers have applied, and the frames that wait for them."""

    __slots__ = ("places", "changed", "gen", "acked", "fresh", "deferred")

    def __init__(self) -> None:
        self.places: dict[Key, Places] = {}
        self.changed: set[Key] = set()  # filters whose set of places changed this turn
        self.gen = 0
        self.acked: dict[bytes, int] = {}  # worker -> the last generation it applied
        self.fresh: set[bytes] = set()  # workers that said HELLO: the whole table goes to them next
        self.deferred: dict[bytes, list] = {}  # worker -> [generation, frames waiting for it]

    def add(self, tenant: str, topic_filter: str, place: bytes) -> bool:
        """One more subscription of `topic_filter` in `tenant` at `place`; True when the place is new for the filter."""
        key = (tenant, topic_filter)
        places = self.places.get(key)
        if places is None:
            self.places[key] = place
        elif isinstance(places, bytes):
            self.places[key] = {places: 2} if places == place else {places: 1, place: 1}
            if places == place:
                return False
        else:
            count = places.get(place, 0)
            places[place] = count + 1
            if count:
                return False
        self.changed.add(key)
        return True

    def remove(self, tenant: str, topic_filter: str, place: bytes) -> None:
        key = (tenant, topic_filter)
        places = self.places[key]
        if isinstance(places, bytes):
            del self.places[key]
        else:
            count = places[place] - 1
            if count:
                places[place] = count
                return
            del places[place]
            if not places:
                del self.places[key]
        self.changed.add(key)

    def hello(self, worker: bytes) -> None:
        """A worker (new, restarted, or one that lost its router) gets the whole table, and nothing
        it was waiting for: its connections are gone or registered again."""
        self.fresh.add(worker)
        self.acked[worker] = 0
        self.deferred.pop(worker, None)

    def forget(self, worker: bytes) -> None:
        """A worker taken for dead: nobody waits for it any more, and nothing waits to go to it."""
        self.acked.pop(worker, None)
        self.deferred.pop(worker, None)
        self.fresh.discard(worker)

    def leads(self, workers: Iterable[bytes]) -> dict[bytes, bytes]:
        """This turn's ROUTES record for each worker that needs one: the changes, or the whole table."""
        leads: dict[bytes, bytes] = {}
        if self.changed:
            self.gen += 1
            places = self.places
            change = self._record(False, ((key, places.get(key, ())) for key in self.changed))
            self.changed.clear()
            leads = {worker: change for worker in workers if worker not in self.fresh}
        if self.fresh:
            whole = self._record(True, self.places.items())
            for worker in self.fresh:
                leads[worker] = whole
            self.fresh.clear()
        return leads

    def _record(self, whole: bool, entries: Iterable[tuple[Key, Places | tuple[()]]]) -> bytes:
        """A ROUTES record of this generation: each filter with its tenant and its places."""
        listed = [[tenant, f, [place.decode() for place in _each(places)]] for (tenant, f), places in entries]
        return wire.record(wire.ROUTES, wire.Routes(self.gen, whole, listed).encode())

    def acknowledged(self, worker: bytes, gen: int) -> None:
        self.acked[worker] = gen

    def order(self, worker: bytes, now: bytes, later: bytes, gated: bool) -> tuple[bytes, bytes]:
        """A worker's frames of this turn as they may leave: (now, after the commit). Frames that wait
        for the other workers are kept, and so is everything after them, in order; those whose
        generation every other worker has applied go first."""
        waiting = self.deferred.get(worker)
        if waiting is not None:
            if not self._applied(waiting[0], worker):
                waiting[1].extend((now, later))  # sent in a later turn: after this one's commit
                if gated:
                    waiting[0] = self.gen  # a later SUBACK waits for the later generation
                return b"", b""
            del self.deferred[worker]
            now = b"".join(waiting[1]) + now  # stored in an earlier turn
        if gated and not self._applied(self.gen, worker):
            self.deferred[worker] = [self.gen, [later]]
            return now, b""
        return now, later

    def _applied(self, gen: int, worker: bytes) -> bool:
        """Whether every worker but `worker` has applied generation `gen`."""
        return all(seen >= gen for other, seen in self.acked.items() if other != worker)
