"""What a worker and its connections read from the config, as one frozen value: a reload
(`Worker.reload`) builds a new one and swaps it whole, so no reader ever sees half of an old config and
half of a new one, and a bad value leaves the old one standing. Services built from the config (the
TLS context, `Auth`, the archive) are not settings: they are configured anew in place.

Which keys change live is `acceptor/reload.py: RELOADABLE`; the others (`max_inflight`,
`receive_maximum`, `topic_alias_maximum`) come back unchanged from the config the acceptor writes.
Hot paths bind `worker.settings` (or the one value they need) once per read or per batch.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from plexmq.mqtt import properties as props
from plexmq.tenants import Tenants


@dataclass(frozen=True, slots=True)
class Settings:
    max_packet_size: int
    max_user_properties: int  # per property block; props.ANY when the config says 0
    max_subscriptions: int  # per client; sys.maxsize when the config says 0
    max_inflight: int  # outgoing QoS 1/2 in flight per client
    receive_maximum: int  # incoming QoS 1/2 unacknowledged per 5.0 client
    topic_alias_maximum: int  # topic aliases a 5.0 client may set
    max_queued: int  # outgoing messages waiting per client (max_queued_messages)
    connect_timeout: float
    memory_limit: int  # RSS above which QoS 0 deliveries are shed (0: none)
    # what a CONNECT is answered with (new connections; live ones keep theirs)
    max_keepalive: int  # 0: any keepalive, 0 (none) included
    response_information: str  # "": none offered
    server_reference: str  # "": serve; else send every client there
    server_moved: bool
    # per-client rate limits (0: none); connections check `rate_limited` after each read
    message_rate: float
    byte_rate: float
    rate_limited: bool
    rate_disconnects: bool  # rate_limit_action = disconnect (else throttle)
    tenants: Tenants  # the declared tenants and how a CONNECT names one
    workers: int  # the workers of this host (serve's count): each holds a tenant's rates to its share of them
    metrics_tenants: bool  # STATS carries each tenant's numbers
    bridges: dict[str, tuple[bytes, str]]  # a bridge's local client id -> (its token, its tenant): acceptor/bridges

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Settings:
        """The settings of `config`; KeyError, TypeError or ValueError when a key is missing or
        holds a value of another kind (the acceptor checked the file: it changed since)."""
        message_rate = float(config["client_message_rate"])
        byte_rate = float(config["client_byte_rate"])
        action = config["rate_limit_action"]
        if action not in ("throttle", "disconnect"):
            raise ValueError(f"rate_limit_action: {action!r}")
        return cls(
            max_packet_size=int(config["max_packet_size"]),
            max_user_properties=int(config["max_user_properties"]) or props.ANY,
            max_subscriptions=int(config["max_subscriptions"]) or sys.maxsize,
            max_inflight=int(config["max_inflight"]),
            receive_maximum=int(config["receive_maximum"]),
            topic_alias_maximum=int(config["topic_alias_maximum"]),
            max_queued=int(config["max_queued_messages"]),
            connect_timeout=float(config["connect_timeout"]),
            memory_limit=int(config["memory_limit"]),
            max_keepalive=int(config["max_keepalive"]),
            response_information=str(config["response_information"]),
            server_reference=str(config["server_reference"]),
            server_moved=bool(config["server_moved"]),
            message_rate=message_rate,
            byte_rate=byte_rate,
            rate_limited=bool(message_rate or byte_rate),
            rate_disconnects=action == "disconnect",
            tenants=Tenants.from_config(config),
            workers=max(int(config["workers"]), 1),
            metrics_tenants=bool(config["metrics_tenants"]),
            bridges={client_id: (token.encode(), tenant) for client_id, (token, tenant) in config["bridge_logins"].items()},
        )
