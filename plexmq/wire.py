"""The worker↔router link protocol: every record, its kind number, its fields and how they are
encoded and decoded, in this one module (docs/architecture.md §3). It lives in plexmq/, beside the
other modules shared by both ends: router/ and workers/ import it, so the two ends of the link read
one definition.

A message is two ZeroMQ frames: the `LINK` tag (join, seq) that lets each end notice a lost or restarted
peer (router/links.py), then the records.

A frame is a run of records. Each record is `<BII` (kind, header length, payload length), then the
header, then the payload bytes copied raw. Records on the message path (PUB, PUB0, ACK, DELIVER,
DELIVER_RAW, ROUTED) have struct headers, packed and unpacked where they are sent and handled with
the struct methods named beside them here, so that no call is added per message. Every other record
is a NamedTuple below with `encode()` and `decode()`: a struct (REL, GONE, KICK ...) or an orjson
list or object (CONNECT, SESSION, SUBSCRIBE ...). One sender per record: `workers/link.py: RouterLink`
for the worker's, `ToWorker` below for the router's; records from the router are handled in
`workers/from_router.py`, records from a worker in `Router._handlers` (router/core.py).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

import orjson

# The version of this protocol, which HELLO carries: the router refuses a worker (a node on another
# host) of another version, and tells it so with REFUSED. Bump it with any change a peer of the other
# version would misread: a record's kind number, fields, their order or encoding, a struct, a new
# record kind a peer must understand. HELLO (an orjson object with a `protocol` key) and REFUSED
# (COUNT) keep their kind numbers and forms in every version, so that any two versions can tell.
# 2: CONNECT names the connection's tenant, ROUTES entries theirs; 3: SESSION may refuse, ROUTED may say
# REFUSED_AT (a tenant's limit); 4: STATS per tenant, CLIENTS entries and LIST_CLIENTS name a tenant;
# 5: STANDBY (a standby router answers a join); 6: STATS carries the sampled busiest topics; 7: TRACES,
# TRACES_ACK and TRACED (the console's traces observed by the workers), STATS carries their skipped counts;
# 9: HELLO says the worker's direct endpoint, DIRECTORY (the other nodes' workers a worker may send to
# itself), BANS and BANS_ACK (the banned clients, checked by the workers); DELIVER_RAW leads with its
# packets' COUNT, LIST_CLIENTS sorts, CLIENTS rows carry the client's figures, TRACES entries name the
# publishers traced; CONNECT says the connection's window (a 5.0 client's Receive Maximum bounds its
# session's in the router, a bridge's is its own); 10: SUBACK places a subscription with MQTT 5 options or
# an identifier on its worker too, with its routing grant where 9 had the QoS; PEER_RAW says its packets' COUNT;
# the workers of one host speak over Unix sockets (workers/host_links.py), not ZeroMQ; 11: CONNECT says when
# the connection claimed its client id, SYNC and SYNCED (router/claims.py)
PROTOCOL = 11

# -- kinds: the header's fields as they are sent (the records' classes below name them) ------------
# worker -> router
HELLO = 1  # Hello: opens a join (seq 0); the live connections are registered again by the records right after it
CONNECT = 2  # Connect; payload: the will's payload
SUBSCRIBE = 3  # Subscribe
UNSUBSCRIBE = 4  # Unsubscribe
PUB = 5  # PUB_HEAD (conn_id, packet id, flags) [+ EXTRA + properties when flags & HAS_EXTRA] + topic; payload
ACK = 6  # ACK_HEAD (conn_id, packet id, stage): a persistent session's subscriber acknowledged
REL = 7  # Rel: the client released an incoming QoS 2 message (PUBREL)
GONE = 8  # Gone
# PUB0_HEAD (count, conn_id) + topic; payload: that many plain QoS 0 PUBLISH packets of that connection to
# that topic (first byte 0x30) exactly as received
PUB0 = 9
STATS = 10  # Stats: once a second
CLIENTS = 11  # Clients: the answer to LIST_CLIENTS
SESSION_EXPIRY = 12  # SessionExpiry: a 5.0 client set its session expiry at DISCONNECT (0: ends with it)
PUB0_V5 = 13  # as PUB0, the packets of a 5.0 client (each with an empty property block)
ROUTES_ACK = 14  # RoutesAck: the worker has applied the ROUTES of this generation
BYE = 15  # nothing: a worker is stopping, its clients are closing: a node's is taken for dead at once
# (wills out); one of the router's own host, while the broker stops, is the last it reads of that worker
KICKED = 16  # Kicked: the connection a KICK named is closed (or was already): the worker's records of it are all ahead
TRACES_ACK = 17  # TracesAck: the worker has applied the TRACES of this generation
TRACED = 18  # Traced; payload: the message's payload, its first TRACED_PAYLOAD bytes: a copy for a console trace
BANS_ACK = 19  # BansAck: the worker has applied the BANS of this generation, and closed so many of its clients
SYNCED = 43  # Sync: the answer to SYNC: whatever this worker sent before it is ahead of it
# router -> worker
SESSION = 20  # Session: the answer to a CONNECT
SUBACK = 21  # Suback
UNSUBACK = 22  # Unsuback
# u32 counts (`pack_routed`, `read_routed`): this many of the worker's QoS>0 PUBs (in order) are routed,
# acknowledge them; of its PUB and PUB0 records, this many (QoS 0 ones may be confirmed late: router/core.py
# CONFIRM_INTERVAL); then the positions among those PUBs of the ones that asked (MATCH_ASKED) and matched
# no subscription, or, with REFUSED_AT added, were refused for a tenant's limit (not routed)
ROUTED = 23
DELIVER = 24  # DELIVER_HEAD (flags, topic length) + topic [+ EXTRA + properties when flags & HAS_EXTRA] + SUBSCRIBER * n; payload
RESEND_REL = 25  # ResendRel: resend PUBREL for an outgoing QoS 2 message after a reconnect
KICK = 26  # Kick: close this connection now (taken over); the router has dealt with its will
DELIVER_RAW = 27  # COUNT (packets) + SUBSCRIBER * n; payload: plain QoS 0 PUBLISH packets to write as they are to each
LIST_CLIENTS = 28  # ListClients: answer with CLIENTS
CLOSE = 29  # Close: close this connection (an administrator asked): 5.0 hears 0x98; GONE follows with its will
DELIVER_RAW_V5 = 30  # as DELIVER_RAW, 5.0 packets (from PUB0_V5): as they are to 5.0 subscribers
ROUTES = 31  # Routes: who serves each filter (router/routes.py); answer ROUTES_ACK
# Rejoin: the router did not take frames of that join (it restarted, frames were lost, or it took the
# worker for dead): say HELLO again
REJOIN = 32
BEAT = 33  # nothing: the router's heartbeat, once a second to every joined worker (a lost frame shows as a gap)
REFUSED = 34  # Refused: the router speaks another protocol version than the worker's HELLO: the worker stops
# Standby: this router is a standby (another holds the lease in the shared store): join another of `router`
STANDBY = 35
TRACES = 36  # Traces: the console's live traces, the whole set (router/trace.py); answer TRACES_ACK
# Directory: every joined worker's direct endpoint (a node's `direct_bind`), the whole map at each change
DIRECTORY = 37
BANS = 38  # Bans: the banned clients, the whole set at a join, else a change (router/bans.py); answer BANS_ACK
SYNC = 39  # Sync: answer SYNCED at once (router/claims.py: a persistent CONNECT waits for the host's other workers)
# worker -> worker of the same host (ipc), or of another node when both say a direct endpoint (tcp, QoS 0
# only; workers/peers.py): a message for the subscribers the receiving worker serves itself (its
# `LocalRoutes.local`), which it matches against its own table of the tenant; each frame carries its number
# (between nodes PEER_SEQ; workers/host_links.py frames those of one host), which the receiver sends back once
# it has delivered the frame
PEER_RAW = 40  # PEER_HEAD (tenant length) + tenant + COUNT (packets) + topic; payload: plain QoS 0 PUBLISH packets as received
PEER_RAW_V5 = 41  # as PEER_RAW, the packets of a 5.0 client
PEER_MSG = 42  # PEER_HEAD + tenant + DELIVER_HEAD (flags: QoS 0 or 1) + topic [+ EXTRA + properties]; payload: the message's

ACK_DONE = 1  # PUBACK (QoS 1) or PUBCOMP (QoS 2): the message is finished
ACK_RECEIVED = 2  # PUBREC (QoS 2): keep only the packet id until PUBCOMP
# Who numbers a delivery: the router every one of a persistent session, and a clean session's from a
# shared subscription, from this id up (the worker acknowledges those to the router); the worker the
# other QoS 1/2 deliveries of a clean session, below it.
ROUTER_PIDS_FROM = 32768

# A message from an MQTT 5 publisher may carry what travels with it to subscribers: its properties
# (payload format, content type, response topic, correlation data, user properties: the property
# entries as they are on the wire, without the block's length) and the time.time() second it expires
# at (0: never). Messages without either (all of 3.1.1) leave the flag off and carry nothing more.
HAS_EXTRA = 0x10  # in the flags of PUB and DELIVER
# in the flags of a 5.0 publisher's QoS 1/2 PUB: ROUTED says when it matched no subscription (its
# PUBACK or PUBREC says 0x10); only these exceptions travel
MATCH_ASKED = 0x20
# added to a position in ROUTED: that PUB was refused, not routed (a new retained message past its
# tenant's max_retained_messages or max_retained_bytes): its PUBACK or PUBREC says 0x97
REFUSED_AT = 1 << 31
EXTRA = struct.Struct("<IH")  # expiry, length of the properties that follow
TRACED_PAYLOAD = 1024  # bytes of a traced message's payload that its TRACED carries (and its trace keeps)

# -- structs, and the hot records' pack/unpack (the struct's own methods: no call added) -------------
LINK = struct.Struct("<IQ")  # join, seq
RECORD = struct.Struct("<BII")  # kind, header length, payload length
PUB_HEAD = struct.Struct("<IHB")  # conn_id, packet id, flags: qos | retain << 2 | HAS_EXTRA | MATCH_ASKED
pack_pub, unpack_pub = PUB_HEAD.pack, PUB_HEAD.unpack_from
PUB0_HEAD = struct.Struct("<II")  # count, conn_id (no local needs the publisher)
pack_pub0, unpack_pub0 = PUB0_HEAD.pack, PUB0_HEAD.unpack_from
ACK_HEAD = struct.Struct("<IHB")  # conn_id, packet id, stage (ACK_DONE, ACK_RECEIVED)
pack_ack, unpack_ack = ACK_HEAD.pack, ACK_HEAD.unpack
DELIVER_HEAD = struct.Struct("<BH")  # flags: qos | retain << 2 | dup << 3 | HAS_EXTRA; topic length
unpack_deliver = DELIVER_HEAD.unpack_from  # packed by `deliver_head`
SUBSCRIBER = struct.Struct("<IBH")  # conn_id, granted qos, packet id (0: the worker numbers it)
pack_subscriber, iter_subscribers = SUBSCRIBER.pack, SUBSCRIBER.iter_unpack
CONN_PID = struct.Struct("<IH")  # conn_id, packet id
GONE_HEAD = struct.Struct("<IB")  # conn_id, publish the will
CONN = struct.Struct("<I")
SESSION_EXPIRY_HEAD = struct.Struct("<II")  # conn_id, session expiry interval (seconds)
COUNT = struct.Struct("<I")
SYNC_HEAD = struct.Struct("<Q")  # the SYNC's number
PEER_HEAD = struct.Struct("<H")  # tenant length
PEER_SEQ = struct.Struct("<Q")  # a frame's number among those its sender sent to any peer

_pack_record = RECORD.pack
_pack_count, _COUNT_SIZE = COUNT.pack, COUNT.size
_unpack_record = RECORD.unpack_from
_record_size = RECORD.size


def pub_flags(qos: int, retain: bool, dup: bool = False) -> int:
    return qos | (retain << 2) | (dup << 3)


def deliver_head(topic: bytes, qos: int, retain: bool, dup: bool, props: bytes, expiry: int) -> bytes:
    """A DELIVER record's header up to its subscribers."""
    flags = pub_flags(qos, retain, dup)
    if props or expiry:
        return DELIVER_HEAD.pack(flags | HAS_EXTRA, len(topic)) + topic + extra(props, expiry)
    return DELIVER_HEAD.pack(flags, len(topic)) + topic


def pack_routed(counts: list[int]) -> bytes:
    """A ROUTED header: QoS 1/2 PUBs, PUB and PUB0 records, then the positions of the unmatched PUBs that asked."""
    return struct.pack(f"<{len(counts)}I", *counts)


def read_routed(header: bytes) -> tuple[int, int, tuple[int, ...]]:
    """(QoS 1/2 PUBs, PUB and PUB0 records, positions of those PUBs that matched nobody) of a ROUTED."""
    counts = struct.unpack(f"<{len(header) // 4}I", header)
    return counts[0], counts[1], counts[2:]


def extra(props: bytes, expiry: int) -> bytes:
    """What follows the topic of a message with properties or an expiry (set HAS_EXTRA in its flags)."""
    return EXTRA.pack(expiry, len(props)) + props


def read_extra(header: bytes, pos: int) -> tuple[bytes, int, int]:
    """(properties, expiry, position after them) of the EXTRA at header[pos]."""
    expiry, length = EXTRA.unpack_from(header, pos)
    start = pos + EXTRA.size
    return header[start:start + length], expiry, start + length


# -- the other records: one class each, its fields in the order they are sent -----------------------
# worker -> router


class Hello(NamedTuple):
    """HELLO, an orjson object."""

    protocol: int  # PROTOCOL of the worker's plexmq
    worker: int
    node: str  # "": all-in-one
    address: str  # what the router's listings show for a node
    pid: int
    live: list[int]  # the worker's live connections: its other sessions end with their wills
    direct: str = ""  # where other nodes' workers send it messages (workers/peers.py; "": through the router)

    def encode(self) -> bytes:
        return orjson.dumps(self._asdict())

    @classmethod
    def decode(cls, header: bytes) -> Hello:
        """A HELLO of another version is read only as far as its refusal names it (none from before
        versions were sent: 0)."""
        fields = orjson.loads(header)
        if fields.get("protocol") != PROTOCOL:
            return cls(fields.get("protocol", 0), fields.get("worker", 0), fields.get("node", ""), "", 0, [])
        return cls(**fields)


class Connect(NamedTuple):
    """CONNECT, an orjson list: a connection claims its client id (and the session). The list's third
    item is the negation of `persistent` (protocol 1 sends whether the session is clean)."""

    conn_id: int
    client_id: str
    persistent: bool  # the session outlives the connection (3.1.1 clean session 0, 5.0 session expiry > 0)
    username: str | None
    will_topic: str | None
    will_qos: int
    will_retain: bool
    # 0: the worker waits for SESSION to write the CONNACK; else the worker has sent the CONNACK
    # itself (a new clean session's connection, or one registered again after a router restart), no
    # SESSION answers, and this is the first packet id past those the worker still has in flight
    connack_sent: int
    fresh: bool  # an earlier session is discarded (3.1.1 clean session, 5.0 clean start)
    expiry: int  # seconds the session outlives the connection (5.0; -1: persistent_client_expiration)
    will_extra: list | None  # a 5.0 will's [delay, properties as they travel in hex, message expiry interval]
    tenant: str = ""  # the tenant the connection belongs to ("": the default tenant, plexmq/tenants.py)
    # QoS 1/2 deliveries in flight to it at most (the worker's `Outbound.window`: max_inflight, a 5.0
    # client's Receive Maximum below it, a bridge's Receive Maximum); 0: the router's max_inflight
    window: int = 0
    # time.monotonic_ns() when the connection first claimed its client id: the router orders the claims of
    # one host's workers by it, whose records reach it in no order (0: not known)
    claimed: int = 0

    def encode(self) -> bytes:
        fields = list(self)
        fields[2] = not self.persistent  # on the wire: clean
        return orjson.dumps(fields)

    @classmethod
    def decode(cls, header: bytes) -> Connect:
        fields = orjson.loads(header)
        fields[2] = not fields[2]  # on the wire: clean
        return cls._make(fields)


class Subscribe(NamedTuple):
    """SUBSCRIBE, an orjson list."""

    conn_id: int
    packet_id: int  # 0: registered again after a router restart, not answered
    filters: list[list]  # [filter, grant (plexmq/grants.py), or the reason code >= 0x80 the worker refused it with]

    def encode(self) -> bytes:
        return orjson.dumps(tuple(self))

    @classmethod
    def decode(cls, header: bytes) -> Subscribe:
        return cls._make(orjson.loads(header))


class Unsubscribe(NamedTuple):
    """UNSUBSCRIBE, an orjson list."""

    conn_id: int
    packet_id: int
    filters: list[str]

    def encode(self) -> bytes:
        return orjson.dumps(tuple(self))

    @classmethod
    def decode(cls, header: bytes) -> Unsubscribe:
        return cls._make(orjson.loads(header))


class Rel(NamedTuple):
    """REL, CONN_PID."""

    conn_id: int
    packet_id: int

    def encode(self) -> bytes:
        return CONN_PID.pack(*self)

    @classmethod
    def decode(cls, header: bytes) -> Rel:
        return cls._make(CONN_PID.unpack(header))


class Gone(NamedTuple):
    """GONE, GONE_HEAD: the connection closed."""

    conn_id: int
    publish_will: bool

    def encode(self) -> bytes:
        return GONE_HEAD.pack(*self)

    @classmethod
    def decode(cls, header: bytes) -> Gone:
        conn_id, publish_will = GONE_HEAD.unpack(header)
        return cls(conn_id, bool(publish_will))


class SessionExpiry(NamedTuple):
    """SESSION_EXPIRY, SESSION_EXPIRY_HEAD (GONE follows)."""

    conn_id: int
    expiry: int  # seconds the session outlives the connection (0: it ends with it)

    def encode(self) -> bytes:
        return SESSION_EXPIRY_HEAD.pack(*self)

    @classmethod
    def decode(cls, header: bytes) -> SessionExpiry:
        return cls._make(SESSION_EXPIRY_HEAD.unpack(header))


class Stats(NamedTuple):
    """STATS, an orjson object: a worker's counters, which the router publishes as $SYS and serves to
    Prometheus (router/ops/stats.py reads them as a dict)."""

    id: str  # the worker's label()
    node: str
    pid: int
    clients: int
    dropped: int
    denied: int
    withheld: int
    refused: int
    auth_failures: int
    queued: int
    protocols: dict[str, int]  # connected clients per MQTT version
    shed: int
    cpu: float
    rss: int
    local_received: int
    local_sent: int
    # tenant -> its numbers here: connections, received, sent, bytes_in, bytes_out, dropped, denied,
    # refused {reason: n}, limit_hits {limit: n} (workers/counters.py; {}: metrics_tenants = false)
    tenants: dict[str, dict]
    # tenant -> its busiest topics here since the last report, sampled: [[topic, estimated messages]]
    # (workers/topic_sample.py)
    topics: dict[str, list[list]]
    # [[trace id, messages it matched here since the last report that this worker's rate sent no TRACED for]]
    # (workers/trace_watch.py)
    traced: list[list]

    def encode(self) -> bytes:
        return orjson.dumps(self._asdict())

    @classmethod
    def decode(cls, header: bytes) -> Stats:
        return cls(**orjson.loads(header))


class Clients(NamedTuple):
    """CLIENTS, an orjson object: the answer to LIST_CLIENTS."""

    id: int  # the request's
    worker: str  # the worker's label()
    # [client_id, peer, keepalive, queued, inflight, persistent, MQTT version, tenant, username ("": none),
    # connected at (time.time()), messages in, messages out, bytes in, bytes out]
    clients: list[list]
    matched: int = 0  # how many matched, `clients` being the first `most` of them by the order asked

    def encode(self) -> bytes:
        return orjson.dumps(self._asdict())

    @classmethod
    def decode(cls, header: bytes) -> Clients:
        return cls(**orjson.loads(header))


class RoutesAck(NamedTuple):
    """ROUTES_ACK, COUNT."""

    gen: int

    def encode(self) -> bytes:
        return COUNT.pack(*self)

    @classmethod
    def decode(cls, header: bytes) -> RoutesAck:
        return cls._make(COUNT.unpack(header))


class Kicked(NamedTuple):
    """KICKED, CONN."""

    conn_id: int

    def encode(self) -> bytes:
        return CONN.pack(*self)

    @classmethod
    def decode(cls, header: bytes) -> Kicked:
        return cls._make(CONN.unpack(header))


class TracesAck(NamedTuple):
    """TRACES_ACK, COUNT."""

    gen: int

    def encode(self) -> bytes:
        return COUNT.pack(*self)

    @classmethod
    def decode(cls, header: bytes) -> TracesAck:
        return cls._make(COUNT.unpack(header))


class BansAck(NamedTuple):
    """BANS_ACK, an orjson list."""

    gen: int
    closed: int  # connections the bans it added closed

    def encode(self) -> bytes:
        return orjson.dumps(tuple(self))

    @classmethod
    def decode(cls, header: bytes) -> BansAck:
        return cls._make(orjson.loads(header))


class Traced(NamedTuple):
    """TRACED, an orjson list: a copy of a client's PUBLISH for a console trace (its payload, cut to
    TRACED_PAYLOAD bytes, is the record's payload). Bounded by the worker's rate per trace (workers/trace_watch.py)."""

    trace: int  # the trace's id, as TRACES named it
    topic: str
    qos: int
    retain: bool
    size: int  # the payload's full size
    client: str  # the publisher's client id
    at: float  # time.time() when the worker read it

    def encode(self) -> bytes:
        return orjson.dumps(tuple(self))

    @classmethod
    def decode(cls, header: bytes) -> Traced:
        return cls._make(orjson.loads(header))


# router -> worker


class Session(NamedTuple):
    """SESSION, an orjson list: write the CONNACK."""

    conn_id: int
    present: bool  # session present
    subs: list  # [filter, grant] of a present session (its worker judges them against the ACL)
    refused: str = ""  # the tenant's limit that refuses the connection (router/tenants.py), "": accepted

    def encode(self) -> bytes:
        return orjson.dumps(tuple(self))

    @classmethod
    def decode(cls, header: bytes) -> Session:
        return cls._make(orjson.loads(header))


class Suback(NamedTuple):
    """SUBACK, an orjson list."""

    conn_id: int
    packet_id: int
    codes: list[int]  # one per filter, the worker encodes them for the client's version
    placed: list[list]  # [filter, the routing grant its worker serves it with (plexmq/grants.py), or -1: the router does]

    def encode(self) -> bytes:
        return orjson.dumps(tuple(self))

    @classmethod
    def decode(cls, header: bytes) -> Suback:
        return cls._make(orjson.loads(header))


class Unsuback(NamedTuple):
    """UNSUBACK, CONN_PID + one reason code per filter (0x00 removed, 0x11 no subscription existed,
    0x8F not a filter)."""

    conn_id: int
    packet_id: int
    codes: bytes

    def encode(self) -> bytes:
        return CONN_PID.pack(self.conn_id, self.packet_id) + self.codes

    @classmethod
    def decode(cls, header: bytes) -> Unsuback:
        conn_id, packet_id = CONN_PID.unpack_from(header)
        return cls(conn_id, packet_id, header[CONN_PID.size:])


class ResendRel(NamedTuple):
    """RESEND_REL, CONN_PID."""

    conn_id: int
    packet_id: int

    def encode(self) -> bytes:
        return CONN_PID.pack(*self)

    @classmethod
    def decode(cls, header: bytes) -> ResendRel:
        return cls._make(CONN_PID.unpack(header))


class Kick(NamedTuple):
    """KICK, CONN."""

    conn_id: int

    def encode(self) -> bytes:
        return CONN.pack(*self)

    @classmethod
    def decode(cls, header: bytes) -> Kick:
        return cls._make(CONN.unpack(header))


class ListClients(NamedTuple):
    """LIST_CLIENTS, an orjson object: `plexmq clients`."""

    id: int  # the request's, which CLIENTS names
    filter: str  # the clients whose id, username or address contains it (`exact`: whose id is it)
    tenant: str | None  # only the clients of this tenant (None: of every tenant)
    protocol: str = ""  # only the clients of this MQTT version ("3.1", "3.1.1", "5.0"; "": any)
    exact: bool = False  # `filter` is a whole client id
    most: int = 0  # rows at most, the first by `sort` (0: all); CLIENTS says how many matched
    sort: str = "client_id"  # a field of the rows (router/listing.py FIELDS); ties go by client id, then tenant
    descending: bool = False

    def encode(self) -> bytes:
        return orjson.dumps(self._asdict())

    @classmethod
    def decode(cls, header: bytes) -> ListClients:
        return cls(**orjson.loads(header))


class Close(NamedTuple):
    """CLOSE, CONN."""

    conn_id: int

    def encode(self) -> bytes:
        return CONN.pack(*self)

    @classmethod
    def decode(cls, header: bytes) -> Close:
        return cls._make(CONN.unpack(header))


class Routes(NamedTuple):
    """ROUTES, an orjson list; it leads the frame."""

    gen: int
    whole: bool  # the whole table, else the changes of this generation
    entries: list[list]  # [tenant, filter, [place (a worker's identity, or the router's), ...]]

    def encode(self) -> bytes:
        return orjson.dumps(tuple(self))

    @classmethod
    def decode(cls, header: bytes) -> Routes:
        return cls._make(orjson.loads(header))


class Traces(NamedTuple):
    """TRACES, an orjson list: every live trace, sent whole at each change (and to a worker that joins
    while any is live)."""

    gen: int  # one more at each change of the set
    traces: list[list]  # [trace id, tenant, filter, by, value]: of the publishers whose `by` is `value` ("": all)

    def encode(self) -> bytes:
        return orjson.dumps(tuple(self))

    @classmethod
    def decode(cls, header: bytes) -> Traces:
        return cls._make(orjson.loads(header))


class Sync(NamedTuple):
    """SYNC and SYNCED, SYNC_HEAD."""

    number: int

    def encode(self) -> bytes:
        return SYNC_HEAD.pack(*self)

    @classmethod
    def decode(cls, header: bytes) -> Sync:
        return cls._make(SYNC_HEAD.unpack(header))


class Directory(NamedTuple):
    """DIRECTORY, an orjson object: each joined worker (its identity) that takes messages from other
    nodes' workers, and where (tcp://HOST:PORT, CURVE as the router link)."""

    endpoints: dict[str, str]

    def encode(self) -> bytes:
        return orjson.dumps(self.endpoints)

    @classmethod
    def decode(cls, header: bytes) -> Directory:
        return cls(orjson.loads(header))
class Bans(NamedTuple):
    """BANS, an orjson list: the banned clients (plexmq/bans.py), the whole set to a worker that joins,
    else what one change added and lifted."""

    gen: int  # one more at each change of the set
    whole: bool  # `added` is the whole set: whatever the worker held before goes
    added: list[list]  # Ban's fields, in its order
    removed: list[list]  # [tenant, kind, value]

    def encode(self) -> bytes:
        return orjson.dumps(tuple(self))

    @classmethod
    def decode(cls, header: bytes) -> Bans:
        return cls._make(orjson.loads(header))


class Rejoin(NamedTuple):
    """REJOIN, COUNT."""

    join: int

    def encode(self) -> bytes:
        return COUNT.pack(*self)

    @classmethod
    def decode(cls, header: bytes) -> Rejoin:
        return cls._make(COUNT.unpack(header))


class Standby(NamedTuple):
    """STANDBY, an orjson list: a standby router's answer to any frame of a worker (router/ha/standby.py)."""

    router: str  # the standby's name (router_name)
    active: str  # the active router's advertised link endpoint, as the lease names it; "" when unknown

    def encode(self) -> bytes:
        return orjson.dumps(tuple(self))

    @classmethod
    def decode(cls, header: bytes) -> Standby:
        return cls._make(orjson.loads(header))


class Refused(NamedTuple):
    """REFUSED, COUNT."""

    protocol: int  # the router's PROTOCOL

    def encode(self) -> bytes:
        return COUNT.pack(*self)

    @classmethod
    def decode(cls, header: bytes) -> Refused:
        return cls._make(COUNT.unpack(header))


class ProtocolMismatch(Exception):
    """A HELLO of another protocol version: nothing after it in its frame is read."""


# -- framing ------------------------------------------------------------------------------------------


class Batch:
    """The records for one peer produced during one loop turn, sent as one frame, or split where
    `hold()` marked the records that may leave only once the turn is stored, or `gate()` those that
    wait until the other workers have applied a change of the route table (router/routes.py)."""

    __slots__ = ("parts", "held", "gated")

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.held = -1  # index in parts of the first record that waits for the store's commit
        self.gated = -1  # index in parts of the first record that waits for the other workers

    def add(self, kind: int, header: bytes, payload: bytes = b"") -> None:
        parts = self.parts
        parts.append(_pack_record(kind, len(header), len(payload)))
        parts.append(header)
        if payload:
            parts.append(payload)

    def hold(self) -> None:
        """The next record (an acknowledgement) and all after it wait for the commit."""
        if self.held < 0:
            self.held = len(self.parts)

    def gate(self) -> None:
        """The next record (a SUBACK) and all after it wait for the other workers."""
        if self.gated < 0:
            self.gated = len(self.parts)

    def __bool__(self) -> bool:
        return bool(self.parts)

    def take(self) -> bytes:
        """The frame, leaving the batch empty."""
        frame = b"".join(self.parts)
        self.parts.clear()
        self.held = self.gated = -1
        return frame

    def take_split(self) -> tuple[bytes, bytes, bool]:
        """(what may leave now, what waits, whether it waits for the other workers and not only for
        the commit), leaving the batch empty."""
        parts, held, gated = self.parts, self.held, self.gated
        cut = held if gated < 0 else gated if held < 0 else min(held, gated)
        if cut < 0:
            return self.take(), b"", False
        now, later = b"".join(parts[:cut]), b"".join(parts[cut:])
        parts.clear()
        self.held = self.gated = -1
        return now, later, gated >= 0


class ToWorker(Batch):
    """The router's batch for one worker: one sender per record the router sends (ROUTES, which
    leads a frame, is made by router/routes.py). DELIVER and DELIVER_RAW append their parts here
    themselves, as `add` would: no call more per record."""

    __slots__ = ()

    def session(self, conn_id: int, present: bool, subs: list, refused: str = "") -> None:
        self.add(SESSION, Session(conn_id, present, subs, refused).encode())

    def suback(self, conn_id: int, packet_id: int, codes: list[int], placed: list[list]) -> None:
        self.add(SUBACK, Suback(conn_id, packet_id, codes, placed).encode())

    def unsuback(self, conn_id: int, packet_id: int, codes: bytes) -> None:
        self.add(UNSUBACK, Unsuback(conn_id, packet_id, codes).encode())

    def routed(self, counts: list[int]) -> None:
        self.add(ROUTED, pack_routed(counts))

    def deliver(self, head: bytes, subs: bytes, payload: bytes) -> None:
        """`head`: `deliver_head`; `subs`: packed SUBSCRIBERs."""
        parts = self.parts
        parts.append(_pack_record(DELIVER, len(head) + len(subs), len(payload)))
        parts.append(head)
        parts.append(subs)
        if payload:
            parts.append(payload)

    def deliver_raw(self, subs: bytes, packets: bytes, form: int, count: int) -> None:
        """`packets`: `count` plain QoS 0 PUBLISH packets as a client sent them (`form` 1: a 5.0 client)."""
        parts = self.parts
        parts.append(_pack_record(DELIVER_RAW_V5 if form else DELIVER_RAW, _COUNT_SIZE + len(subs), len(packets)))
        parts.append(_pack_count(count))
        parts.append(subs)
        parts.append(packets)

    def resend_rel(self, conn_id: int, packet_id: int) -> None:
        self.add(RESEND_REL, ResendRel(conn_id, packet_id).encode())

    def kick(self, conn_id: int) -> None:
        self.add(KICK, Kick(conn_id).encode())

    def list_clients(self, asked: ListClients) -> None:
        self.add(LIST_CLIENTS, asked.encode())

    def close(self, conn_id: int) -> None:
        self.add(CLOSE, Close(conn_id).encode())

    def rejoin(self, join: int) -> None:
        self.add(REJOIN, Rejoin(join).encode())

    def traces(self, gen: int, traces: list[list]) -> None:
        self.add(TRACES, Traces(gen, traces).encode())

    def directory(self, endpoints: dict[str, str]) -> None:
        self.add(DIRECTORY, Directory(endpoints).encode())
    def bans(self, told: Bans) -> None:
        self.add(BANS, told.encode())

    def beat(self) -> None:
        self.add(BEAT, b"")

    def sync(self, number: int) -> None:
        self.add(SYNC, Sync(number).encode())

    def refused(self) -> None:
        """The worker's HELLO was of another protocol version: this router's goes back."""
        self.add(REFUSED, Refused(PROTOCOL).encode())


def identity(node: str, worker_id: int) -> bytes:
    """A worker's identity on the router link, unique across nodes (all-in-one: `w0`, `w1`, ...)."""
    return (f"{node}/w{worker_id}" if node else f"w{worker_id}").encode()


def label(node: str, worker_id: int) -> str:
    """How a worker is named in $SYS, /metrics and the listings (all-in-one: `0`, `1`, ...)."""
    return f"{node}/{worker_id}" if node else str(worker_id)


def record(kind: int, header: bytes) -> bytes:
    """One record without a payload, to lead a frame."""
    return _pack_record(kind, len(header), 0) + header


def records(frame: bytes) -> Iterator[tuple[int, bytes, bytes]]:
    """Split a frame into (kind, header, payload) records."""
    pos = 0
    end = len(frame)
    while pos < end:
        kind, hlen, plen = _unpack_record(frame, pos)
        pos += _record_size
        hend = pos + hlen
        pend = hend + plen
        if pend > end:
            raise ValueError("truncated record in frame")
        yield kind, frame[pos:hend], frame[hend:pend]
        pos = pend
