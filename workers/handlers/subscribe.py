"""SUBSCRIBE and UNSUBSCRIBE: filters checked here (syntax, ACL), answered by the router (SUBACK,
UNSUBACK), which owns the subscriptions. Each filter goes to the router as its grant (plexmq/grants.py:
the options, with a 5.0 client's subscription identifier) or, refused, as its reason code (0x80 and
up), which comes back in the SUBACK; 3.1.1 clients see every refusal as 0x80. A client holds at most
max_subscriptions filters (counted in `conn.subs`, which holds a resumed session's too): each costs
the router and the worker memory, so a new one beyond them is refused, 0x97 (quota exceeded); a tenant
may set its own max_subscriptions_per_client instead. A tenant's max_qos caps each grant's QoS."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plexmq import grants
from plexmq.mqtt import properties as props
from plexmq.mqtt import reasons, v4, v5
from plexmq.mqtt.topics import subscribed, valid_subscription

if TYPE_CHECKING:
    from plexmq.workers.connection import Connection


def handle_subscribe(conn: Connection, flags: int, body: bytes) -> None:
    if conn.v5 is None:
        packet_id, filters = v4.decode_subscribe(flags, body)
        identifier = 0
    else:
        packet_id, filters, properties = v5.decode_subscribe(flags, body, conn.worker.settings.max_user_properties)
        identifier = properties.get(props.SUBSCRIPTION_IDENTIFIER, 0)  # type: ignore[assignment]  # a varint
    checker = conn.checker
    subs = conn.subs
    if subs is None:
        subs = conn.subs = {}
    limits = conn.limits
    most = conn.worker.settings.max_subscriptions if limits is None else limits.max_subscriptions
    wanted = []
    for topic_filter, options in filters:
        if not valid_subscription(topic_filter):
            grant = reasons.TOPIC_FILTER_INVALID
        elif checker is not None and not checker.can_subscribe(subscribed(topic_filter)):
            grant = reasons.NOT_AUTHORIZED  # a shared subscription: the ACL judges its filter
        elif topic_filter not in subs and len(subs) >= most:
            grant = reasons.QUOTA_EXCEEDED
            if limits is not None and limits.capped_subscriptions:
                conn.worker.counters.limit_hit(conn.tenant, "max_subscriptions_per_client")
        else:
            if limits is not None and options & 3 > limits.max_qos:  # granted at most its tenant's max_qos
                options = options & ~3 | limits.max_qos
                conn.worker.counters.limit_hit(conn.tenant, "max_qos")
            grant = grants.make(options, identifier)
            subs[topic_filter] = grant
            if checker is not None and not conn.screened and not checker.reads_all(subscribed(topic_filter)):
                conn.screened = True  # it may bring topics the client must not read: checked at delivery
        wanted.append([topic_filter, grant])
    conn.ask()
    conn.worker.link.subscribe(conn.conn_id, packet_id, wanted)


def handle_unsubscribe(conn: Connection, flags: int, body: bytes) -> None:
    if conn.v5 is None:
        packet_id, filters = v4.decode_unsubscribe(flags, body)
    else:
        packet_id, filters, _properties = v5.decode_unsubscribe(flags, body, conn.worker.settings.max_user_properties)
    if conn.subs:
        for f in filters:
            conn.subs.pop(f, None)
    for f in filters:  # no longer served here, at once: until UNSUBACK the router may still send some
        conn.routes.unsubscribe(conn.conn_id, f)
    conn.ask()
    conn.worker.link.unsubscribe(conn.conn_id, packet_id, filters)
