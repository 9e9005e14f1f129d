"""Raw-socket steps shared by the end-to-end tests: connect, subscribe, publish, read with barriers.

Nothing sleeps: a SUBSCRIBE to an unused filter is a barrier (the worker wrote every delivery it got
before the SUBACK), and a PINGREQ after an ack is one (what the ack released is written first).
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from plexmq.mqtt import v4 as p
from plexmq.mqtt import v5
from tests.conftest import Broker, wait_for
from tests.mqtt import RawClient

BARRIER_PID = 0xBEEF
PINGREQ, PINGRESP = b"\xc0\x00", (0xD0, b"")


class Pub(NamedTuple):
    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    packet_id: int


def uid() -> str:
    return uuid.uuid4().hex[:10]


def connect(port: int, client_id: str | None = None, clean: bool = True) -> RawClient:
    c = RawClient(port)
    _present, rc = c.connect(client_id or f"c-{uid()}", clean)
    assert rc == 0
    return c


def as_pub(first: int, body: bytes) -> Pub:
    topic, packet_id, payload = p.decode_publish(first & 15, body)
    return Pub(topic, payload, (first >> 1) & 3, bool(first & 1), bool(first & 8), packet_id)


def read_until(c: RawClient, stop: Callable[[int, bytes], bool], ack: bool = True) -> list[Pub]:
    """The PUBLISHes that arrive before the packet `stop` accepts.

    With `ack`, QoS 1 gets PUBACK and QoS 2 gets PUBREC, and the QoS 2 flows are completed (PUBREL
    answered with PUBCOMP) before returning, so that no PUBREL is left for the next read.
    """
    pubs = []
    releasing: set[int] = set()
    stopped = False
    while not stopped or releasing:
        first, body = c.recv()
        if not stopped and stop(first, body):
            stopped = True
        elif first >> 4 == p.PUBLISH:
            pub = as_pub(first, body)
            pubs.append(pub)
            if ack and pub.qos == 1:
                c.send(p.encode_puback(pub.packet_id))
            elif ack and pub.qos == 2:
                c.send(p.encode_pubrec(pub.packet_id))
                releasing.add(pub.packet_id)
        elif first == 0x62 and ack:
            packet_id = p.decode_packet_id(2, body, 2)
            assert packet_id in releasing, f"PUBREL for {packet_id}, not awaited"
            releasing.discard(packet_id)
            c.send(p.encode_pubcomp(packet_id))
        else:
            raise AssertionError(f"unexpected packet {first:#x} {body!r}")
    return pubs


def subscribe(c: RawClient, packet_id: int, filters: list[tuple[str, int]]) -> list[int]:
    """SUBSCRIBE and the SUBACK's return codes (no PUBLISH may come first)."""
    c.send(p.encode_subscribe(packet_id, filters))
    first, body = c.recv()
    assert first == 0x90, f"expected SUBACK, got {first:#x}"
    got_pid, codes = p.decode_suback(0, body)
    assert got_pid == packet_id
    return codes


def sync(c: RawClient, ack: bool = True) -> list[Pub]:
    """Every PUBLISH the broker routed to `c` before now (see the module docstring).

    With `ack`, also what the acknowledgements release from the queue beyond the inflight window:
    PINGREQ rounds until one brings nothing (the worker writes what an ack released before PINGRESP).
    """
    c.send(p.encode_subscribe(BARRIER_PID, [(f"barrier/{uid()}", 0)]))
    got = read_until(c, lambda first, body: first == 0x90 and body[:2] == BARRIER_PID.to_bytes(2, "big"), ack)
    while ack:
        c.send(p.PINGREQ_PACKET)
        more = read_until(c, lambda first, body: first == 0xD0, ack)
        if not more:
            break
        got += more
    return got


def publish(c: RawClient, topic: str, payload: bytes, qos: int = 0, retain: bool = False, packet_id: int = 1) -> None:
    """PUBLISH from a client that subscribes to nothing, and complete its QoS flow."""
    c.send(p.encode_publish(topic.encode(), payload, qos, retain, packet_id=packet_id if qos else 0))
    pid = packet_id.to_bytes(2, "big")
    if qos == 1:
        assert c.recv() == (0x40, pid)
    elif qos == 2:
        assert c.recv() == (0x50, pid)
        c.send(p.encode_pubrel(packet_id))
        assert c.recv() == (0x70, pid)


def worker_of(broker: Broker, c: RawClient) -> int:
    def look() -> tuple[int] | None:
        try:
            return (broker.worker_of(c.local_port),)
        except AssertionError:
            return None
    return wait_for(look, 5, "the socket to reach a worker")[0]


def raw_on(broker: Broker, want: int | None = None, avoid: int | None = None) -> RawClient:
    """A raw socket (not yet CONNECTed) held by worker `want`, or by any worker but `avoid`.

    Sockets that land elsewhere stay open meanwhile, so that the balancer (least loaded first, from
    the counts the workers report) sends the next one to the other worker.
    """
    spare: list[RawClient] = []
    try:
        def attempt() -> RawClient | None:
            c = RawClient(broker.port)
            w = worker_of(broker, c)
            if (want is None or w == want) and (avoid is None or w != avoid):
                return c
            spare.append(c)
            return None
        return wait_for(attempt, 10, f"a socket on the wanted worker (want {want}, avoid {avoid})")
    finally:
        for c in spare:
            c.close()


def raw5(port: int, client_id: str = "", clean_start: bool = True, properties: dict | None = None,
         **kw: Any) -> tuple[RawClient, tuple[bool, int, dict]]:
    c = RawClient(port)
    return c, c.connect5(client_id or f"r5-{uid()}", clean_start, properties=properties, **kw)


def recv_publish(c: RawClient) -> tuple[str, int, bytes, dict, int]:
    """(topic, packet id, payload, properties, first byte) of the next packet, which must be a PUBLISH."""
    first, body = c.recv()
    assert first >> 4 == v5.PUBLISH, f"expected PUBLISH, got {first:#x} {body!r}"
    topic, packet_id, payload, props = v5.decode_publish(first & 15, body, from_server=True)
    return topic, packet_id, payload, props, first


def disconnect_of(c: RawClient) -> tuple[int, dict]:
    """The reason code and properties of the DISCONNECT the broker sends before it closes."""
    data = c.read_until_closed()
    found = v5.frame(data, 0, len(data) + 1)
    assert found is not None and found[0] == 0xE0, f"expected DISCONNECT, got {data!r}"
    return v5.decode_reason_only(v5.DISCONNECT, 0, data[found[1]:found[2]])


def subscribe5(c: RawClient, packet_id: int, filters: list[tuple[str, int]], properties: dict | None = None) -> list[int]:
    c.send(v5.encode_subscribe(packet_id, filters, properties))
    first, body = c.recv()
    assert first == 0x90, f"expected SUBACK, got {first:#x}"
    got, codes, _props = v5.decode_suback(v5.SUBACK, 0, body)
    assert got == packet_id
    return codes


def receive(c: RawClient, *, count: int | None = None, payloads: Iterable[bytes] = (), timeout: float = 5.0) -> list[Pub]:
    """The PUBLISHes to `c` until `count` have come, or every one of `payloads` has; each acknowledged
    (QoS 1: PUBACK, QoS 2: PUBREC, and PUBCOMP for its PUBREL, completed before returning).
    Fails when nothing comes for `timeout` seconds."""
    left = set(payloads)
    pubs: list[Pub] = []
    releasing: set[int] = set()
    out: list[bytes] = []

    def done() -> bool:
        return (len(pubs) >= count if count is not None else not left) and not releasing

    while not done():
        if out and p.frame(c.buf, 0, 1 << 28) is None:  # one write for the acks of one read
            c.send(b"".join(out))
            out.clear()
        try:
            first, body = c.recv(timeout)
        except TimeoutError:
            missing = sorted(left)[:5]
            raise AssertionError(f"nothing came for {timeout} s after {len(pubs)} messages "
                                 f"(still missing {len(left)}, e.g. {missing}; last: {pubs[-1:]})") from None
        if first >> 4 == p.PUBLISH:
            m = as_pub(first, body)
            pubs.append(m)
            left.discard(m.payload)
            if m.qos == 1:
                out.append(p.encode_puback(m.packet_id))
            elif m.qos == 2:
                assert m.packet_id not in releasing, f"PUBLISH with packet id {m.packet_id} while it awaits PUBREL"
                out.append(p.encode_pubrec(m.packet_id))
                releasing.add(m.packet_id)
        elif first == 0x62:
            packet_id = int.from_bytes(body[:2], "big")
            assert packet_id in releasing, f"PUBREL for packet id {packet_id}, which was not received"
            releasing.discard(packet_id)
            out.append(p.encode_pubcomp(packet_id))
        else:
            raise AssertionError(f"unexpected packet {first:#x} {body!r}")
    if out:
        c.send(b"".join(out))
    return pubs


def ping(c: RawClient) -> None:
    c.send(PINGREQ)
    assert c.recv() == PINGRESP


def from_address(port: int, source: str) -> RawClient:
    """A raw client whose socket is bound to `source` (any 127.0.0.x works on loopback)."""
    c = RawClient.__new__(RawClient)
    c.sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    c.buf = b""
    return c
