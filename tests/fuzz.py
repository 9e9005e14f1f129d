"""A seeded MQTT fuzzer: generated and mutated packets sent at a running broker from many connections.

Robustness means the broker survives whatever bytes arrive, so every byte stream here is derived from
one seed (per connection slot, so the streams do not depend on scheduling): rerunning a seed resends
the same bytes. The seeds of the mutations are the codec's byte fixtures (tests/test_packets.py)
and packets generated with the codec. The broker may close a connection at any time (its answer to
malformed input); the slot then opens a new one and goes on with its next session.

Run it longer by hand against a running broker (round i uses slots i*connections.., as tests/test_fuzz.py does):

    python -m tests.fuzz --port 1883 --packets 1000000 [--seed 7] [--connections 50] [--round 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import socket
import sys
import time
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate

from plexmq.mqtt import v4 as p
from tests.mqtt import RawClient
from tests.packet_fixtures import FIXTURES, MALFORMED

SEED_PACKETS: tuple[bytes, ...] = tuple(f[2] for f in FIXTURES) + tuple(m[1] for m in MALFORMED)

# Bounded name pools, so the state a broker may legitimately keep (sessions, retained messages,
# offline queues) stops growing early and a memory measurement sees leaks, not bookkeeping.
CLEAN_IDS = 64  # clean-session client ids fuzz-0..63, shared by all slots (so takeovers happen)
PERSISTENT_IDS = 4  # persistent sessions fuzz-p0..p3, each queueing at most max_queued_messages
LEVELS = ("a", "b", "c", "ü", "", "x y")  # topics are fuzz/ plus up to 3 of these: 259 names in all

BAD_UTF8 = (b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\x00", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\x80")
WILDCARD_TOPICS = (b"#", b"+", b"fuzz/#", b"fuzz/+/a", b"fuzz/a+", b"fuzz/#/a", b"+/+")
BAD_FILTERS = ("", "fuzz/#/a", "fuzz/a+", "#/a", "fuzz/a#", "++")
# remaining-length encodings a decoder must survive: 5 bytes, 4 bytes with a continuation bit,
# the largest legal value, and non-minimal (overlong) encodings of small values
ODD_LENGTHS = (b"\xff\xff\xff\xff\x01", b"\x80\x80\x80\x80\x00", b"\xff\xff\xff\x7f", b"\x80\x80\x80\x80",
               b"\x80\x00", b"\x85\x80\x00", b"\x82\x80\x80\x00", b"\xff\x7f", b"\x80\x80\x01", b"\xc0\x84\x3d")


def string(data: bytes) -> bytes:
    return len(data).to_bytes(2, "big") + data


def packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + p.encode_remaining_length(len(body)) + body


def varint_end(data: bytes | bytearray) -> int:
    """Where the remaining length of `data` ends (its body starts), however malformed it is."""
    i = 1
    while i < len(data) and i < 5 and data[i] & 0x80:
        i += 1
    return min(i + 1, len(data))


class Generator:
    """The packets of one connection slot, all drawn from one seeded random stream."""

    def __init__(self, seed: int, slot: int) -> None:
        self.rng = random.Random(f"{seed}/{slot}")

    # -- well-formed packets ---------------------------------------------------------------------

    def topic(self) -> bytes:
        rng = self.rng
        return "/".join(["fuzz", *(rng.choice(LEVELS) for _ in range(rng.randrange(4)))]).encode()

    def topic_filter(self) -> str:
        rng = self.rng
        levels = ["fuzz", *(rng.choice((*LEVELS, "+")) for _ in range(rng.randrange(4)))]
        if rng.random() < 0.3:
            levels.append("#")
        if rng.random() < 0.05:
            return rng.choice(("#", "+/#", *BAD_FILTERS))
        return "/".join(levels)

    def payload(self) -> bytes:
        rng = self.rng
        big = 30_000 if rng.random() < 0.05 else 5  # rare, as larger payloads fill the offline queues
        return rng.randbytes(rng.choice((0, 1, 2, 16, 100, 100, 1000, big)))

    def connect(self) -> bytes:
        rng = self.rng
        level = 3 if rng.random() < 0.1 else 4
        clean = rng.random() > 0.1
        if not clean:
            client_id = f"fuzz-p{rng.randrange(PERSISTENT_IDS)}"
        elif rng.random() < 0.1 and level == 4:
            client_id = ""
        else:
            client_id = f"fuzz-{rng.randrange(CLEAN_IDS)}"
        will = None
        if rng.random() < 0.2:
            will = p.Will(self.topic().decode(), self.payload()[:200], rng.randrange(3), rng.random() < 0.2)
        username = password = None
        if rng.random() < 0.2:
            username = rng.choice(("fuzz", "ü", ""))
            password = rng.randbytes(rng.randrange(8)) if rng.random() < 0.5 else None
        keepalive = rng.choice((0, 1, 5, 60, 65535))
        return p.encode_connect(client_id, clean, keepalive, will, username, password, level)

    def valid(self) -> bytes:
        """A packet a correct client may send once connected."""
        rng = self.rng
        kind = rng.random()
        pid = rng.randrange(1, 0x10000)
        if kind < 0.5:
            qos = rng.choice((0, 0, 1, 2))
            retain = rng.random() < 0.1
            return p.encode_publish(self.topic(), self.payload(), qos, retain, qos > 0 and rng.random() < 0.2,
                                    pid if qos else 0)
        if kind < 0.65:
            return p.encode_subscribe(pid, [(self.topic_filter(), rng.randrange(3)) for _ in range(rng.randint(1, 4))])
        if kind < 0.72:
            return p.encode_unsubscribe(pid, [self.topic_filter() for _ in range(rng.randint(1, 3))])
        if kind < 0.8:
            return p.PINGREQ_PACKET
        if kind < 0.99:
            return rng.choice((p.encode_puback, p.encode_pubrec, p.encode_pubrel, p.encode_pubcomp))(pid)
        return p.DISCONNECT_PACKET

    # -- malformed packets -----------------------------------------------------------------------

    def targeted(self) -> bytes:
        """A well-framed packet that breaks one specific rule, so the check behind the framing runs."""
        rng = self.rng
        case = rng.randrange(14)
        payload = self.payload()[:100]
        if case == 0:  # zero-length topic
            qos = rng.randrange(3)
            return packet(0x30 | qos << 1, string(b"") + (b"\x00\x01" if qos else b"") + payload)
        if case == 1:  # wildcard in a PUBLISH topic
            return packet(0x30, string(rng.choice(WILDCARD_TOPICS)) + payload)
        if case == 2:  # invalid UTF-8 in a topic name
            return packet(0x30, string(b"fuzz/" + rng.choice(BAD_UTF8)) + payload)
        if case == 3:  # invalid UTF-8 in a topic filter
            return packet(0x82, b"\x00\x01" + string(rng.choice(BAD_UTF8)) + b"\x00")
        if case == 4:  # invalid UTF-8 in an UNSUBSCRIBE filter
            return packet(0xA2, b"\x00\x01" + string(b"fuzz/" + rng.choice(BAD_UTF8)))
        if case == 5:  # odd remaining length, then a body that may or may not fit it
            return bytes((rng.randrange(256),)) + rng.choice(ODD_LENGTHS) + rng.randbytes(rng.randrange(16))
        if case == 6:  # a huge length that is never followed by its body
            return bytes((rng.randrange(256),)) + p.encode_remaining_length(rng.randrange(1 << 14, 1 << 28))
        if case == 7:  # a random type and flags with a random body
            return packet(rng.randrange(256), rng.randbytes(rng.randrange(20)))
        if case == 8:  # QoS 3, DUP on QoS 0, packet id 0
            return rng.choice((packet(0x36, string(b"fuzz/a") + b"\x00\x01"), packet(0x38, string(b"fuzz/a")),
                               packet(0x32, string(b"fuzz/a") + b"\x00\x00")))
        if case == 9:  # a second CONNECT
            return self.connect()
        if case == 10:  # what only a server sends
            return rng.choice((p.encode_connack(False, 0), p.encode_suback(1, [0]), p.encode_unsuback(1),
                               p.PINGRESP_PACKET))
        if case == 11:  # a CONNECT with invalid UTF-8 in the client id, user name or will topic
            body = bytearray(p.encode_connect("fuzz-utf", True, 60, p.Will("fuzz/w", b"x", 0, False), "user"))
            start = body.index(rng.choice((b"fuzz-utf", b"fuzz/w", b"user")))
            bad = rng.choice(BAD_UTF8)
            body[start + 1 : start + 1 + len(bad)] = bad
            return packet(0x10, bytes(body[varint_end(body):]))
        if case == 12:  # a 16-bit length prefix that is too long or too short
            data = bytearray(self.valid() if rng.random() < 0.5 else self.connect())
            at = varint_end(data)
            if at + 2 <= len(data):
                data[at : at + 2] = rng.choice((b"\xff\xff", b"\x00\x00", rng.randbytes(2)))
            return bytes(data)
        # requested QoS 3 or reserved option bits
        return packet(0x82, b"\x00\x01" + string(b"fuzz/a") + bytes((rng.choice((3, 4, 0x80, 0xFF)),)))

    def mutate(self, data: bytes) -> bytes:
        """One to three random edits of `data`: bit flips, truncation, a new remaining length, new
        flags or type, inserted or deleted bytes."""
        rng = self.rng
        out = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            if not out:
                out = bytearray(rng.randbytes(2))
            op = rng.randrange(8)
            if op == 0:
                for _ in range(rng.randint(1, 4)):
                    out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
            elif op == 1:
                out = out[: rng.randrange(len(out))]
            elif op == 2:
                end = varint_end(out)
                length = rng.choice((rng.randrange(0x80), rng.randrange(1 << 14), rng.randrange(1 << 28)))
                new = rng.choice(ODD_LENGTHS) if rng.random() < 0.3 else p.encode_remaining_length(length)
                out[1:end] = new
            elif op == 3:
                out[0] = (out[0] & 0xF0) | rng.randrange(16)
            elif op == 4:
                out[0] = (rng.randrange(16) << 4) | (out[0] & 0x0F)
            elif op == 5:
                at = rng.randrange(len(out) + 1)
                out[at:at] = rng.choice((rng.randbytes(rng.randint(1, 8)), rng.choice(BAD_UTF8), b"/#", b"+"))
            elif op == 6:
                at = rng.randrange(len(out))
                del out[at : at + rng.randint(1, 8)]
            else:
                at = rng.randrange(len(out))
                out[at:at] = out[at : at + rng.randint(1, 32)]  # a repeated slice
        return bytes(out)

    def one(self, bad: float) -> bytes:
        """One packet of a session after its opening: valid but for a `bad` share of them."""
        rng = self.rng
        kind = rng.random()
        if kind >= bad:
            return self.valid()
        kind /= bad
        if kind < 0.35:
            return self.mutate(self.valid())
        if kind < 0.65:
            return self.mutate(rng.choice(SEED_PACKETS))
        if kind < 0.93:
            return self.targeted()
        return rng.randbytes(rng.randint(1, 64))

    def session(self) -> list[bytes]:
        """The packets of one connection: an opening CONNECT (mostly valid) and up to 40 more."""
        rng = self.rng
        bad = rng.choice((0.02, 0.1, 0.5))  # low rates let the broker read deep into a session
        kind = rng.random()
        if kind < 0.72:
            packets = [self.connect()]
        elif kind < 0.82:
            packets = [self.mutate(rng.choice((self.connect(), *SEED_PACKETS[:6])))]
        elif kind < 0.85:  # a valid CONNECT followed by garbage
            return [self.connect(), *(rng.randbytes(rng.randint(1, 200)) for _ in range(rng.randint(1, 5)))]
        elif kind < 0.95:  # a large upload cut short: the broker holds the partial packet until the close
            big = p.encode_publish(self.topic(), rng.randbytes(rng.randrange(100_000, 1_000_000)), rng.randrange(3),
                                   packet_id=1)
            return [self.connect(), big[: rng.randrange(len(big) // 2, len(big))]]
        else:
            packets = [self.one(1.0)]  # anything before CONNECT
        packets += [self.one(bad) for _ in range(rng.randint(0, 40))]
        return packets

    def writes(self, packets: list[bytes]) -> list[bytes]:
        """How the session's bytes are written: all in one write, one packet per write, or split at
        random points (down to single bytes, so a remaining length arrives in pieces)."""
        rng = self.rng
        data = b"".join(packets)
        kind = rng.random()
        if kind < 0.4 or len(data) < 2:
            return [data]
        if kind < 0.6:
            return packets
        if kind < 0.7:
            return [data[i : i + 1] for i in range(min(len(data), 64))] + [data[64:]]
        cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(1, 12))))
        return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]


@dataclass
class Stats:
    sessions: int = 0
    packets: int = 0  # written whole (the broker may have stopped reading at an earlier one)
    bytes: int = 0
    closed_by_broker: int = 0  # sessions the broker ended before the fuzzer did
    stalled: int = 0  # sessions whose writes the broker did not take within SESSION_LIMIT

    def add(self, other: Stats) -> None:
        self.sessions += other.sessions
        self.packets += other.packets
        self.bytes += other.bytes
        self.closed_by_broker += other.closed_by_broker
        self.stalled += other.stalled


SESSION_LIMIT = 5.0  # seconds; a broker that stops reading must not hang the fuzzer


async def _drain(reader: asyncio.StreamReader) -> None:
    """Read and drop what the broker sends until it closes (a slow client is a different test)."""
    try:
        while await reader.read(65536):
            pass
    except OSError:
        pass


async def _session(port: int, gen: Generator, stats: Stats) -> None:
    """One connection: write the session's bytes, wait a little for answers, close (sometimes with a reset)."""
    rng = gen.rng
    packets = gen.session()
    writes = gen.writes(packets)
    ends = list(accumulate(map(len, packets)))
    pause = rng.random() < 0.2  # pauses between writes, so split writes also arrive as split reads
    linger = rng.choice((0.0, 0.0, 0.01, 0.05))  # how long to wait for answers before closing
    abort = rng.random() < 0.2  # close with a reset instead of a FIN
    stats.sessions += 1
    # an error here ends the run: the broker no longer accepts connections
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), SESSION_LIMIT)
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    drain = asyncio.ensure_future(_drain(reader))
    written = 0
    try:
        async with asyncio.timeout(SESSION_LIMIT):
            for chunk in writes:
                if drain.done():
                    break
                writer.write(chunk)
                await writer.drain()
                written += len(chunk)
                if pause:
                    await asyncio.sleep(0.002)
            if linger:
                await asyncio.wait([drain], timeout=linger)
    except OSError:
        pass
    except TimeoutError:
        stats.stalled += 1
    stats.bytes += written
    stats.packets += bisect_right(ends, written)
    if drain.done():
        stats.closed_by_broker += 1
    if abort:
        writer.transport.abort()
    else:
        writer.close()
    drain.cancel()
    try:
        await drain
    except asyncio.CancelledError:
        pass


async def _slot(port: int, seed: int, slot: int, packets: int) -> Stats:
    gen = Generator(seed, slot)
    stats = Stats()
    while stats.packets < packets and stats.sessions < packets:  # a broker that reads nothing ends it too
        await _session(port, gen, stats)
    return stats


async def fuzz(port: int, packets: int, seed: int, connections: int = 50, first_slot: int = 0) -> Stats:
    """Send at least `packets` packets from `connections` parallel connection slots.

    Slots first_slot.. draw from streams of their own, so successive rounds with new first_slot values
    send new bytes and any round is reproducible from (seed, first_slot) alone.
    """
    share = -(-packets // connections)
    results = await asyncio.gather(*(_slot(port, seed, first_slot + i, share) for i in range(connections)))
    total = Stats()
    for stats in results:
        total.add(stats)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=1883)
    parser.add_argument("--packets", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=None, help="default: from the clock (printed)")
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--round", type=int, default=100_000, help="packets per round (and progress line)")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else time.time_ns() % 1_000_000_007
    print(f"seed {seed}", flush=True)
    total = Stats()
    started = time.monotonic()
    for index, done in enumerate(range(0, args.packets, args.round)):
        size = min(args.round, args.packets - done)
        total.add(asyncio.run(fuzz(args.port, size, seed, args.connections, first_slot=index * args.connections)))
        print(f"{total.packets} packets, {total.sessions} sessions ({total.closed_by_broker} closed by the broker), "
              f"{total.bytes} bytes, {time.monotonic() - started:.0f} s", flush=True)
    try:
        client = RawClient(args.port)
        client.connect("fuzz-probe")
        client.send(p.PINGREQ_PACKET)
        assert client.recv() == (0xD0, b"")
        client.close()
    except (OSError, AssertionError) as exc:
        sys.exit(f"seed {seed}: the broker no longer answers CONNECT and PINGREQ: {exc}")
    print("the broker still answers CONNECT and PINGREQ")


if __name__ == "__main__":
    main()
