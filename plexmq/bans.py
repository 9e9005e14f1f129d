"""Banned clients: what a ban is and the set that a CONNECT is looked up in, one home for the router,
which keeps the bans (router/bans.py: the store, the admin requests, expiry), and for each worker, which
holds a copy the router keeps up to date and checks every CONNECT against it (workers/handlers/connect.py:
`accept`) and its connected clients against each new ban (workers/from_router.py: `bans`).

A ban names a client id, a username (as the client logged in, whole or as its tenant knows it), or an
address or network (IPv4 or IPv6, a.b.c.d/len); in one tenant, or in every tenant (BROKER). Why it is
shaped so: a CONNECT costs a few dict lookups whatever the number of bans. Client ids and usernames are
keys of one dict; addresses are kept by prefix length, a dict of networks for each length in use, so
that an address is looked up once per length (masked), not compared with every network.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from plexmq.tenants import unfit_name

BROKER = "*"  # a ban's tenant when it holds in every tenant (no tenant may be so named: plexmq/tenants.py NAME)
CLIENT_ID, USERNAME, ADDRESS = "client_id", "username", "address"
KINDS = (CLIENT_ID, USERNAME, ADDRESS)
REASON_MOST = 256  # characters of a ban's reason (a 5.0 client hears it in its CONNACK)
VALUE_MOST = 65535  # characters of a client id or username (an MQTT string)

_MAPPED = bytes(10) + b"\xff\xff"  # the first 12 bytes of an IPv4 address mapped into IPv6 (::ffff:a.b.c.d)
Key = tuple[str, str, str]  # tenant, kind, value: what names one ban


class Ban(NamedTuple):
    """One ban; its fields in the order the store's row and the link's record carry them."""

    tenant: str  # BROKER: every tenant; "": the default tenant
    kind: str  # one of KINDS
    value: str  # the client id, the username, or the network (`canonical`: 10.0.0.0/8, 2001:db8::1)
    reason: str
    expires: float  # time.time() it ends at; 0: never
    by: str  # who made it (a console admin, the admin API)
    created: float  # time.time() it was made

    @property
    def key(self) -> Key:
        return self.tenant, self.kind, self.value

    def live(self, now: float) -> bool:
        return not self.expires or self.expires > now


class BadBan(ValueError):
    """What is wrong with a ban as asked (one line, said to the operator)."""


def canonical(kind: str, value: str) -> str:
    """The value as a ban keeps it: a network in its shortest form (a single address without its
    length, host bits cleared: 10.1.2.3/8 is 10.0.0.0/8); BadBan when it is not one of KINDS' values."""
    if kind not in KINDS:
        raise BadBan(f"a ban names one of {', '.join(KINDS)}, not {kind!r}")
    if not value or len(value) > VALUE_MOST:
        raise BadBan(f"a {kind} ban needs a value of 1 to {VALUE_MOST} characters")
    if kind != ADDRESS:
        return value
    try:
        network = ipaddress.ip_network(value.strip(), strict=False)
    except ValueError:
        raise BadBan(f"not an IPv4 or IPv6 address or network (a.b.c.d/len): {value!r}") from None
    return str(network.network_address) if network.prefixlen == network.max_prefixlen else str(network)


def make(tenant: str, kind: str, value: str, reason: str = "", seconds: float = 0.0, by: str = "",
         now: float | None = None) -> Ban:
    """A new ban lasting `seconds` (0: until it is lifted); BadBan when it cannot be one."""
    if tenant not in (BROKER, "") and unfit_name(tenant):
        raise BadBan(f"{unfit_name(tenant)} (or * for every tenant, empty for the default tenant)")
    if len(reason) > REASON_MOST:
        raise BadBan(f"a ban's reason is at most {REASON_MOST} characters")
    if seconds < 0:
        raise BadBan("a ban cannot last less than 0 seconds")
    now = time.time() if now is None else now
    return Ban(tenant, kind, canonical(kind, value), reason, now + seconds if seconds else 0.0, by, now)


def address_of(peer: str) -> tuple[int, int] | None:
    """(IP version, the address as an int) of a connection's `HOST:PORT`; None for what is no IP address."""
    return _address(peer.rsplit(":", 1)[0])


def _address(host: str) -> tuple[int, int] | None:
    """(IP version, the address as an int) of an IP address (an IPv4 address mapped into IPv6, as a
    dual-stack listener sees one, counts as IPv4); None for what is none. With inet_pton: ipaddress
    takes four times as long, most of a CONNECT's check."""
    try:
        if ":" not in host:
            return 4, int.from_bytes(socket.inet_pton(socket.AF_INET, host), "big")
        packed = socket.inet_pton(socket.AF_INET6, host.strip("[]").split("%", 1)[0])  # without its scope (fe80::1%eth0)
    except (OSError, ValueError):
        return None
    if packed.startswith(_MAPPED):
        return 4, int.from_bytes(packed[12:], "big")
    return 6, int.from_bytes(packed, "big")


class BanSet:
    """Bans by what they name. `names`: every ban by its key (client ids and usernames are looked up
    there); `networks`: the address bans by (IP version, prefix length) -> (mask, {(tenant, network): ban})."""

    __slots__ = ("names", "networks")

    def __init__(self, bans: Iterable[Ban] = ()) -> None:
        self.names: dict[Key, Ban] = {}
        self.networks: dict[tuple[int, int], tuple[int, dict[tuple[str, int], Ban]]] = {}
        for ban in bans:
            self.add(ban)

    def __len__(self) -> int:
        return len(self.names)

    def __bool__(self) -> bool:
        return bool(self.names)

    def __iter__(self) -> Iterator[Ban]:
        return iter(self.names.values())

    def get(self, key: Key) -> Ban | None:
        return self.names.get(key)

    def add(self, ban: Ban) -> None:
        """Add `ban`, replacing one of the same key (its reason, expiry and maker)."""
        self.names[ban.key] = ban
        if ban.kind == ADDRESS:
            (version, length), network = self._network(ban.value)
            bits = 32 if version == 4 else 128
            mask = ((1 << bits) - 1) ^ ((1 << (bits - length)) - 1)
            self.networks.setdefault((version, length), (mask, {}))[1][(ban.tenant, network)] = ban

    def remove(self, key: Key) -> Ban | None:
        """Lift the ban of `key`; it, or None when there was none."""
        ban = self.names.pop(key, None)
        if ban is not None and ban.kind == ADDRESS:
            length, network = self._network(ban.value)
            table = self.networks[length][1]
            del table[(ban.tenant, network)]
            if not table:
                del self.networks[length]
        return ban

    @staticmethod
    def _network(value: str) -> tuple[tuple[int, int], int]:
        """((IP version, prefix length), the network as an int) of a `canonical` network."""
        host, _, length = value.partition("/")
        version, network = _address(host)  # type: ignore[misc]  # canonical: an address
        return (version, int(length) if length else 32 if version == 4 else 128), network

    def match(self, tenant: str, client_id: str, usernames: tuple[str | None, ...], peer: str, now: float) -> Ban | None:
        """The live ban, if any, that holds for a client of `tenant` with this id, these usernames (as it
        logged in, and as its tenant knows it) and address (`HOST:PORT`)."""
        names = self.names
        for scope in (tenant, BROKER):
            ban = names.get((scope, CLIENT_ID, client_id))
            if ban is not None and ban.live(now):
                return ban
            for username in usernames:
                if username is not None:
                    ban = names.get((scope, USERNAME, username))
                    if ban is not None and ban.live(now):
                        return ban
        if self.networks:
            found = address_of(peer)
            if found is not None:
                version, address = found
                for (ip_version, _length), (mask, table) in self.networks.items():
                    if ip_version == version:
                        network = address & mask
                        for scope in (tenant, BROKER):
                            ban = table.get((scope, network))
                            if ban is not None and ban.live(now):
                                return ban
        return None
