"""The MQTT clients of one generator process: pre-encoded packets out, `packets.frame` in.

Why it is shaped this way: Python must not be the bottleneck, so a publisher builds a batch from one
pre-encoded PUBLISH with only the timestamp, sequence number and packet id changed (one struct.pack
per batch, no Python per message), every write of a loop turn to one socket is joined into one
`transport.write` by the process's flush, and a subscriber counts a read of same-sized packets by
columns (bench.bulk) or, when anything is unusual, packet by packet in an inlined loop.

At protocol level 5 a PUBLISH carries a property block between its topic (and packet id) and its
payload: empty in what publishers send, skipped in what subscribers read; acknowledgements longer than
the 2-byte success form carry a reason code (bench.wire reads them).

Payload of every PUBLISH (big-endian): send time (CLOCK_MONOTONIC ns, the same clock in every
process of the host), run id, publisher index, per-publisher sequence number, then zero filler.
"""

from __future__ import annotations

import asyncio
import struct
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import lru_cache
from time import monotonic_ns
from typing import TYPE_CHECKING

from plexmq.bench import bulk, wire
from plexmq.mqtt.framing import MalformedPacket, frame

if TYPE_CHECKING:
    from plexmq.bench.agent import Agent
    from plexmq.bench.connector import Raw

PAYLOAD = struct.Struct(">QIII")  # send time ns, run id, publisher index, sequence
MIN_SIZE = PAYLOAD.size
MAX_PACKET = 1 << 28
MAX_MISSING = 1_000_000  # sequence gaps remembered per subscriber (to tell a late message from a duplicate)

PUBACK, PUBREC, PUBREL, PUBCOMP = 0x40, 0x50, 0x62, 0x70
ACK = struct.Struct(">BBH")
PINGREQ = b"\xc0\x00"
DISCONNECT = b"\xe0\x00"


@lru_cache(maxsize=4096)
def _batch(one: str, n: int) -> struct.Struct:
    """The struct of n consecutive packets whose layout is `one`."""
    return struct.Struct(">" + one * n)


class Client(asyncio.Protocol):
    """A connection that connects, answers pings and acks; subclasses publish or subscribe."""

    __slots__ = ("agent", "buf", "gid", "index", "out", "paused", "raw", "ready", "transport")
    role = "c"

    def __init__(self, agent: Agent, index: int, gid: int) -> None:
        self.agent = agent
        self.index = index
        self.gid = gid  # position among all the run's connections: picks the source address
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.out: list[bytes | bytearray] = []
        self.ready = False
        # its handshake (bench.connector), which did CONNECT/CONNACK
        self.raw: Raw = None  # type: ignore[assignment]  # set by Agent.connect_all before any use
        self.paused = False

    @property
    def client_id(self) -> str:
        return self.agent.opts.client_id(self.agent.run_id, self.role, self.index)

    # -- transport callbacks (the socket arrives connected, CONNACK already read) -----------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport
        self.on_connected()

    def on_connected(self) -> None:
        self.agent.on_ready(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.agent.lost(self, exc)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.agent.wake(self)

    def send(self, data: bytes | bytearray) -> None:
        """Queue bytes for this turn's single write to the socket."""
        if not self.out:
            self.agent.dirty.append(self)
            if not self.agent.flush_scheduled:
                self.agent.schedule_flush()
        self.out.append(data)

    def data_received(self, data: bytes) -> None:
        if self.buf:
            data = self.buf + data
            self.buf = b""
        pos, end = 0, len(data)
        try:
            while pos < end:
                found = frame(data, pos, MAX_PACKET)
                if found is None:
                    break
                first, start, pos = found
                self.on_packet(first, data, start, pos)
        except (MalformedPacket, IndexError, struct.error) as exc:
            self.agent.protocol_error(self, str(exc) or type(exc).__name__)
            return
        if pos < end:
            self.buf = data[pos:]

    # -- control packets --------------------------------------------------------------------------

    def on_packet(self, first: int, data: bytes, start: int, stop: int) -> None:
        if first == 0xD0:
            self.agent.pongs += 1
        elif first & 0xF0 == 0xE0:  # the broker closes the connection next: counted as dropped then
            code = wire.disconnect_reason(self.agent.opts.protocol, first & 0x0F, data[start:stop])
            self.agent.note(f"the broker disconnected {self.client_id}: {wire.describe(code)}")
        else:
            raise MalformedPacket(f"unexpected packet type {first >> 4} (first byte {first:#04x})")


class Publisher(Client):
    """Publishes pre-encoded messages; keeps at most `window` unacknowledged (QoS 1/2)."""

    __slots__ = (
        "delivered",
        "fmt",
        "pending",
        "phase_ns",
        "progress_ns",
        "proto",
        "qos",
        "queued",
        "released",
        "reset_base",
        "seq",
        "unacked",
        "width",
    )
    role = "p"

    def __init__(self, agent: Agent, index: int, gid: int) -> None:
        super().__init__(agent, index, gid)
        opts = agent.opts
        self.qos = opts.qos
        topic = opts.topic(index).encode()
        packet = wire.publish(opts.protocol, topic, bytes(opts.size), opts.qos, 1 if opts.qos else 0)
        stamp_off = len(packet) - opts.size  # the payload starts with the send time
        pid_off = frame(packet, 0, MAX_PACKET)[1] + 2 + len(topic)  # type: ignore[index]  # a whole packet; the packet id follows the topic
        head = packet[:pid_off] if opts.qos else packet[:stamp_off]
        props = packet[pid_off + 2:stamp_off] if opts.qos else b""  # 5.0: the property block after the id
        tail = packet[stamp_off + PAYLOAD.size:]
        self.fmt = f"{len(head)}s{'H' if opts.qos else ''}{f'{len(props)}s' if props else ''}QIII{len(tail)}s"
        self.proto: list[int | bytes] = [head, *([0] if opts.qos else []), *([props] if props else []), 0,
                                         agent.run_id, index, 0, tail]
        self.width = len(self.proto)
        self.seq = 0  # messages sent; the next sequence number
        self.unacked = 0
        self.pending: set[int] = set()  # packet ids awaiting PUBACK / PUBREC
        self.released: set[int] = set()  # QoS 2 packet ids awaiting PUBCOMP
        self.delivered = 0  # deliveries to subscribers counted so far (end-to-end window)
        self.reset_base = 0  # messages written off as lost by an end-to-end window reset
        self.progress_ns = 0
        self.queued = False
        self.phase_ns = 0

    def inflight(self) -> int:
        """Messages sent that the subscribers have not all received (end-to-end window)."""
        return self.seq - self.reset_base - self.delivered // self.agent.fan

    def credit(self) -> int:
        agent = self.agent
        room = agent.window - self.unacked if self.qos else 1 << 30
        if agent.e2e:
            room = min(room, agent.e2e - self.inflight())
        return room

    def emit(self, n: int, now: int) -> None:
        """Send n messages stamped `now` in one write. The batch is one struct.pack over n copies of
        (constant head, [packet id,] time, run, publisher, sequence, constant filler): the varying
        fields are filled by slice assignment, so no Python runs per message."""
        w = self.width
        values = self.proto * n
        seq = self.seq
        seqs = range(seq, seq + n)
        values[w - 2::w] = seqs
        values[w - 5::w] = (now,) * n
        if self.qos:
            first = seq % 65535 + 1
            pids = range(first, first + n) if first + n <= 65536 else [s % 65535 + 1 for s in seqs]
            values[1::w] = pids
            self.pending.update(pids)
            self.unacked += n
        self.agent.sent += n
        self.seq = seq + n
        self.send(_batch(self.fmt, n).pack(*values))

    def on_packet(self, first: int, data: bytes, start: int, stop: int) -> None:
        if first in (PUBACK, PUBREC, PUBCOMP):
            if stop - start == 2:
                pid, code = (data[start] << 8) | data[start + 1], 0
            else:
                pid, code = wire.ack(self.agent.opts.protocol, first >> 4, 0, data[start:stop])
                if code >= wire.FAILED:
                    self.refused(first, pid, code)
                    return
            if first == PUBREC:
                if pid not in self.pending:
                    raise MalformedPacket(f"PUBREC for unknown packet id {pid}")
                self.pending.discard(pid)
                self.released.add(pid)
                self.send(ACK.pack(PUBREL, 2, pid))
                return
            waiting = self.pending if first == PUBACK else self.released
            if pid not in waiting or (first == PUBACK) != (self.qos == 1):
                raise MalformedPacket(f"unexpected {'PUBACK' if first == PUBACK else 'PUBCOMP'} for packet id {pid}")
            waiting.discard(pid)
            self.unacked -= 1
            self.agent.acked += 1
            if not self.queued:
                self.agent.wake(self)
        else:
            super().on_packet(first, data, start, stop)

    def refused(self, first: int, pid: int, code: int) -> None:
        """A 5.0 PUBACK/PUBREC with a failure reason: the message ends there (no PUBREL), its window slot
        is free again, and the reason is counted (its subscribers' missing copy counts as lost)."""
        waiting = self.released if first == PUBCOMP else self.pending
        if pid not in waiting:
            raise MalformedPacket(f"refusal {code:#04x} for unknown packet id {pid}")
        waiting.discard(pid)
        self.unacked -= 1
        errors = self.agent.errors
        errors[f"refused_{code:#04x}"] = errors.get(f"refused_{code:#04x}", 0) + 1
        self.agent.note(f"the broker refused a PUBLISH: {wire.describe(code)}")
        if not self.queued:
            self.agent.wake(self)


class Subscriber(Client):
    """Subscribes, then counts every message: latency, duplicates, reordering, per-publisher receipts."""

    __slots__ = ("expect", "missing")
    role = "s"

    def __init__(self, agent: Agent, index: int, gid: int) -> None:
        super().__init__(agent, index, gid)
        self.expect: dict[int, int] = {}  # publisher -> next sequence number expected
        self.missing: dict[int, set[int]] = {}  # publisher -> sequence numbers skipped so far

    def on_connected(self) -> None:
        opts = self.agent.opts
        packet = wire.subscribe(opts.protocol, 1, opts.filter(self.index), opts.qos, opts.sub_identifier)
        self.transport.write(packet)  # type: ignore[union-attr]  # connected

    def on_packet(self, first: int, data: bytes, start: int, stop: int) -> None:
        if first == 0x90:
            pid, codes = wire.suback(self.agent.opts.protocol, 0, data[start:stop])
            if pid != 1:
                raise MalformedPacket("SUBACK for an unknown packet id")
            if codes[0] >= wire.FAILED:
                self.agent.note(f"the broker refused a subscription: {wire.describe(codes[0])}")
                self.agent.fail(self, "suback_refused")
            else:
                if codes[0] < self.agent.opts.qos:
                    self.agent.note(f"the broker granted QoS {codes[0]} for QoS {self.agent.opts.qos}")
                self.agent.on_ready(self)
        elif first == PUBREL:
            self.send(ACK.pack(PUBCOMP, 2, (data[start] << 8) | data[start + 1]))
        else:
            super().on_packet(first, data, start, stop)

    def data_received(self, data: bytes) -> None:
        """The hot path: a message in sequence after the previous one of the same publisher costs a
        frame() call, one unpack, three comparisons and an append; the dicts are touched only when
        the publisher changes, and latencies are counted per distinct send time (publishers stamp a
        whole batch with one time) once per read."""
        if self.buf:
            data = self.buf + data
            self.buf = b""
        agent = self.agent
        now = monotonic_ns()
        if agent.samples is None:  # raw samples need every message's fields: the per-packet loop
            used = bulk.count(self, data, now)
            if used:
                if used == len(data):
                    return
                data = data[used:]
        run_id = agent.run_id
        v5 = agent.opts.protocol == 5
        counts = agent.receipts if agent.e2e else None
        samples = agent.samples
        expect = self.expect
        unpack = PAYLOAD.unpack_from
        stamps: list[int] = []
        stamp = stamps.append
        cur, nxt, run_start = -1, 0, 0  # the current stretch: publisher, next sequence, its first sequence
        pos, end = 0, len(data)
        dup = late = foreign = 0
        acks: list[bytes] | None = None
        try:
            while pos < end:
                found = frame(data, pos, MAX_PACKET)
                if found is None:
                    break
                first, p, pos = found
                if first & 0xF0 != 0x30:
                    self.on_packet(first, data, p, pos)
                    continue
                p += 2 + ((data[p] << 8) | data[p + 1])
                if first & 0x06:
                    if acks is None:
                        acks = []
                    acks.append(ACK.pack(PUBACK if first & 0x06 == 0x02 else PUBREC, 2, (data[p] << 8) | data[p + 1]))
                    p += 2
                if v5:
                    p = wire.properties_end(data, p) if data[p] else p + 1
                if pos - p < MIN_SIZE:
                    foreign += 1
                    continue
                sent, run, pub, seq = unpack(data, p)
                if seq == nxt and pub == cur and run == run_id:
                    nxt += 1
                    stamp(sent)
                    if samples is not None:
                        samples.add(sent, now, pub, seq, self.index)
                    continue
                if run != run_id:
                    foreign += 1
                    continue
                if cur >= 0:  # close the stretch of the previous publisher
                    expect[cur] = nxt
                    if counts is not None:
                        counts[cur] = counts.get(cur, 0) + nxt - run_start
                cur = pub
                nxt = expect.get(pub, 0)
                if seq >= nxt:
                    if seq > nxt:
                        self._gap(pub, nxt, seq)
                    run_start, nxt = seq, seq + 1
                elif self._late(pub, seq):
                    run_start = nxt
                    late += 1
                    if counts is not None:
                        counts[pub] = counts.get(pub, 0) + 1
                else:
                    run_start = nxt
                    dup += 1
                    continue
                stamp(sent)
                if samples is not None:
                    samples.add(sent, now, pub, seq, self.index)
        except (MalformedPacket, IndexError, struct.error) as exc:
            agent.protocol_error(self, str(exc) or type(exc).__name__)
            return
        if cur >= 0:
            expect[cur] = nxt
            if counts is not None:
                counts[cur] = counts.get(cur, 0) + nxt - run_start
        if pos < end:
            self.buf = data[pos:]
        if acks:
            self.send(b"".join(acks))
        if stamps:
            self.record_latency(stamps, now)
        agent.received += len(stamps) + dup
        if dup or late or foreign:
            agent.dups += dup
            agent.reordered += late
            agent.foreign += foreign
        if counts and not agent.flush_scheduled:
            agent.schedule_flush()

    def record_latency(self, sents: Sequence[int], now: int) -> None:
        """Count latencies once per distinct send time (a publisher stamps a whole batch with one)."""
        hist = self.agent.hist
        if sents.count(sents[0]) == len(sents):  # the usual case: one batch
            groups: Iterable[tuple[int, int]] = ((sents[0], len(sents)),)
        else:
            groups = Counter(sents).items()
        for sent, n in groups:
            lat = (now - sent) // 1000
            key = lat if lat < 1000 else (lat // 10 * 10 if lat < 100_000 else lat // 1000 * 1000)
            hist[key] = hist.get(key, 0) + n

    def _gap(self, pub: int, nxt: int, seq: int) -> None:
        missing = self.missing.setdefault(pub, set())
        if len(missing) + seq - nxt <= MAX_MISSING:
            missing.update(range(nxt, seq))

    def _late(self, pub: int, seq: int) -> bool:
        missing = self.missing.get(pub)
        if missing and seq in missing:
            missing.discard(seq)
            return True
        return False
