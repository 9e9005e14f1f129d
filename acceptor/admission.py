"""Which new connections the acceptor takes, decided before any MQTT byte is read.

Network allow and deny lists (CIDR), a cap on connections held by the whole broker, and a rate per
client address (a token bucket that refills `max_connection_rate` per second, up to a burst of as
many, and at least one, so that a rate below 1 means one connection every 1/rate seconds): a refused
socket is closed at once and counted, and refusals are logged at most once a second, so a flood
costs the acceptor one accept and one close per socket.
"""

from __future__ import annotations

import ipaddress
import logging
import time

log = logging.getLogger("plexmq.acceptor")

ADDRESSES_MAX = 100_000  # addresses whose rate is tracked; forgotten all at once when full

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class Admission:
    def __init__(self, config: dict) -> None:
        self.configure(config)
        self.buckets: dict[str, tuple[float, float]] = {}  # address -> (tokens, when)
        self.refused: dict[str, int] = {}  # reason -> count
        self.logged_at = 0.0

    def configure(self, config: dict) -> None:
        """Take the limits from `config` (at start and on SIGHUP)."""
        self.allow: list[Network] = [ipaddress.ip_network(n, strict=False) for n in config["allow_networks"]]
        self.deny: list[Network] = [ipaddress.ip_network(n, strict=False) for n in config["deny_networks"]]
        self.max_connections: int = config["max_connections"]
        self.rate: float = config["max_connection_rate"]

    def admit(self, address: str, held: int) -> bool:
        """Whether to serve a new connection from `address` while the broker holds `held`."""
        reason = self._refusal(address, held)
        if reason is None:
            return True
        self.refused[reason] = self.refused.get(reason, 0) + 1
        now = time.monotonic()
        if now - self.logged_at >= 1.0:
            self.logged_at = now
            log.warning("refused a connection from %s (%s); refused so far: %s", address, reason, self.refused)
        return False

    def _refusal(self, address: str, held: int) -> str | None:
        if self.allow or self.deny:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
            if any(ip in net for net in self.deny):
                return "denied network"
            if self.allow and not any(ip in net for net in self.allow):
                return "network not allowed"
        if self.max_connections and held >= self.max_connections:
            return "max_connections"
        if self.rate:
            now = time.monotonic()
            burst = max(self.rate, 1.0)
            tokens, then = self.buckets.get(address, (burst, now))
            tokens = min(burst, tokens + (now - then) * self.rate)
            if tokens < 1.0:
                self.buckets[address] = (tokens, now)
                return "max_connection_rate"
            if len(self.buckets) >= ADDRESSES_MAX:
                self.buckets.clear()
            self.buckets[address] = (tokens - 1.0, now)
        return None
