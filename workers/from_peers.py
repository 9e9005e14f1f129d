"""Records from the other workers of this host (workers/peers.py): QoS 0, 1 and 2 messages their clients published
to topics this worker's own subscribers want, delivered here as the worker delivers its own clients'
(`Worker.deliver_raw`, `Worker.deliver_message`: read access judged at delivery, shedding counted), to
the subscriptions it serves itself in the publisher's tenant (`LocalRoutes.local`); those with MQTT 5
options or identifiers each resolved for its own (`Worker.deliver_special`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plexmq import wire

if TYPE_CHECKING:
    from plexmq.workers.worker import Worker

_head_size = wire.PEER_HEAD.size
_unpack_head = wire.PEER_HEAD.unpack_from
_unpack_deliver = wire.unpack_deliver
_deliver_size = wire.DELIVER_HEAD.size
_unpack_count, _count_size = wire.COUNT.unpack_from, wire.COUNT.size


def deliver(worker: Worker, frame: bytes) -> None:
    """Every record of a peer's frame, to the subscribers it matches here."""
    tables = worker.routes
    for kind, header, payload in wire.records(frame):
        start = _head_size + _unpack_head(header)[0]
        tenant = header[_head_size:start].decode()
        routes = tables.of(tenant)
        extra = None
        qos = 0
        if kind == wire.PEER_MSG:
            flags, topic_len = _unpack_deliver(header, start)
            qos = flags & 3
            topic = header[start + _deliver_size:start + _deliver_size + topic_len]
            if flags & wire.HAS_EXTRA:
                props, expiry, _end = wire.read_extra(header, start + _deliver_size + topic_len)
                extra = (props, expiry)
            count = 1
        else:
            count = _unpack_count(header, start)[0]
            topic = header[start + _count_size:]
        subs, special = routes.served_here(topic)
        if not (subs or special):
            continue
        if worker.shedding and not qos:
            worker.shed += count * (len(subs) + len(special))
            continue
        copies = count * len(subs)
        if kind == wire.PEER_MSG:
            if subs:
                worker.deliver_message(topic, payload, qos, False, False, extra, subs)
            if special:
                copies += worker.deliver_special(special, topic, payload, qos, extra)
        else:
            if subs:
                worker.deliver_raw(subs, payload, count, kind == wire.PEER_RAW_V5)
            if special:
                copies += worker.deliver_special_run(special, topic, payload, kind == wire.PEER_RAW_V5)
        worker.counters.tally(tenant).sent += copies
    worker.flush_soon()
