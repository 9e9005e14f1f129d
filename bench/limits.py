"""The operating-system limits that decide how many connections a run can open, said up front.

One process may hold RLIMIT_NOFILE sockets (20,000 here, hard), and one (source address, broker
address:port) pair has only the ephemeral port range (~28k ports), of which connect() uses one half
quickly. So the generator raises its soft fd limit, spreads clients over enough processes, and above
half the port range (~14k connections) binds them to several 127.0.0.x source addresses
(IP_BIND_ADDRESS_NO_PORT lets the kernel pick the port per 4-tuple).
"""

from __future__ import annotations

import ipaddress
import math
import resource
import socket

FD_RESERVE = 64  # fds a generator process needs besides its client sockets (pipes, files, epoll)
SOURCE_FILL = 0.7  # share of half the port range used per source address (see source_addresses)
IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)


def raise_fd_limit() -> int:
    """Raise the soft open-file limit to the hard one; the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


def fd_hard_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]


def port_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (inclusive)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = map(int, f.read().split())
            return low, high
    except (OSError, ValueError):
        return 32768, 60999


def procs_needed(connections: int, fd_limit: int) -> int:
    """The fewest generator processes that hold `connections` sockets under `fd_limit` each."""
    return max(1, math.ceil(connections / max(fd_limit - FD_RESERVE, 1)))


def source_addresses(host: str, connections: int, requested: int) -> tuple[list[str], list[str]]:
    """(source addresses to bind, notes about limits); an empty list means let the kernel choose.

    requested: -1 automatic, 0 never, N that many addresses 127.0.0.2 .. 127.0.0.(N+1).
    Why at most ~70 % of HALF the port range per address: connect() takes ports of one parity first
    and scans all of them before it tries the other half, so past ~14k connections per (source,
    destination) every connect walks 14k busy ports: measured, 100k connections over 6 addresses
    ran at 4k/s up to 84k, then at ~300/s.
    """
    notes: list[str] = []
    low, high = port_range()
    ports = high - low + 1
    loopback = ipaddress.ip_address(host).is_loopback if _is_ip(host) else host == "localhost"
    count = requested
    if requested < 0:
        per_source = int(ports / 2 * SOURCE_FILL)
        count = -(-connections // per_source) if connections > ports // 2 else 0
    if count and not loopback:
        notes.append(f"source-address spreading needs a loopback broker; {host} is not: no spreading")
        count = 0
    if count == 0 and connections > ports:
        notes.append(f"LIMIT: {connections} connections from one source address exceed the ephemeral port "
                     f"range {low}-{high} ({ports} ports); at most ~{ports} can connect")
    count = min(count, 250)
    return [f"127.0.0.{2 + i}" for i in range(count)], notes


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False
