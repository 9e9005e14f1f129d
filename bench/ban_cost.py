"""`python -m plexmq.bench.ban_cost`: what the banned clients cost a worker at CONNECT (issue 37).

In process, the worker's own check (`workers/handlers/connect.py: accept` asks `BanSet.match` only when
the set is not empty) against no bans and against N bans, a third each by client id, username and
address (IPv4 and IPv6 networks of several prefix lengths), for a client no ban names (every CONNECT
but the banned ones), one banned by its address (the most lookups), and one by its client id. Also
what a worker pays when it joins (the whole set from a BANS record) and when one ban is added (checked
against C connected clients).
"""

from __future__ import annotations

import argparse
import ipaddress
import random
import timeit
from collections.abc import Callable

from plexmq.bans import ADDRESS, BROKER, CLIENT_ID, USERNAME, Ban, BanSet, make

LENGTHS = {4: (32, 32, 32, 24, 16), 6: (128, 64, 48)}  # prefix lengths of the address bans, drawn from


def bans(count: int, seed: int = 1) -> list[Ban]:
    """`count` bans: client ids, usernames and networks by turns, in the default tenant or in every one."""
    draw = random.Random(seed)
    made = []
    for i in range(count):
        tenant = BROKER if i % 2 else ""
        if i % 3 == 0:
            made.append(make(tenant, CLIENT_ID, f"device-{i}", "bench", now=0.0))
        elif i % 3 == 1:
            made.append(make(tenant, USERNAME, f"user-{i}", "bench", now=0.0))
        else:
            version = 4 if i % 6 == 2 else 6
            length = draw.choice(LENGTHS[version])
            bits = 32 if version == 4 else 128
            address = ipaddress.ip_address(draw.getrandbits(bits) if version == 6 else draw.getrandbits(32) | 1 << 31)
            made.append(make(tenant, ADDRESS, f"{address}/{length}", "bench", now=0.0))
    return made


def per_call(call: Callable[[], object], number: int) -> float:
    """µs per call, the best of 5 runs of `number`."""
    return min(timeit.repeat(call, number=number, repeat=5)) / number * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plexmq.bench.ban_cost", description=__doc__)
    parser.add_argument("--bans", type=int, default=100_000, help="bans in the set (default 100,000)")
    parser.add_argument("--connections", type=int, default=10_000, help="connected clients a new ban is checked against")
    args = parser.parse_args(argv)
    made = bans(args.bans)
    empty, full = BanSet(), BanSet(made)
    lengths = len(full.networks)
    hit = next(ban for ban in made if ban.kind == ADDRESS and ":" not in ban.value)
    inside = str(ipaddress.ip_network(hit.value).network_address)
    cases = [("no bans (the check skipped: `if worker.bans`)",
              lambda: empty and empty.match("", "c1", ("u", "u"), "10.9.8.7:1", 1.0)),
             (f"{args.bans:,} bans, a client no ban names (IPv4)", lambda: full.match("", "c1", ("u", "u"), "10.9.8.7:1", 1.0)),
             (f"{args.bans:,} bans, a client no ban names (IPv6)",
              lambda: full.match("", "c1", ("u", "u"), "2001:db8::1:40000", 1.0)),
             (f"{args.bans:,} bans, banned by its address", lambda: full.match("", "c1", ("u", "u"), f"{inside}:1", 1.0)),
             (f"{args.bans:,} bans, banned by its client id", lambda: full.match("", "device-0", ("u", "u"), "10.9.8.7:1", 1.0))]
    print(f"{args.bans:,} bans: {lengths} (IP version, prefix length) tables")
    for name, call in cases:
        assert bool(call()) == ("banned" in name)
        print(f"  {name}: {per_call(call, 20_000):.2f} µs per CONNECT")
    rows: list[list] = [list(ban) for ban in made]  # as a BANS record carries them
    joined = per_call(lambda: BanSet(Ban(*row) for row in rows), 1)
    print(f"  a worker joins: the whole set from its BANS record in {joined / 1000:.0f} ms")
    peers = [(f"client-{i}", f"user-{i}", f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}:5000") for i in range(args.connections)]
    added = BanSet([make(BROKER, ADDRESS, "192.0.2.0/24")])
    walk = per_call(lambda: [added.match("", cid, (user, user), peer, 1.0) for cid, user, peer in peers], 1)
    print(f"  one new ban checked against {args.connections:,} connected clients: {walk / 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
