"""The worker's copy of the router's route table (router/routes.py) and the subscriptions it serves
itself: what lets it deliver a PUBLISH to its own subscribers without a hop through the router.

The router says which subscriptions are the worker's own (in their SUBACK) and which filters something
else serves (ROUTES). A message goes straight to the local subscribers only when no filter matching
its topic is served elsewhere; the caller also waits until the router has taken every PUB the worker
sent it before (`RouterLink.unrouted`), so that a topic that stops needing the router does not
overtake its own messages still on their way through it.

Each tenant has its own table (`RouteTables`): a filter served elsewhere in one tenant says nothing
about the same filter in another, and a connection matches its messages against its tenant's only
(`Connection.routes`, bound at CONNECT: the QoS 0 path pays no lookup for it).
"""

from __future__ import annotations

from collections.abc import Iterable

from plexmq.trie import SubscriptionTrie

CACHE_SIZE = 100_000
_UNKNOWN = object()
Subscriber = tuple[int, int, int]  # conn id, granted QoS, packet id (0: the connection numbers it), as on the wire


class LocalRoutes:
    """Filters served elsewhere, the worker's own subscriptions, and per topic what they mean."""

    __slots__ = ("own", "remote", "local", "known", "cache")

    def __init__(self, identity: bytes) -> None:
        self.own = identity.decode()  # this worker's place (its identity on the router link)
        self.remote = SubscriptionTrie()  # filters with a place other than this worker
        self.local = SubscriptionTrie()  # conn id -> granted QoS: the subscriptions served here
        self.known = False  # whether the table came since the last HELLO: until then all goes to the router
        self.cache: dict[bytes, tuple[Subscriber, ...] | None] = {}

    def targets(self, topic: bytes) -> tuple[Subscriber, ...] | None:
        """The local subscribers of a message to `topic` (empty: none), or None when the router must
        route it."""
        if not self.known:
            return None
        found = self.cache.get(topic, _UNKNOWN)
        if found is _UNKNOWN:
            name = topic.decode()
            if self.remote.match(name):
                found = None
            else:
                found = tuple([(conn_id, granted, 0) for conn_id, granted in self.local.match(name).items()])
            if len(self.cache) >= CACHE_SIZE:
                self.cache.clear()
            self.cache[topic] = found  # type: ignore[assignment]  # the local trie is keyed by conn id
        return found  # type: ignore[return-value]  # not _UNKNOWN by now

    def apply(self, whole: bool, entries: list[list]) -> None:
        """A ROUTES record: each filter with its places now (`whole`: the entire table)."""
        if whole:
            self.remote = SubscriptionTrie()
            self.known = True
        own = self.own
        remote = self.remote
        for _tenant, topic_filter, places in entries:
            if any(place != own for place in places):
                remote.add(topic_filter, 0, 0)
            else:
                remote.remove(topic_filter, 0)
        self.cache.clear()

    def forget_table(self) -> None:
        """A new router: until its table comes, every message goes to it."""
        self.known = False

    def subscribe(self, conn_id: int, topic_filter: str, qos: int) -> None:
        self.local.add(topic_filter, conn_id, qos)
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

    __slots__ = ("identity", "tables", "known", "default")

    def __init__(self, identity: bytes) -> None:
        self.identity = identity
        self.tables: dict[str, LocalRoutes] = {}
        self.known = False  # as each table's `known`: whether the whole table came since the last HELLO
        self.default = self.of("")

    def of(self, tenant: str) -> LocalRoutes:
        """The table of `tenant`, made at its first sight (then as much known as the others)."""
        table = self.tables.get(tenant)
        if table is None:
            table = self.tables[tenant] = LocalRoutes(self.identity)
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

    def forget_table(self) -> None:
        """A new router: until its table comes, every message of every tenant goes to it."""
        self.known = False
        for table in self.tables.values():
            table.forget_table()
