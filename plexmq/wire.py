"""The messages workers and the router exchange: one ZeroMQ message per peer per loop turn.

A message is two frames: the `LINK` tag (join, seq) that lets each end notice a lost or restarted
peer (router/links.py), then the records.

A frame is a run of records. Each record is `<BII` (kind, header length, payload length), then the
header, then the payload bytes copied raw. Hot records (PUB, DELIVER, ROUTED, ACK, REL, GONE, KICK)
have struct headers; rare control records (CONNECT, SESSION, SUBSCRIBE ...) carry an orjson header.
The router owns this protocol; workers import it (DESIGN.md: acceptor -> workers -> router).
"""

from __future__ import annotations

import struct
from typing import Any, Iterator

import orjson

# worker -> router
HELLO = 1  # orjson {"worker": n, "node": name, "address", "pid", "live": [conn, ...]}: opens a join (seq 0); the live connections are registered again right after it
CONNECT = 2  # orjson [conn, client_id, clean, username, will_topic|None, will_qos, will_retain, resume (0, or next pid: the worker sent the CONNACK itself, answer no SESSION), fresh]; payload: will payload
SUBSCRIBE = 3  # orjson [conn, packet_id (0: registered again after a router restart, not answered), [[filter, qos, or the reason code >= 0x80 it was refused with], ...]]
UNSUBSCRIBE = 4  # orjson [conn, packet_id, [filter, ...]]
PUB = 5  # PUB_HEAD (conn, packet_id, flags) [+ EXTRA + properties when flags & HAS_EXTRA] + topic; payload
ACK = 6  # ACK_HEAD (conn, packet_id, stage): a persistent session's subscriber acknowledged
REL = 7  # CONN_PID (conn, packet_id): the client released an incoming QoS 2 message (PUBREL)
GONE = 8  # GONE_HEAD (conn, publish_will)
STATS = 10  # orjson {"id": label(), "node", "pid", "clients", "dropped", "denied", "refused", "auth_failures", "queued", "shed", "cpu", "rss"}
CLIENTS = 11  # orjson {"id": request, "worker": label(), "clients": [[client_id, peer, keepalive, queued, inflight, persistent]]}
SESSION_EXPIRY = 12  # SESSION_EXPIRY_HEAD: a 5.0 client set its session expiry at DISCONNECT (0: ends with it)
PUB0 = 9  # PUB0_HEAD (count, conn) + topic; payload: that many plain QoS 0 PUBLISH packets of that connection to that topic (first byte 0x30) exactly as received
PUB0_V5 = 13  # as PUB0, the packets of a 5.0 client (each with an empty property block)
BYE = 15  # nothing: a node's worker is stopping and has closed its clients: taken for dead at once (wills out)
KICKED = 16  # CONN: the connection a KICK named is closed (or was already): the worker's records of it are all ahead
# router -> worker
SESSION = 20  # orjson [conn, session_present, [[filter, grant], ...] of a present session (its worker judges them against the ACL)]
SUBACK = 21  # orjson [conn, packet_id, [code, ...], [[filter, QoS its worker serves it with, or -1: the router does], ...]]
UNSUBACK = 22  # CONN_PID + one reason code per filter (0x00 removed, 0x11 no subscription existed)
ROUTED = 23  # u32 counts (`routed`, `read_routed`): this many of the worker's QoS>0 PUBs (in order) are routed, acknowledge them; of its PUB and PUB0 records, this many (QoS 0 ones may be confirmed late: router/core.py CONFIRM_INTERVAL); then the positions among those PUBs of the ones that asked (MATCH_ASKED) and matched no subscription
DELIVER = 24  # DELIVER_HEAD (flags, topic length) + topic [+ EXTRA + properties when flags & HAS_EXTRA] + SUBSCRIBER * n; payload
RESEND_REL = 25  # CONN_PID: resend PUBREL for an outgoing QoS 2 message after a reconnect
KICK = 26  # CONN: close this connection now (taken over); the router has dealt with its will
LIST_CLIENTS = 28  # orjson {"id": request, "filter": text}: answer with CLIENTS
CLOSE = 29  # CONN: close this connection (an administrator asked): 5.0 hears 0x98; GONE follows with its will
DELIVER_RAW = 27  # SUBSCRIBER * n; payload: plain QoS 0 PUBLISH packets to write as they are to each
DELIVER_RAW_V5 = 30  # as DELIVER_RAW, 5.0 packets (from PUB0_V5): as they are to 5.0 subscribers
REJOIN = 32  # COUNT (join): the router did not take frames of that join (it restarted, frames were lost, or it took the worker for dead): say HELLO again
BEAT = 33  # nothing: the router's heartbeat, once a second to every joined worker (a lost frame shows as a gap)
ROUTES = 31  # orjson [generation, whole, [[filter, [place, ...]], ...]]: who serves each filter (router/routes.py); answer ROUTES_ACK
# worker -> router
ROUTES_ACK = 14  # COUNT: the worker has applied the ROUTES of this generation

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
EXTRA = struct.Struct("<IH")  # expiry, length of the properties that follow

LINK = struct.Struct("<IQ")  # join, seq
RECORD = struct.Struct("<BII")
PUB_HEAD = struct.Struct("<IHB")  # flags: qos | retain << 2 | HAS_EXTRA
ACK_HEAD = struct.Struct("<IHB")
CONN_PID = struct.Struct("<IH")
GONE_HEAD = struct.Struct("<IB")
CONN = struct.Struct("<I")
SESSION_EXPIRY_HEAD = struct.Struct("<II")  # conn, session expiry interval (seconds)
COUNT = struct.Struct("<I")
PUB0_HEAD = struct.Struct("<II")  # count, conn (no local needs the publisher)
DELIVER_HEAD = struct.Struct("<BH")  # flags: qos | retain << 2 | dup << 3 | HAS_EXTRA
SUBSCRIBER = struct.Struct("<IBH")  # conn, granted qos, packet id (0: the worker numbers it)

_pack_record = RECORD.pack
_unpack_record = RECORD.unpack_from
_record_size = RECORD.size


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

    def add_json(self, kind: int, header: Any, payload: bytes = b"") -> None:
        self.add(kind, orjson.dumps(header), payload)

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


def pub_flags(qos: int, retain: bool, dup: bool = False) -> int:
    return qos | (retain << 2) | (dup << 3)


def deliver_head(topic: bytes, qos: int, retain: bool, dup: bool, props: bytes, expiry: int) -> bytes:
    """A DELIVER record's header up to its subscribers."""
    flags = pub_flags(qos, retain, dup)
    if props or expiry:
        return DELIVER_HEAD.pack(flags | HAS_EXTRA, len(topic)) + topic + extra(props, expiry)
    return DELIVER_HEAD.pack(flags, len(topic)) + topic


def routed(counts: list[int]) -> bytes:
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
