"""Raw MQTT clients of both versions joined to a tenant (issue 23), for the isolation matrix
(tests/test_tenants.py): CONNECT with a username that names the tenant, SUBSCRIBE, PUBLISH with its
whole QoS flow, and `sync`, the SUBSCRIBE barrier of tests/steps.py spoken in 3.1.1 or 5.0.

A SUBSCRIBE is a barrier: the router answers it after every PUBLISH it routed before, and the worker
writes what it got first; so once a publisher has its PUBACK (or, for QoS 0, the PUBACK of a later
QoS 1 of its own: `fence`), a subscriber's `sync` returns everything that message brought it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import NamedTuple

from plexmq.mqtt import properties as P
from plexmq.mqtt import v4, v5
from plexmq.mqtt.connect import Will
from tests.conftest import Broker, wait_for
from tests.mqtt import RawClient
from tests.steps import BARRIER_PID, uid

SEPARATOR = "@"
DEFAULT = ""  # the default tenant
LEVELS = {4: "3.1.1", 5: "5.0"}  # CONNECT protocol level -> the MQTT version, for test ids
NO_MATCHING_SUBSCRIBERS = 0x10


def user(tenant: str, name: str = "x") -> str:
    """The username that joins `tenant` ("" : the default tenant, a username without the separator)."""
    return f"{name}{SEPARATOR}{tenant}" if tenant else name


def shown(tenant: str) -> str:
    return tenant or "default"


OPEN: list[Peer] = []  # every Peer made, for the test module to close after each test


class Msg(NamedTuple):
    topic: str
    payload: bytes
    qos: int
    retain: bool


class Peer:
    """A raw client CONNECTed in a tenant with MQTT 3.1.1 (level 4) or 5.0 (level 5)."""

    def __init__(self, raw: RawClient, level: int, tenant: str, client_id: str, present: bool) -> None:
        self.raw, self.level, self.tenant, self.client_id, self.present = raw, level, tenant, client_id, present
        self.v5 = level == 5
        OPEN.append(self)

    def send(self, data: bytes) -> None:
        self.raw.send(data)

    def subscribe(self, filters: list[tuple[str, int]], packet_id: int = 1) -> list[int]:
        """SUBSCRIBE and the SUBACK's codes (nothing may come before it)."""
        codec = v5 if self.v5 else v4
        self.send(codec.encode_subscribe(packet_id, filters))
        first, body = self.raw.recv()
        assert first == 0x90, f"expected SUBACK, got {first:#x} {body!r}"
        if self.v5:
            got, codes, _props = v5.decode_suback(v5.SUBACK, 0, body)
        else:
            got, codes = v4.decode_suback(0, body)
        assert got == packet_id
        return codes

    def unsubscribe(self, filters: list[str], packet_id: int = 2) -> None:
        """UNSUBSCRIBE, answered by an UNSUBACK (nothing may come before it)."""
        self.send((v5 if self.v5 else v4).encode_unsubscribe(packet_id, filters))
        first, body = self.raw.recv()
        assert first == 0xB0 and body[:2] == packet_id.to_bytes(2, "big"), f"expected UNSUBACK, got {first:#x} {body!r}"
        if self.v5:
            assert set(body[3:]) <= {0}, f"UNSUBACK reasons {body[3:]!r}"  # past the (empty) properties

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False, packet_id: int = 1,
                properties: dict | None = None) -> None:
        """PUBLISH from a client that is not subscribed to it, its QoS flow completed."""
        pid = packet_id if qos else 0
        if self.v5:
            self.send(v5.encode_publish(topic.encode(), payload, qos, retain, packet_id=pid, properties=properties))
        else:
            self.send(v4.encode_publish(topic.encode(), payload, qos, retain, packet_id=pid))
        if qos == 1:
            self._ack(0x40, packet_id)
        elif qos == 2:
            self._ack(0x50, packet_id)
            self.send(v4.encode_pubrel(packet_id))  # the same bytes in 5.0 (success, no properties)
            self._ack(0x70, packet_id)

    def _ack(self, first_byte: int, packet_id: int) -> None:
        first, body = self.raw.recv()
        assert first == first_byte, f"expected {first_byte:#x}, got {first:#x} {body!r}"
        assert body[:2] == packet_id.to_bytes(2, "big")
        if self.v5 and len(body) > 2:
            assert body[2] in (0, NO_MATCHING_SUBSCRIBERS), f"reason {body[2]:#x}"

    def fence(self) -> None:
        """Once this returns, the QoS 0 PUBLISHes this client sent before are routed (the router, or
        the worker's local path, takes a connection's PUBLISHes in order)."""
        self.publish(f"fence/{uid()}", b"", 1, packet_id=0xFE)

    def sync(self) -> list[Msg]:
        """Every PUBLISH routed to this client before now, each acknowledged (see the docstring)."""
        self.send((v5 if self.v5 else v4).encode_subscribe(BARRIER_PID, [(f"barrier/{uid()}", 0)]))
        got = self._read(lambda first, body: first == 0x90 and body[:2] == BARRIER_PID.to_bytes(2, "big"))
        while True:  # what the acks released beyond the inflight window comes before PINGRESP
            self.send(v4.PINGREQ_PACKET)
            more = self._read(lambda first, body: first == 0xD0)
            if not more:
                return got
            got += more

    def _read(self, stop: Callable[[int, bytes], bool], take: int = 0) -> list[Msg]:
        """The PUBLISHes before the packet `stop` accepts (or the first `take` of them), acknowledged."""
        got: list[Msg] = []
        releasing: set[int] = set()
        stopped = False
        while not stopped or releasing:
            if take and len(got) == take:
                assert not releasing, "a QoS 2 PUBLISH taken alone"
                break
            first, body = self.raw.recv()
            if not stopped and stop(first, body):
                stopped = True
            elif first >> 4 == v4.PUBLISH:
                qos = (first >> 1) & 3
                if self.v5:
                    topic, packet_id, payload, _props = v5.decode_publish(first & 15, body, from_server=True)
                else:
                    topic, packet_id, payload = v4.decode_publish(first & 15, body)
                got.append(Msg(topic, bytes(payload), qos, bool(first & 1)))
                if qos == 1:
                    self.send(v4.encode_puback(packet_id))
                elif qos == 2:
                    self.send(v4.encode_pubrec(packet_id))
                    releasing.add(packet_id)
            elif first == 0x62:
                packet_id = int.from_bytes(body[:2], "big")
                assert packet_id in releasing, f"PUBREL for {packet_id}, not awaited"
                releasing.discard(packet_id)
                self.send(v4.encode_pubcomp(packet_id))
            else:
                raise AssertionError(f"unexpected packet {first:#x} {body!r} (tenant {shown(self.tenant)!r})")
        return got

    def next(self) -> Msg:
        """The next packet, which must be a PUBLISH of QoS 0 or 1 (acknowledged)."""
        return self._read(lambda _first, _body: False, take=1)[0]

    def ping(self) -> None:
        """A PINGREQ answered: the connection is still open (and nothing else was sent to it)."""
        self.send(v4.PINGREQ_PACKET)
        assert self.raw.recv() == (0xD0, b"")

    def disconnect(self, session_expiry: int | None = None) -> None:
        """DISCONNECT (5.0: with `session_expiry` when given) and wait for the broker to close."""
        if self.v5:
            self.send(v5.encode_disconnect(0, None if session_expiry is None else {P.SESSION_EXPIRY_INTERVAL: session_expiry}))
        else:
            self.send(b"\xe0\x00")
        self.raw.read_until_closed()
        self.raw.close()

    def close(self) -> None:
        self.raw.close()


def connack(raw: RawClient, level: int, client_id: str, username: str | None, clean: bool = True,
            properties: dict | None = None, will: Will | None = None) -> tuple[bool, int]:
    """CONNECT on `raw`; the CONNACK's (session present, return or reason code)."""
    if level == 5:
        present, code, _props = raw.connect5(client_id, clean, properties=properties, username=username, will=will)
        return present, code
    return raw.connect(client_id, clean, username=username, will=will)


def join(raw: RawClient, tenant: str, level: int, client_id: str | None = None, clean: bool = True,
         properties: dict | None = None, will: Will | None = None) -> Peer:
    """`raw` CONNECTed in `tenant` (by its username), which the broker must accept."""
    client_id = client_id or f"t-{uid()}"
    raw.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # the barriers' small packets go at once
    present, code = connack(raw, level, client_id, user(tenant), clean, properties, will)
    assert code == 0, f"CONNACK {code:#x} for {user(tenant)!r}"
    return Peer(raw, level, tenant, client_id, present)


_WORKERS: dict[int, dict[int, int]] = {}  # broker pid -> worker id -> pid


def owners(broker: Broker) -> dict[int, int]:
    """client port -> the id of the worker holding that connection, for every connection now held:
    the workers' socket inodes, then one pass over the socket table (psutil makes one per worker, and
    the table grows with every connection a test closes, as TIME_WAIT)."""
    pids = _WORKERS.get(broker.proc.pid)
    if pids is None:
        pids = _WORKERS[broker.proc.pid] = {w: proc.pid for w, proc in broker.workers().items()}
    inodes = {}
    for worker_id, pid in pids.items():
        fds = f"/proc/{pid}/fd"
        for fd in os.listdir(fds):
            try:
                link = os.readlink(f"{fds}/{fd}")
            except OSError:  # closed meanwhile
                continue
            if link.startswith("socket:["):
                inodes[link[8:-1]] = worker_id
    found = {}
    with open("/proc/net/tcp") as table:  # the clients connect to 127.0.0.1
        next(table)
        for line in table:
            fields = line.split()
            holder = inodes.get(fields[9])
            if holder is not None:
                found[int(fields[2].rsplit(":", 1)[1], 16)] = holder  # the remote address: the client's port
    return found


def sockets_on(broker: Broker, want: int, count: int) -> list[RawClient]:
    """`count` raw sockets (not yet CONNECTed) held by worker `want`. The sockets that land elsewhere
    stay open meanwhile, so that the balancer (least loaded first) sends the next ones to the other
    worker; one look at the workers' sockets per round (tests/steps.py `raw_on` looks once per socket)."""
    opened = [RawClient(broker.port) for _ in range(count)]
    chosen: list[RawClient] = []

    def look() -> bool:
        held = owners(broker)
        for c in opened:
            if len(chosen) < count and c not in chosen and held.get(c.local_port) == want:
                chosen.append(c)
        if len(chosen) == count:
            return True
        if all(c.local_port in held for c in opened):  # each handed over, too few to `want`: more
            opened.extend(RawClient(broker.port) for _ in range(count - len(chosen)))
        return False

    try:
        wait_for(look, 10, f"{count} sockets on worker {want}")
    finally:
        for c in opened:
            if c not in chosen:
                c.close()
    return chosen


def peer(broker: Broker, tenant: str, level: int, on: int | None = None, **kw: object) -> Peer:
    """A client of `tenant`, on worker `on` (any when None)."""
    raw = RawClient(broker.port) if on is None else sockets_on(broker, on, 1)[0]
    return join(raw, tenant, level, **kw)  # type: ignore[arg-type]  # join's keyword arguments


def peers(broker: Broker, tenants: list[str], level: int, on: int) -> dict[str, Peer]:
    """A client of each of `tenants`, all on worker `on`."""
    return {t: join(raw, t, level) for t, raw in zip(tenants, sockets_on(broker, on, len(tenants)))}


def worker(broker: Broker, c: Peer) -> int:
    """The id of the worker holding `c`."""
    return wait_for(lambda: owners(broker).get(c.raw.local_port, -1) + 1, 10, "the socket to reach a worker") - 1


def close_all(*peers: Peer) -> None:
    for c in peers:
        c.close()
