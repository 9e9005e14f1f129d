"""SUBSCRIBE and UNSUBSCRIBE in the router: the subscription trie, shared subscription groups and the
retained messages a new subscription gets, all of them the subscriber's tenant's (router/tenants.py).
A new `$SYS` subscription also gets the tenant's current `$SYS` figures as retained messages, made at
once (`sys_figures`, router/ops/stats.py) rather than kept: they are the broker's, not the tenant's, so
they take none of its max_retained_messages and never reach the store.

A part of `Router` (router/core.py), which holds the state named below.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from plexmq import grants, wire
from plexmq.mqtt.reasons import NO_SUBSCRIPTION_EXISTED, QUOTA_EXCEEDED, TOPIC_FILTER_INVALID
from plexmq.mqtt.topics import matches, shared, valid_subscription
from plexmq.router.message import Message
from plexmq.router.routes import ROUTER, RouteTable
from plexmq.router.sessions import Session
from plexmq.router.shared import SharedGroup
from plexmq.router.store.journal import Journal
from plexmq.router.tenants import Tenant

if TYPE_CHECKING:
    from plexmq.router.outbox import Share


class Subscribing:
    """Subscriptions: a session's filters in the trie (plain ones) or in their shared group."""

    by_conn_id: dict[tuple[bytes, int], Session]
    tenants: dict[str, Tenant]
    share_strategy: str
    journal: Journal
    routes: RouteTable
    sys_figures: Callable[[Tenant, float], Iterable[tuple[str, bytes]]] | None  # (topic, payload); None: no $SYS

    if TYPE_CHECKING:  # Router's (router/core.py)
        def out(self, worker: bytes) -> wire.ToWorker: ...

        def _deliver_one(self, session: Session, out: wire.ToWorker, topic: bytes, payload: bytes, qos: int,
                         retain: bool, props: bytes, expires_at: int, share: Share | None = None) -> bool: ...

    def _on_subscribe(self, worker: bytes, header: bytes, payload: bytes) -> None:
        conn_id, packet_id, filters = wire.Subscribe.decode(header)
        session = self.by_conn_id.get((worker, conn_id))
        if session is None:
            return
        tenant = self.tenants[session.tenant]
        out = self.out(worker)
        now = time.time()
        codes = []
        local = []  # [filter, routing grant, or -1 where the router serves it]: what its worker serves itself
        placed = False  # whether a filter got a new place: the SUBACK waits for the other workers
        retained: list[tuple[Message, int, bytes]] = []
        most = tenant.limits.max_subscriptions
        for topic_filter, grant in filters:
            if grants.refused(grant):  # by the worker: the reason code goes back as it is
                codes.append(grants.suback_code(grant))
                continue
            if most and packet_id and tenant.subscriptions >= most and topic_filter not in session.subs:
                tenant.hit("max_subscriptions")
                codes.append(QUOTA_EXCEEDED)  # 3.1.1 hears 0x80 (workers/from_router.py)
                continue
            codes.append(grants.suback_code(grant))
            new, added = self._subscribe(session, topic_filter, grant)
            placed = placed or added
            local.append([topic_filter, grants.routing(grant) if topic_filter in session.local else -1])
            self.journal.subscription_added(session, topic_filter, grant)
            # retained messages are never sent to a shared subscription (MQTT 5, section 4.8.2)
            if packet_id and grants.sends_retained(grant, new) and topic_filter not in tenant.groups:
                identifier = grant >> grants.ID_SHIFT
                ids = grants.identifier_property(identifier) if identifier else b""
                for _topic, message in tenant.retained.matching(topic_filter, now):
                    retained.append((message, min(grant & 3, message.qos), ids))
                if self.sys_figures is not None and topic_filter.startswith("$SYS"):
                    retained.extend((Message(topic.encode(), payload, 0, True), 0, ids)
                                    for topic, payload in self.sys_figures(tenant, now) if matches(topic_filter, topic))
        tenant.cache.clear()
        if not packet_id:
            return  # subscriptions registered again after a router restart: no SUBACK, no retained
        out.hold()
        if placed:
            out.gate()
        out.suback(conn_id, packet_id, codes, local)
        for message, qos, ids in retained:
            self._deliver_one(session, out, message.topic, message.payload, qos, True, message.props + ids,
                              message.expires_at)

    def _on_unsubscribe(self, worker: bytes, header: bytes, payload: bytes) -> None:
        conn_id, packet_id, filters = wire.Unsubscribe.decode(header)
        session = self.by_conn_id.get((worker, conn_id))
        if session is None:
            return
        codes = bytearray()
        for topic_filter in filters:
            if not valid_subscription(topic_filter):
                codes.append(TOPIC_FILTER_INVALID)  # no subscription could exist: say why (MQTT 5)
            elif self._unsubscribe(session, topic_filter):
                codes.append(0x00)
                self.journal.subscription_removed(session, topic_filter)
            else:
                codes.append(NO_SUBSCRIPTION_EXISTED)  # (MQTT 5 tells the client)
        self.tenants[session.tenant].cache.clear()
        out = self.out(worker)
        out.hold()
        out.unsuback(conn_id, packet_id, bytes(codes))

    def _subscribe(self, session: Session, topic_filter: str, grant: int) -> tuple[bool, bool]:
        """Index one subscription (a shared one joins its group): (whether the session did not have
        it, whether its filter got a new place in the route table)."""
        tenant = self.tenants[session.tenant]
        name = tenant.name
        new = topic_filter not in session.subs
        if new:
            tenant.subscriptions += 1
        else:
            self._unplace(session, topic_filter)
        session.subs[topic_filter] = grant
        share = shared(topic_filter)
        if share is None:
            routing = grants.routing(grant)
            tenant.trie.add(topic_filter, session, routing)
            if not session.persistent and session.worker is not None:  # not shared, of a clean session: its worker can serve it
                if not session.local:
                    session.local = set()
                session.local.add(topic_filter)
                return new, self.routes.add(name, topic_filter, session.worker)
            return new, self.routes.add(name, topic_filter, ROUTER)
        group = tenant.groups.get(topic_filter)
        added = False
        if group is None:
            group = tenant.groups[topic_filter] = SharedGroup(share[0], share[1], self.share_strategy)
            tenant.trie.add(group.filter, group, 0)
            added = self.routes.add(name, group.filter, ROUTER)
        group.join(session, grant)
        return new, added

    def _unsubscribe(self, session: Session, topic_filter: str) -> bool:
        """Remove one subscription of the session (a group left without members goes); whether it had it."""
        if topic_filter not in session.subs:
            return False
        tenant = self.tenants[session.tenant]
        self._unplace(session, topic_filter)
        del session.subs[topic_filter]
        tenant.subscriptions -= 1
        group = tenant.groups.get(topic_filter)
        if group is None:
            tenant.trie.remove(topic_filter, session)
        else:
            group.leave(session)
            if not group.members:
                del tenant.groups[topic_filter]
                tenant.trie.remove(group.filter, group)
                self.routes.remove(tenant.name, group.filter, ROUTER)
        return True

    def _unplace(self, session: Session, topic_filter: str) -> None:
        """Take a session's subscription out of the route table (a shared group's place stays while
        it has members)."""
        if topic_filter in session.local:
            session.local.remove(topic_filter)  # type: ignore[union-attr]  # holds it: a set, not the empty tuple
            self.routes.remove(session.tenant, topic_filter, session.worker)  # type: ignore[arg-type]  # local filters: an online session's
        elif topic_filter not in self.tenants[session.tenant].groups:
            self.routes.remove(session.tenant, topic_filter, ROUTER)
