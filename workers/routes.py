"""The worker's copy of the router's route table (router/routes.py) and the subscriptions it serves
itself: what lets it deliver a PUBLISH to its own subscribers without a hop through the router.

The router says which subscriptions are the worker's own (in their SUBACK) and which filters something
else serves, and where (ROUTES). A message goes straight to the local subscribers when no filter
matching its topic is served elsewhere, and to the other workers itself when only they serve the
others and it reaches them (workers/peers.py: those of this host; those of other nodes in `far`, for
QoS 0 only); the caller also waits until the router has taken every PUB the
worker sent it before (`RouterLink.unrouted`), so that a topic that stops needing the router does not
overtake its own messages still on their way through it.

Each tenant has its own table (`RouteTables`): a filter served elsewhere in one tenant says nothing
about the same filter in another, and a connection matches its messages against its tenant's only
(`Connection.routes`, bound at CONNECT: the QoS 0 path pays no lookup for it).
"""

from __future__ import annotations

from collections.abc import Iterable

from plexmq.grants import Matched
from plexmq.trie import SubscriptionTrie

CACHE_SIZE = 100_000
Subscriber = tuple[int, int, int]  # conn id, granted QoS, packet id (0: the connection numbers it), as on the wire
Special = tuple[int, Matched]  # a local subscriber with MQTT 5 options or identifiers: conn id, its grants
# the local subscribers of plain subscriptions; the other workers that want a QoS 0 message, and those that
# want a QoS 1 or 2 one (None: the router must route it); the local subscribers whose subscriptions have MQTT 5
# options or identifiers (each message resolved for each: `Worker.deliver_special`)
Targets = tuple[tuple[Subscriber, ...], tuple[str, ...] | None, tuple[str, ...] | None, tuple[Special, ...]]


class LocalRoutes:
    """Filters served elsewhere (and where), the worker's own subscriptions, and per topic what they mean."""

    __slots__ = ("own", "node", "direct", "far", "remote", "placed", "local", "known", "cache")

    def __init__(self, identity: bytes, direct: bool, far: set[str]) -> None:
        self.own = identity.decode()  # this worker's place (its identity on the router link)
        self.node = self.own.rpartition("/")[0]  # its node's name ("": all-in-one): the places of this host share it
        self.direct = direct  # whether it sends to the other workers of its host itself (direct_delivery)
        self.far = far  # the other nodes' workers it sends QoS 0 messages to itself (`RouteTables.reach`)
        self.remote = SubscriptionTrie()  # filter -> its places other than this worker (the router's: "")
        self.placed: dict[str, tuple[str, ...]] = {}  # filter -> the places `remote` holds for it
        self.local = SubscriptionTrie()  # conn id -> routing grant: the subscriptions served here
        self.known = False  # whether the table came since the last HELLO: until then all goes to the router
        self.cache: dict[bytes, Targets] = {}

    def targets(self, topic: bytes) -> Targets | None:
        """The local subscribers of a message to `topic` (plain ones; empty: none), the other workers that
        serve the rest, for QoS 0 and for QoS 1 or 2 (empty: none; None: something else wants it, the router
        or a worker this one does not reach, and the router must route it), and the local subscribers with
        MQTT 5 options or identifiers; or None while the table is not known."""
        if not self.known:
            return None
        found = self.cache.get(topic)
        if found is None:
            name = topic.decode()
            plain, special = self._here(name)
            q0, q1 = self._peers(self.remote.match(name))  # type: ignore[arg-type]  # places
            found = (plain, q0, q1, special)
            if len(self.cache) >= CACHE_SIZE:
                self.cache.clear()
            self.cache[topic] = found
        return found

    def _here(self, name: str) -> tuple[tuple[Subscriber, ...], tuple[Special, ...]]:
        """The local subscribers of a message to topic `name`: those whose subscriptions are plain, and the others."""
        plain: list[Subscriber] = []
        special: list[Special] = []
        for conn_id, matched in self.local.match(name).items():
            if matched.__class__ is int and matched < 4:
                plain.append((conn_id, matched, 0))  # type: ignore[arg-type]  # conn ids, an int
            else:
                special.append((conn_id, matched))  # type: ignore[arg-type]  # conn ids
        return tuple(plain), tuple(special)

    def served_here(self, topic: bytes) -> tuple[tuple[Subscriber, ...], tuple[Special, ...]]:
        """The subscribers this worker serves itself of a message to `topic` that another worker of this
        host sent it (workers/from_peers.py), whatever else wants it: plain ones, and the others."""
        found = self.targets(topic)
        if found is not None:
            return found[0], found[3]
        return self._here(topic.decode())

    def _peers(self, places: Iterable[str]) -> tuple[tuple[str, ...] | None, tuple[str, ...] | None]:
        """The peers a QoS 0 and a QoS 1 or 2 message go to (None: the router routes it)."""
        peers = tuple(places)
        if not peers:
            return peers, peers
        if not self.direct:
            return None, None
        node, far = self.node, self.far
        near = [place.rpartition("/")[0] == node and bool(place) for place in peers]
        if all(near):
            return peers, peers
        return (peers if all(here or place in far for here, place in zip(near, peers)) else None), None

    def apply(self, whole: bool, entries: list[list]) -> None:
        """A ROUTES record: each filter with its places now (`whole`: the entire table)."""
        if whole:
            self.remote = SubscriptionTrie()
            self.placed = {}
            self.known = True
        own, remote, placed = self.own, self.remote, self.placed
        for _tenant, topic_filter, places in entries:
            for place in placed.pop(topic_filter, ()):
                remote.remove(topic_filter, place)
            others = tuple(place for place in places if place != own)
            if others:
                placed[topic_filter] = others
                for place in others:
                    remote.add(topic_filter, place, 0)
        self.cache.clear()

    def forget_table(self) -> None:
        """A new router: until its table comes, every message goes to it."""
        self.known = False

    def subscribe(self, conn_id: int, topic_filter: str, grant: int) -> None:
        """A subscription served here, with its routing grant (plexmq/grants.py: QoS, MQTT 5 options, identifier)."""
        self.local.add(topic_filter, conn_id, grant)
        self.cache.clear()

    def unsubscribe(self, conn_id: int, topic_filter: str) -> None:
        if self.local.remove(topic_filter, conn_id):
            self.cache.clear()

    def forget(self, conn_id: int, filters: Iterable[str]) -> None:
        """A connection ended: its subscriptions go with it. `filters`: every filter it asked for
        (`Connection.subs`), which include those served here. That list is the only one kept: a
        second here cost ~85 bytes a subscription and a scan of it per UNSUBSCRIBE."""
        removed = [topic_filter for topic_filter in filters if self.local.remove(topic_filter, conn_id)]
        if removed:
            self.cache.clear()


class RouteTables:
    """A `LocalRoutes` per tenant this worker has seen, in a CONNECT or in a ROUTES record; the
    default tenant's always."""

    __slots__ = ("identity", "direct", "far", "tables", "known", "default")

    def __init__(self, identity: bytes, direct: bool = False) -> None:
        self.identity = identity
        self.direct = direct
        self.far: set[str] = set()  # the other nodes' workers this one sends QoS 0 messages to itself
        self.tables: dict[str, LocalRoutes] = {}
        self.known = False  # as each table's `known`: whether the whole table came since the last HELLO
        self.default = self.of("")

    def of(self, tenant: str) -> LocalRoutes:
        """The table of `tenant`, made at its first sight (then as much known as the others)."""
        table = self.tables.get(tenant)
        if table is None:
            table = self.tables[tenant] = LocalRoutes(self.identity, self.direct, self.far)
            table.known = self.known
        return table

    def apply(self, whole: bool, entries: list[list]) -> None:
        """A ROUTES record: each [tenant, filter, places] entry to its tenant's table (`whole`: every
        table is replaced, those the record names no filter of emptied)."""
        by_tenant: dict[str, list[list]] = {}
        for entry in entries:
            by_tenant.setdefault(entry[0], []).append(entry)
        if whole:
            self.known = True
            for tenant in by_tenant:
                self.of(tenant)
            for tenant, table in self.tables.items():
                table.apply(True, by_tenant.get(tenant, []))
        else:
            for tenant, part in by_tenant.items():
                self.of(tenant).apply(False, part)

    def reach(self, far: set[str]) -> None:
        """The other nodes' workers it sends QoS 0 messages to itself from now on (workers/peers.py)."""
        if far != self.far:
            self.far.clear()
            self.far.update(far)
            for table in self.tables.values():
                table.cache.clear()

    def forget_table(self) -> None:
        """A new router: until its table comes, every message of every tenant goes to it."""
        self.known = False
        for table in self.tables.values():
            table.forget_table()
