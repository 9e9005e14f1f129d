"""Records from the router, one handler each: `HANDLERS` maps a record's kind to its handler, and
`Worker.on_frame` runs every record of a frame through it (plexmq/wire.py defines the records).

The delivery handlers come first and do their work themselves: the dict lookup replaced an if-chain,
and no call was added per record.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from plexmq import wire
from plexmq.bans import Ban, BanSet
from plexmq.mqtt import PROTOCOLS, reasons, v5
from plexmq.mqtt import v4 as p
from plexmq.process import LINK_REFUSED
from plexmq.workers import trace_watch
from plexmq.workers.auth.logins import SERVER_UNAVAILABLE
from plexmq.workers.handlers.connect import refuse, refuse_banned
from plexmq.workers.states import CLOSED, CONNECTED, CONNECTING

if TYPE_CHECKING:
    from plexmq.workers.connection import Connection
    from plexmq.workers.worker import Worker

log = logging.getLogger("plexmq.worker")

_unpack_deliver = wire.unpack_deliver
_deliver_size = wire.DELIVER_HEAD.size
_iter_subs = wire.iter_subscribers
_subscriber_size = wire.SUBSCRIBER.size
_unpack_count, _count_size = wire.COUNT.unpack_from, wire.COUNT.size


def deliver_raw(worker: Worker, header: bytes, payload: bytes) -> None:
    """DELIVER_RAW: a run of plain QoS 0 packets of 3.1.1 clients for local subscribers."""
    if worker.shedding:
        worker.shed += (len(header) - _count_size) // _subscriber_size
        return
    worker.deliver_raw(_iter_subs(header[_count_size:]), payload, _unpack_count(header)[0], False)


def deliver_raw_v5(worker: Worker, header: bytes, payload: bytes) -> None:
    """DELIVER_RAW_V5: as DELIVER_RAW, the packets of 5.0 clients."""
    if worker.shedding:
        worker.shed += (len(header) - _count_size) // _subscriber_size
        return
    worker.deliver_raw(_iter_subs(header[_count_size:]), payload, _unpack_count(header)[0], True)


def deliver(worker: Worker, header: bytes, payload: bytes) -> None:
    """DELIVER: one message for local subscribers."""
    flags, topic_len = _unpack_deliver(header)
    qos = flags & 3
    retain = bool(flags & 4)
    dup = bool(flags & 8)
    start = _deliver_size + topic_len
    topic = header[_deliver_size:start]
    extra = None
    if flags & wire.HAS_EXTRA:
        props, expiry, start = wire.read_extra(header, start)
        extra = (props, expiry)
    worker.deliver_message(topic, payload, qos, retain, dup, extra, _iter_subs(header[start:]))


def routed(worker: Worker, header: bytes, payload: bytes) -> None:
    """ROUTED: the router took this many QoS 1/2 PUBs (of so many PUB and PUB0 records): now the
    publishers get PUBACK or PUBREC, in the order they sent them (denied ones and QoS 2 resends delivered
    here, which the router never saw, in their turn); those at the unmatched positions among them (5.0 only) reached nobody: 0x10;
    those at a position with REFUSED_AT were refused for their tenant's limit: 0x97.
    A ROUTED of an earlier join is ignored: what it confirmed has been sent again since."""
    link = worker.link
    if not link.current:
        return
    count, records, unmatched = wire.read_routed(header)
    link.unrouted -= records
    awaiting = worker.awaiting
    position = 0
    while awaiting and (count or awaiting[0][4] is None):
        conn, packet_id, qos, _retain, topic, _payload, _props, expiry = awaiting.popleft()
        if topic is None:
            code = expiry  # a placeholder's reason code (`Worker._acknowledge_in_turn`)
        else:
            code = 0
            if unmatched:  # rare: only exceptions travel
                code = reasons.NO_MATCHING_SUBSCRIBERS if position in unmatched else \
                    reasons.QUOTA_EXCEEDED if position | wire.REFUSED_AT in unmatched else 0
            count -= 1
            position += 1
        if conn.state != CLOSED:
            conn.acknowledge(packet_id, qos, code)


def routes(worker: Worker, header: bytes, payload: bytes) -> None:
    """ROUTES: apply who serves which filter, and say so once the peers have delivered what this worker
    sent them before (`Worker.answered`): the router releases a SUBACK that gave a filter a new place
    only when every worker has said so, so no message published before it reaches the new subscription
    by a peer's inbox that lagged behind its SUBACK."""
    gen, whole, entries = wire.Routes.decode(header)
    worker.routes.apply(whole, entries)
    owed = worker.peers.owed() if worker.peers is not None else ()
    if owed or worker.routes_acks:
        worker.routes_acks.append((gen, owed))
    else:
        worker.link.routes_ack(gen)


def traces(worker: Worker, header: bytes, payload: bytes) -> None:
    """TRACES: the console's live traces, watched from now on (workers/trace_watch.py), and say so; one of
    an earlier join is stale (the router says the set again to a worker that joins while any is live)."""
    if worker.link.this_join:
        gen, entries = wire.Traces.decode(header)
        worker.watching = trace_watch.watching(entries, worker.watching, worker.loop.time())
        worker.link.traces_ack(gen)


def bans(worker: Worker, header: bytes, payload: bytes) -> None:
    """BANS: the banned clients (plexmq/bans.py), the whole set or a change; the connected clients that
    a ban it adds names are closed (a 5.0 client hears DISCONNECT 0x98), those still waiting for their
    CONNACK refused (until its first BANS the worker lets every CONNECT wait for the router: connect.py
    `accept`), and the router told how many. One of an earlier join is stale (the router says the whole
    set to a worker that joins)."""
    if not worker.link.this_join:
        return
    gen, whole, added, removed = wire.Bans.decode(header)
    new = BanSet(Ban(*fields) for fields in added)
    held = worker.bans
    if whole or held is None:
        worker.bans = new
    else:
        for tenant, kind, value in removed:
            held.remove((tenant, kind, value))
        for made in new:
            held.add(made)
    closed = 0
    if new:
        now = time.time()
        for conn in list(worker.conns.values()):
            if conn.state == CONNECTED or conn.state == CONNECTING:
                found = new.match(conn.tenant, conn.client_id, (conn.username, conn.local_name), conn.peer, now)
                if found is None:
                    continue
                if conn.state == CONNECTING:  # still waiting for the router's answer (no CONNACK yet)
                    refuse_banned(conn, found)
                else:
                    conn.close(f"banned: {found.reason}" if found.reason else "banned", code=reasons.ADMINISTRATIVE_ACTION)
                closed += 1
    worker.link.bans_ack(gen, closed)


def session(worker: Worker, header: bytes, payload: bytes) -> None:
    """SESSION: the router's answer to a CONNECT: the session, or a refusal for one of the tenant's
    limits (CONNACK 0x9F for the connection rate, 0x97 for the others; 3.1.1: 0x03)."""
    conn_id, present, subs, refused = wire.Session.decode(header)
    conn = worker.conns.get(conn_id)
    if conn is None:
        return
    if not refused:
        conn.session_ready(present, subs)
        return conn.read_on()  # what the client sent after its CONNECT
    code = reasons.CONNECTION_RATE_EXCEEDED if refused == "max_connection_rate" else reasons.QUOTA_EXCEEDED
    refuse(conn, SERVER_UNAVAILABLE if conn.v5 is None else code, f"tenant {conn.tenant!r}: {refused} reached")


def suback(worker: Worker, header: bytes, payload: bytes) -> None:
    """SUBACK: the worker now serves the filters the router placed here itself (unless an UNSUBSCRIBE
    sent after the SUBSCRIBE took them out), and the client hears the codes in its version."""
    conn_id, packet_id, codes, placed = wire.Suback.decode(header)
    conn = worker.conns.get(conn_id)
    if conn is None:
        return
    conn.answered()
    asked = conn.subs or {}
    for topic_filter, grant in placed:
        if grant < 0 or topic_filter not in asked:
            conn.routes.unsubscribe(conn_id, topic_filter)
        else:
            conn.routes.subscribe(conn_id, topic_filter, grant)
    if conn.v5 is None:
        conn.write(p.encode_suback(packet_id, [code if code < 0x80 else 0x80 for code in codes]))
    else:
        conn.send5(partial(v5.encode_suback, packet_id, codes))


def unsuback(worker: Worker, header: bytes, payload: bytes) -> None:
    conn_id, packet_id, codes = wire.Unsuback.decode(header)
    conn = worker.conns.get(conn_id)
    if conn is None:
        return
    conn.answered()
    if conn.v5 is None:
        conn.write(p.encode_unsuback(packet_id))
    else:
        conn.send5(partial(v5.encode_unsuback, packet_id, list(codes)))


def resend_rel(worker: Worker, header: bytes, payload: bytes) -> None:
    conn_id, packet_id = wire.ResendRel.decode(header)
    conn = worker.conns.get(conn_id)
    if conn is not None:
        conn.resend_pubrel(packet_id)


def kick(worker: Worker, header: bytes, payload: bytes) -> None:
    """KICK: another connection took the session over; KICKED goes after this connection's last
    records, so that the session may move on."""
    (conn_id,) = wire.Kick.decode(header)
    conn = worker.conns.get(conn_id)
    if conn is not None:
        conn.kicked = True
        conn.close("taken over by a new connection with the same client id", code=reasons.SESSION_TAKEN_OVER)
    worker.link.kicked(conn_id)


def close(worker: Worker, header: bytes, payload: bytes) -> None:
    conn = worker.conns.get(wire.Close.decode(header).conn_id)
    if conn is not None:
        conn.close("disconnected by an administrator", code=reasons.ADMINISTRATIVE_ACTION)


def list_clients(worker: Worker, header: bytes, payload: bytes) -> None:
    """`plexmq clients` and the console: the connected clients whose id, username or address contains the
    filter (or whose id is it, `exact`), or all of them when this worker's label (NODE/wN) does; of the
    tenant and MQTT version asked for, if any; the first `most` in the order asked, and how many matched."""
    asked = wire.ListClients.decode(header)
    text, tenant, protocol = asked.filter, asked.tenant, asked.protocol
    everyone = not asked.exact and text in worker.label
    found = [c for c in worker.conns.values()
             if c.state == CONNECTED and (tenant is None or c.tenant == tenant)
             and (not protocol or PROTOCOLS[c.level] == protocol)
             and (c.client_id == text if asked.exact else
                  everyone or text in c.client_id or text in (c.username or "") or text in c.peer)]
    matched = len(found)
    if asked.most:
        pick = heapq.nlargest if asked.descending else heapq.nsmallest
        found = pick(asked.most, found, key=_sort_key(asked.sort))
    worker.link.clients(asked.id, worker.label, [
        [c.client_id, c.peer, c.keepalive, len(c.queue), len(c.inflight), c.persistent, PROTOCOLS[c.level], c.tenant,
         c.username or "", c.connected_at, c.messages_in, c.messages_out, c.bytes_in, c.bytes_out] for c in found],
        matched)


def _sort_key(field: str) -> Callable[[Connection], tuple]:
    """How LIST_CLIENTS sorts by a field of the rows (router/listing.py FIELDS): the connection's value in
    it, then its client id and tenant (the router's merge sorts the rows so)."""
    keys: dict[str, Callable[[Connection], object]] = {
        "worker": lambda c: 0, "address": lambda c: c.peer, "keepalive": lambda c: c.keepalive,
        "queued": lambda c: len(c.queue), "inflight": lambda c: len(c.inflight), "persistent": lambda c: c.persistent,
        "protocol": lambda c: c.level, "tenant": lambda c: c.tenant, "username": lambda c: c.username or "",
        "connected_at": lambda c: c.connected_at, "messages_in": lambda c: c.messages_in,
        "messages_out": lambda c: c.messages_out, "bytes_in": lambda c: c.bytes_in, "bytes_out": lambda c: c.bytes_out}
    value = keys.get(field, lambda c: c.client_id)
    return lambda c: (value(c), c.client_id, c.tenant)


def rejoin(worker: Worker, header: bytes, payload: bytes) -> None:
    if wire.Rejoin.decode(header).join == worker.link.join:  # else this join has begun since
        worker.rejoin("the router did not take its frames")


def beat(worker: Worker, header: bytes, payload: bytes) -> None:
    """BEAT: nothing to do; its frame counts (a lost one before it shows as a gap)."""


def refused(worker: Worker, header: bytes, payload: bytes) -> None:
    """REFUSED: the router speaks another protocol version (this worker is a node's, on another
    host): say both, and stop with LINK_REFUSED, which stops the node (acceptor/supervisor.py)."""
    theirs = wire.Refused.decode(header).protocol
    log.critical("the router speaks link protocol %d, this node %d: run the same plexmq version on both", theirs,
                 wire.PROTOCOL)
    worker.exit_status = LINK_REFUSED
    worker.loop.call_soon(worker.stop)  # not within the link's drain: stopping closes its socket


def standby(worker: Worker, header: bytes, payload: bytes) -> None:
    """STANDBY: the router this join went to is a standby: the worker follows the active one
    (workers/follow.py); one of an earlier join is stale. A gap before it is none of its business: a
    router that stepped down and came back as a standby numbers its answers from 0 again."""
    if worker.link.this_join:
        worker.follower.standby(*wire.Standby.decode(header))


def directory(worker: Worker, header: bytes, payload: bytes) -> None:
    """DIRECTORY: where the other nodes' workers take QoS 0 messages sent to them directly."""
    if worker.peers is not None:
        worker.peers.directory(wire.Directory.decode(header).endpoints)


def sync(worker: Worker, header: bytes, payload: bytes) -> None:
    """SYNC: answered at once, behind whatever this worker has sent (a claim of a client id among it)."""
    worker.link.synced(wire.Sync.decode(header).number)


HANDLERS: dict[int, Callable[[Worker, bytes, bytes], None]] = {
    wire.DELIVER_RAW: deliver_raw,
    wire.DELIVER_RAW_V5: deliver_raw_v5,
    wire.DELIVER: deliver,
    wire.ROUTED: routed,
    wire.ROUTES: routes,
    wire.SESSION: session,
    wire.SUBACK: suback,
    wire.UNSUBACK: unsuback,
    wire.RESEND_REL: resend_rel,
    wire.KICK: kick,
    wire.CLOSE: close,
    wire.LIST_CLIENTS: list_clients,
    wire.REJOIN: rejoin,
    wire.BEAT: beat,
    wire.REFUSED: refused,
    wire.STANDBY: standby,
    wire.TRACES: traces,
    wire.DIRECTORY: directory,
    wire.BANS: bans,
    wire.SYNC: sync,
}
