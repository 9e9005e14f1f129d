"""The broker's settings: embedded defaults, an optional TOML file, then the command line.

Every option has a key; a bad key or value stops startup with one line naming the file, the line
and the key. The result is a plain dict that the acceptor hands to its children as JSON.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import socket
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import zmq
import zmq.auth

from plexmq import tenants
from plexmq.acceptor.bridges import rules as bridge_rules
from plexmq.acceptor.bridges.tls import client_context
from plexmq.files import Access, others_may_read
from plexmq.router.shared import STRATEGIES
from plexmq.units import parse_duration
from plexmq.workers import tls
from plexmq.workers.auth.acl import AclFile
from plexmq.workers.auth.database import connect_args
from plexmq.workers.auth.passwords import PasswordFile
from plexmq.workers.auth.tokens import TokenVerifier

log = logging.getLogger("plexmq.acceptor")


class ConfigError(Exception):
    """One line that says what is wrong and where."""


Origins = dict[str, Callable[[str], str]]  # tenant name -> the "file:line" where a key of its table is set


@dataclass(frozen=True)
class Option:
    kind: type
    default: Any
    check: Callable[[Any], str | None] = lambda _value: None
    doc: str = ""


def _range(low: float, high: float | None = None) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if value < low or (high is not None and value > high):
            return f"must be between {low} and {high}" if high is not None else f"must be at least {low}"
        return None
    return check


def _one_of(*choices: str) -> Callable[[Any], str | None]:
    return lambda value: None if value in choices else f"must be one of {', '.join(choices)}"


def _duration_or_never(value: Any) -> str | None:
    if not value:
        return None
    try:
        parse_duration(value)
    except ValueError as exc:
        return str(exc)
    return None


def _networks(value: Any) -> str | None:
    for network in value:
        try:
            ipaddress.ip_network(network, strict=False)
        except (TypeError, ValueError):
            return f"must be a list of networks like \"10.0.0.0/8\"; {network!r} is not one"
    return None


def _group(value: Any) -> str | None:
    if not value:
        return None
    try:
        Access(value)
    except KeyError:
        return f"no group {value!r} on this host"
    return None


def _nonempty(value: Any) -> str | None:
    return None if value else "must not be empty"


def _strings(value: Any) -> str | None:
    return None if all(isinstance(v, str) for v in value) else "must be a list of strings"


def _mqtt_string(value: Any) -> str | None:
    """A value the broker sends in an MQTT string: at most 65535 bytes of UTF-8, no U+0000."""
    if "\0" in value:
        return "must not contain U+0000"
    return None if len(value.encode("utf-8", "surrogatepass")) <= 65535 else "must be at most 65535 bytes of UTF-8"


_TCP_ENDPOINT = re.compile(r"tcp://(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9.-]+)):(?P<port>\d{1,5})")
_HOST_NAME = re.compile(r"(?=.*[A-Za-z])[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*")


def _is_address(host: str, version: int) -> bool:
    try:
        return ipaddress.ip_address(host).version == version
    except ValueError:
        return False


def _router_bind(value: Any) -> str | None:
    """Empty, or a tcp:// endpoint that the router can bind and the workers connect to: no `*`, no
    port 0, no interface name (ZeroMQ takes those on bind only)."""
    if not value:
        return None
    found = _TCP_ENDPOINT.fullmatch(value)
    if found and 0 < int(found["port"]) < 65536:
        if found["v6"]:
            if _is_address(found["v6"], 6):
                return None
        elif _is_address(found["host"], 4) or _HOST_NAME.fullmatch(found["host"]):
            return None
    return 'must be empty (ipc:// in run_dir) or "tcp://HOST:PORT" (an IPv4 address, [IPv6] or a name)'


def router_endpoints(value: str) -> list[str]:
    """The endpoints of role node's `router`: one, or a comma-separated list of the routers that may
    be active (a standby answers STANDBY and the node moves on: workers/follow.py)."""
    return [endpoint.strip() for endpoint in value.split(",")] if value else []


def _router_list(value: Any) -> str | None:
    """Empty, or router endpoints each fit for `_router_bind` (no ipc://: a node is on another host),
    none named twice."""
    endpoints = router_endpoints(value)
    for endpoint in endpoints:
        if not endpoint or _router_bind(endpoint):
            return f'must be "tcp://HOST:PORT" or a comma-separated list of them; {endpoint!r} is not one'
    if len(set(endpoints)) < len(endpoints):
        return "must name each router once"
    return None


def _direct_bind(value: Any) -> str | None:
    """Empty, or a tcp:// endpoint fit for `_router_bind` that other nodes can reach: the address the
    workers bind is the one they tell the router, so no wildcard."""
    if not value:
        return None
    found = _TCP_ENDPOINT.fullmatch(value)
    if _router_bind(value) or found is None or (found["v6"] or found["host"]) in ("0.0.0.0", "::"):
        return 'must be empty or "tcp://HOST:PORT" with the address other nodes reach this one at (not a wildcard)'
    return None


_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


def _node_name(value: Any) -> str | None:
    if value == "" or _NODE_NAME.fullmatch(value):
        return None
    return "must be empty or up to 63 letters, digits, '.', '_' or '-' (a letter or digit first)"


def _router_name(value: Any) -> str | None:
    """It names a $SYS topic level (`$SYS/broker/router/members/NAME/state`): no '/', '+', '#'."""
    if any(char in value for char in "/+#\0") or len(value) > 255:
        return "must be at most 255 characters, without '/', '+', '#' or U+0000 (it names a $SYS topic level)"
    return None


def default_router_name(router_bind: str) -> str:
    """The host name, and the port of a tcp:// router_bind: unique among routers on distinct hosts or ports."""
    port = urlsplit(router_bind).port if router_bind else None
    return socket.gethostname() + (f":{port}" if port else "")


def _separator(value: Any) -> str | None:
    """Empty, or characters that no tenant name holds (else `a.b` could be a user or a tenant)."""
    if any(tenants.NAME.fullmatch(char) for char in value):
        return "must be empty or characters that no tenant name holds (not letters, digits, '_', '.' or '-')"
    return _mqtt_string(value)


def _sql_column(value: Any) -> str | None:
    return None if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", value) or not value else "must be a column name"


def _tenant_listeners(value: Any) -> str | None:
    for url in value:
        try:
            tenants.listener(url)
        except (TypeError, ValueError):
            return f'must be a list of "mqtt://HOST:PORT", "mqtts://...", "ws://..." or "wss://..."; {url!r} is not one'
    return None


LOG_LEVELS = ("debug", "info", "warning", "error")
MAX_LISTENERS = 256  # a listener is named by one byte when its sockets are handed to a worker (workers/handoff.py)

SCHEMA: dict[str, dict[str, Option]] = {
    "": {
        "host": Option(str, "127.0.0.1", doc="address the MQTT listener binds"),
        "port": Option(int, 1883, _range(0, 65535), "MQTT TCP port (0: any free port)"),
        "workers": Option(int, 0, _range(0, 1024), "connection worker processes (0: one per core less one)"),
        "log_level": Option(str, "info", _one_of(*LOG_LEVELS), "debug, info, warning or error"),
        "log_format": Option(str, "text", _one_of("text", "json"), "text, or json: one object per line"),
        "stop_timeout": Option(float, 4.0, _range(0.1, 3600), "seconds the router and workers get to stop "
                               "(SIGTERM) before they are killed"),
        "connect_timeout": Option(float, 10.0, _range(0.1), "seconds a new socket has to send CONNECT"),
        "max_packet_size": Option(int, 1 << 20, _range(2, 268_435_460), "largest packet a client may send, bytes"),
        "max_inflight": Option(int, 20, _range(1, 32767), "outgoing QoS 1/2 messages unacknowledged per client"),
        "shared_subscription_strategy": Option(str, "round_robin", _one_of(*STRATEGIES), "which member of a "
                                               "shared subscription gets a message: round_robin, random or sticky"),
        "receive_maximum": Option(int, 1024, _range(1, 65535), "incoming QoS 1/2 PUBLISHes an MQTT 5 client may "
                                  "have unacknowledged at once (more: DISCONNECT 0x93)"),
        "topic_alias_maximum": Option(int, 10, _range(0, 65535), "topic aliases an MQTT 5 client may set per "
                                      "connection (0: none)"),
        "max_user_properties": Option(int, 100, _range(0), "user properties an MQTT 5 packet may carry in one "
                                      "property block (more: DISCONNECT 0x97; 0: no limit)"),
        "max_subscriptions": Option(int, 10_000, _range(0), "topic filters one client may be subscribed to "
                                    "(more: refused, 0x97; 3.1.1: 0x80; 0: no limit)"),
        "max_keepalive": Option(int, 0, _range(0, 65535), "seconds a client's keepalive may be at most: above it (or 0) "
                                "an MQTT 5 client is told this one, a 3.1/3.1.1 client refused (0: no limit)"),
        "response_information": Option(str, "", _mqtt_string, "Response Information for MQTT 5 clients that ask "
                                       "for it (empty: none)"),
        "server_reference": Option(str, "", _mqtt_string, "send every client to this server instead of serving it "
                                   "(empty: serve)"),
        "server_moved": Option(bool, False, doc="with server_reference: the move is permanent (0x9D, else 0x9C)"),
        "max_queued_messages": Option(int, 1000, _range(0), "messages queued per client beyond the inflight window"),
        "max_queued_bytes": Option(int, 0, _range(0), "payload bytes queued per client beyond the inflight window (0: no limit)"),
        "run_dir": Option(str, "", doc="private directory for the internal sockets (empty: a new temporary one)"),
        "router_bind": Option(str, "", _router_bind, "the workers' link to the router: empty (ipc:// in run_dir) "
                              "or tcp://HOST:PORT, encrypted and authenticated with CURVE"),
        "router_curve_dir": Option(str, "", doc="server.key_secret and client.key_secret for a tcp:// "
                                   "router_bind (empty: new keys at each start)"),
        "role": Option(str, "all", _one_of("all", "router", "node"), "all: one host runs everything; router: the "
                       "router alone, binding router_bind; node: listeners and workers joining the router at `router`"),
        "router": Option(str, "", _router_list, "role node: the router's tcp://HOST:PORT (its router_bind), or a "
                         "comma-separated list of them where a standby router may take over"),
        "node_name": Option(str, "", _node_name, "role node: this node's name, unique among the router's nodes "
                            "(empty: the host name)"),
        # standby routers (issue 24): meaningful only with a PostgreSQL store, which several routers share
        "router_lease": Option(float, 2.0, _range(0.5, 60), "with a postgresql:// store: seconds the active router's "
                               "lease lasts without renewal (a standby takes over within about this, plus lease/8)"),
        "router_name": Option(str, "", _router_name, "with a postgresql:// store: this router's name in the lease "
                              "and the ops output, unique among the routers (empty: HOST:PORT of router_bind)"),
        "direct_delivery": Option(bool, True, doc="the workers of one host deliver QoS 0 and 1 messages (and a clean "
                                  "publisher's QoS 2) to each other's subscribers themselves, over Unix sockets in the "
                                  "run dir, not through the router (false: every such message crosses the router)"),
        "direct_bind": Option(str, "", _direct_bind, "role node: tcp://HOST:PORT where this node's workers take QoS 0 "
                              "messages from the workers of other nodes that set it too (worker i at PORT+i, CURVE "
                              "with the router link's keys); empty: messages between this node and others cross "
                              "the router"),
        "link_timeout": Option(float, 5.0, _range(2.0, 3600), "seconds without a word from a worker (its heartbeat "
                               "is once a second) before the router takes it for dead: wills out, sessions kept"),
        "data_dir": Option(str, "plexmq-data", doc="where the router keeps sessions, queues and retained messages"),
        "persistence": Option(bool, True, doc="keep the store on disk (false: everything in memory only)"),
        "sync": Option(str, "normal", _one_of("normal", "full"), "SQLite synchronous mode: normal or full"),
        "store": Option(str, "", doc="where the router keeps its state: empty (SQLite in data_dir) or a PostgreSQL "
                        "DSN, postgresql://USER:PASSWORD@HOST:PORT/DB (shared by standby routers)"),
        "persistent_client_expiration": Option(str, "", _duration_or_never,
                                               "remove persistent sessions offline this long, e.g. 30d (empty: never)"),
        "sys_interval": Option(float, 10.0, _range(0), "seconds between $SYS updates (0: none)"),
        "metrics_host": Option(str, "127.0.0.1", doc="address of the Prometheus endpoint (/metrics, /health)"),
        "metrics_port": Option(int, 9883, _range(-1, 65535), "Prometheus endpoint port (0: any free port, -1: none)"),
        "metrics_tenants": Option(bool, True, doc="per-tenant numbers: /metrics series with a tenant label and each "
                                  "tenant's own $SYS (false: none, for brokers with thousands of tenants)"),
        "console_host": Option(str, "127.0.0.1", doc="address of the operators' web console"),
        "console_port": Option(int, 18083, _range(-1, 65535), "web console port (0: any free port, -1: no console)"),
        "console_admins": Option(str, "", doc="the console's admins and their password hashes (plexmq passwd); "
                                 "empty: every console login is refused"),
        "console_tls": Option(bool, True, doc="serve the console over HTTPS with the [tls] certificate when "
                              "tls.certfile is set (its session cookie then Secure); false: plain HTTP"),
        "memory_limit": Option(int, 0, _range(0), "worker RSS in bytes above which QoS 0 deliveries are shed (0: no limit)"),
        "max_connections": Option(int, 0, _range(0), "connections the broker holds at most (0: no limit)"),
        "max_connection_rate": Option(float, 0.0, _range(0), "new connections per second per client address (0: no limit)"),
        "client_message_rate": Option(float, 0.0, _range(0), "PUBLISH packets per second one client may send (0: no limit)"),
        "client_byte_rate": Option(float, 0.0, _range(0), "bytes per second one client may send (0: no limit)"),
        "rate_limit_action": Option(str, "throttle", _one_of("throttle", "disconnect"), "a client over its rate: "
                                    "read more slowly (throttle) or closed (disconnect; MQTT 5: 0x97)"),
        "allow_networks": Option(list, [], _networks, "client networks (CIDR) that may connect (empty: all)"),
        "deny_networks": Option(list, [], _networks, "client networks (CIDR) that may not connect"),
        "password_file": Option(str, "", doc="users and their password hashes (plexmq passwd); empty: no passwords"),
        "strict_file_modes": Option(bool, False, doc="refuse a password_file other users may read (else a warning)"),
        "acl_file": Option(str, "", doc="who may read and write which topics (mosquitto syntax); empty: everyone all"),
        "auth_database": Option(str, "", doc="users (and with auth_database_acl the ACL) in MySQL/MariaDB: "
                                "mysql://user:password@host:3306/database; empty: none"),
        "auth_database_acl": Option(bool, False, doc="take the ACL rules from the database's plexmq_acl table"),
        "auth_database_cache": Option(float, 60.0, _range(0, 86400), "seconds the database's answers are "
                                      "cached (0: every login asks)"),
        "auth_database_timeout": Option(float, 3.0, _range(0.1, 60), "seconds a login waits for the database "
                                        "before it gets CONNACK 0x03"),
        "jwt_jwks_file": Option(str, "", doc="public keys (JWKS) that sign the JWT bearer tokens clients may "
                                                 "send as their password; empty: no tokens"),
        "jwt_audience": Option(str, "", doc="the audience a token must name (empty: not checked)"),
        "jwt_issuer": Option(str, "", doc="the issuer a token must name (empty: not checked)"),
        "jwt_username_claim": Option(str, "sub", _nonempty, "the claim that names a token's user; a token without "
                                     "it is refused"),
        "jwt_disconnect_on_expiry": Option(bool, False, doc="close a token's connection when the token expires"),
        "allow_anonymous": Option(bool, False, doc="accept clients without a username; needed to listen beyond "
                                                   "loopback without authentication"),
        "tenant_separator": Option(str, "", _separator, "a username `device@acme` names tenant acme (split at the "
                                   "last separator); empty: usernames never name a tenant"),
        "tenant_required": Option(bool, False, doc="refuse a client whose tenant cannot be found (else it is in "
                                  "the default tenant)"),
        "tenants_dir": Option(str, "", doc="a directory of NAME.toml files, each the keys of one [tenants.NAME] "
                              "table (empty: none)"),
        # logins (wave 2: logins): a login that names the tenant, where the listener and the username did not
        "jwt_tenant_claim": Option(str, "", _mqtt_string, "the claim of a broker-wide token that names its "
                                   "client's tenant (empty: none)"),
        "auth_database_tenant_column": Option(str, "", _sql_column, "the column of plexmq_users that names a "
                                              "user's tenant (empty: none)"),
        "tenant_certificate_field": Option(str, "", _one_of("", "O", "OU", "CN"), "the client certificate's "
                                           "subject field that names its tenant: O, OU or CN (empty: none)"),
    },
    "tls": {
        "enabled": Option(bool, False, doc="also listen for MQTT over TLS"),
        "host": Option(str, "", doc="address of the TLS listener (empty: the same as host)"),
        "port": Option(int, 8883, _range(0, 65535), "TLS port"),
        "certfile": Option(str, "", doc="the server certificate (PEM, with its chain)"),
        "keyfile": Option(str, "", doc="the server certificate's private key (PEM)"),
        "cafile": Option(str, "", doc="CA certificates that client certificates are checked against (PEM)"),
        "min_version": Option(str, "1.2", _one_of("1.2", "1.3"), "oldest TLS version accepted: 1.2 or 1.3"),
        "ciphers": Option(str, "", doc="OpenSSL cipher list for TLS 1.2 (empty: Python's defaults)"),
        "require_certificate": Option(bool, False, doc="clients must present a certificate signed by cafile"),
        "use_identity_as_username": Option(bool, False, doc="the client certificate's CN is the username"),
        "crlfile": Option(str, "", doc="revoked client certificates: the CRL (PEM) of the CAs in cafile"),
    },
    "websocket": {
        "enabled": Option(bool, False, doc="also listen for MQTT over WebSocket (subprotocol mqtt)"),
        "host": Option(str, "", doc="address of the WebSocket listener (empty: the same as host)"),
        "port": Option(int, 8080, _range(0, 65535), "WebSocket port"),
        "tls": Option(bool, False, doc="WebSocket over TLS (wss), with the [tls] certificate"),
    },
    "archive": {
        "enabled": Option(bool, False, doc="append matching PUBLISH traffic to segment files"),
        "dir": Option(str, "plexmq-archive", doc="where the segments go"),
        "topics": Option(list, ["#"], _strings, "topic filters to archive"),
        "roll_bytes": Option(int, 64 << 20, _range(1024), "start a new segment after this many bytes"),
        "roll_seconds": Option(float, 300.0, _range(1), "start a new segment after this many seconds"),
        "group": Option(str, "", _group, "a group that may read the segments (0640, dirs 0750); empty: only "
                        "the broker's user (0600, 0700)"),
    },
}


# the keys of a [tenants.NAME] table (or a NAME.toml file in tenants_dir); `config["tenants"]` maps
# each name to them (plexmq/tenants.py makes the registry)
TENANT: dict[str, Option] = {
    "enabled": Option(bool, True, doc="false: its clients are refused (CONNACK 0x03, 5.0: 0x88)"),
    "listeners": Option(list, [], _tenant_listeners, "listeners the tenant owns: a client there is in this "
                        "tenant; mqtts and wss use the [tls] certificate"),
    # limits the router judges (wave 2: limits-router); 0: no limit
    "max_connections": Option(int, 0, _range(0), "live connections of the tenant (CONNACK 0x97, 3.1.1: 0x03)"),
    "max_connection_rate": Option(float, 0.0, _range(0), "CONNECTs accepted per second, a burst of one second's "
                                  "worth (CONNACK 0x9F, 3.1.1: 0x03)"),
    "max_sessions": Option(int, 0, _range(0), "persistent sessions kept, online or offline (CONNACK 0x97, 3.1.1: 0x03)"),
    "max_subscriptions": Option(int, 0, _range(0), "subscriptions of all its clients together (SUBACK 0x97, 3.1.1: 0x80)"),
    "max_retained_messages": Option(int, 0, _range(0), "retained messages kept: a new one past it is not kept"),
    "max_retained_bytes": Option(int, 0, _range(0), "bytes its retained messages hold (topic, payload, properties): "
                                 "one past it is not kept"),
    "max_queued_messages": Option(int, 0, _range(0), "messages queued per session beyond the inflight window "
                                  "(the router's of a persistent one, a worker's of a clean one), instead of the "
                                  "broker's max_queued_messages"),
    # reload (wave 2: reload)
    "on_remove": Option(str, "keep", _one_of("keep", "drop"), "when a reload removes the tenant: keep its persistent "
                        "sessions and retained messages for when it is declared again, or drop them"),
    # limits each worker judges alone (wave 2: limits-worker); 0: the broker's own setting, or no limit
    "max_packet_size": Option(int, 0, lambda value: None if value == 0 or 2 <= value <= 268_435_460 else
                              "must be 0 (the broker's) or between 2 and 268435460",
                              "largest packet its clients may send, bytes, at most the broker's (more: DISCONNECT 0x95)"),
    "max_qos": Option(int, 2, _range(0, 2), "highest QoS its clients may publish with and are granted (a PUBLISH "
                      "above it: DISCONNECT 0x9B; 3.1.1: closed)"),
    "max_session_expiry": Option(int, 0, _range(0, 0xFFFFFFFF), "seconds a session may outlive its connection at "
                                 "most (5.0: told in CONNACK; 3.1.1: instead of persistent_client_expiration)"),
    "max_subscriptions_per_client": Option(int, 0, _range(0), "topic filters one of its clients may hold, in place "
                                           "of max_subscriptions (more: 0x97; 3.1.1: 0x80)"),
    "message_rate": Option(float, 0.0, _range(0), "PUBLISH packets per second all its clients together may send; "
                           "each worker holds them to its equal share"),
    "byte_rate": Option(float, 0.0, _range(0), "bytes per second all its clients together may send; each worker "
                        "holds them to its equal share"),
    # logins (wave 2: logins): where a tenant has none of its own, the broker's apply
    "password_file": Option(str, "", doc="the tenant's users (tenant-local names); set: the broker's are not asked"),
    "acl_file": Option(str, "", doc="the tenant's ACL (%u: the tenant-local name), instead of the broker's"),
    "console_admins": Option(str, "", doc="the tenant's console admins (plexmq passwd): they log in with the "
                             "tenant's name and see and act on this tenant only"),
    "jwt_jwks_file": Option(str, "", doc="keys that sign the tenant's tokens; set: the broker's are not asked"),
    "jwt_audience": Option(str, "", doc="the audience the tenant's tokens must name (empty: not checked)"),
    "jwt_issuer": Option(str, "", doc="the issuer the tenant's tokens must name (empty: not checked)"),
    "allow_anonymous": Option(bool, None, doc="accept the tenant's clients without a username (unset: the broker's rule)"),
    # SQL logins (wave 2: tenant-sql): the broker's auth_database_cache and auth_database_timeout apply
    "auth_database": Option(str, "", doc="the tenant's users (tenant-local names) in MySQL/MariaDB, "
                            "mysql://user:password@host:3306/database; set: the broker's are not asked"),
    "auth_database_acl": Option(bool, False, doc="take the tenant's ACL (%u: the tenant-local name) from its "
                                "database's plexmq_acl table"),
}


def _addresses(value: Any) -> str | None:
    for address in value:
        host, _, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            return f'must be a list of "HOST:PORT" (tried in order); {address!r} is not one'
    return None if value else "must name at least one HOST:PORT"


BRIDGE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")

# the keys of a [bridges.NAME] table (acceptor/bridges/: one process runs them all); `out` and `in` hold rules
# (acceptor/bridges/rules.py), a [bridges.NAME.tls] table (even empty) turns TLS on with its BRIDGE_TLS keys
BRIDGE: dict[str, Option] = {
    "address": Option(list, [], _addresses, "the remote broker: a list of HOST:PORT, tried in order"),
    "protocol": Option(str, "5.0", _one_of("3.1.1", "5.0"), "the MQTT version spoken to the remote"),
    "client_id": Option(str, "", _mqtt_string, "the bridge's client id on the remote (empty: HOSTNAME.NAME)"),
    "username": Option(str, "", _mqtt_string, "the bridge's username on the remote (empty: none)"),
    "password": Option(str, "", doc="its password on the remote (empty: none)"),
    "keepalive": Option(int, 60, _range(1, 65535), "seconds of keepalive toward the remote"),
    "clean_start": Option(bool, False, doc="start a new session on the remote at each connect (3.1.1: clean session)"),
    "session_expiry": Option(int, 86400, _range(0, 0xFFFFFFFF), "5.0: seconds the remote keeps the bridge's session "
                             "while it is away (what `in` rules subscribe to is queued there meanwhile)"),
    "try_private": Option(bool, True, doc="3.1.1: tell the remote that this is a bridge (mosquitto's convention: it "
                          "then echoes none of the bridge's own messages); refused, the bridge asks again without"),
    "tenant": Option(str, "", doc="the tenant the bridge's messages are in locally (empty: the default tenant)"),
    "out": Option(list, [], doc="rules: local filter -> remote topic"),
    "in": Option(list, [], doc="rules: remote filter -> local topic"),
    "tls": Option(dict, None, doc="TLS toward the remote (a [bridges.NAME.tls] table)"),
}
BRIDGE_TLS: dict[str, Option] = {
    "cafile": Option(str, "", doc="CA certificates the remote's certificate is checked against (empty: the system's)"),
    "certfile": Option(str, "", doc="the bridge's client certificate (PEM, empty: none)"),
    "keyfile": Option(str, "", doc="its private key (PEM; empty: in certfile)"),
    "server_name": Option(str, "", doc="the name the remote's certificate must hold (empty: the address's host)"),
    "alpn": Option(list, [], _strings, "ALPN protocols offered (empty: none)"),
}


def _defaults(options: dict[str, Option]) -> dict[str, Any]:
    return {key: list(option.default) if isinstance(option.default, list) else option.default
            for key, option in options.items()}


def defaults() -> dict[str, Any]:
    config: dict[str, Any] = _defaults(SCHEMA[""])
    for section, options in SCHEMA.items():
        if section:
            config[section] = _defaults(options)
    config["tenants"] = {}
    config["bridges"] = {}
    config["bridge_logins"] = {}  # serve's: the local client id of each bridge -> [its token, its tenant]
    return config


def _options(section: str) -> dict[str, Option]:
    """The options of a section: a `tenants.NAME` one has a tenant's, a `bridges.NAME` one a bridge's."""
    if section.startswith("bridges."):
        return BRIDGE_TLS if section.endswith(".tls") else BRIDGE
    return TENANT if section.startswith("tenants.") else SCHEMA[section]


def _coerce(option: Option, value: Any) -> Any:
    """The value as the option's type, or raise ValueError with the reason."""
    if option.kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, option.kind) or (option.kind is int and isinstance(value, bool)):
        raise ValueError(f"must be {'a number' if option.kind is float else option.kind.__name__}, not {value!r}")
    reason = option.check(value)
    if reason:
        raise ValueError(f"{reason}, not {value!r}")
    return value


def _line_of(text: str, section: str, key: str) -> int:
    """The line where `key` of `section` is set in the TOML text: `key =` under `[section]`,
    `section.key =` at the top, or a `[key]` table header (0 when not found)."""
    current = ""
    dotted = re.escape(f"{section}.{key}" if section else key)
    assignment = re.compile(rf"^\s*(\"?){re.escape(key)}\1\s*=")
    top_level = re.compile(rf"^\s*{dotted}\s*=")
    for number, line in enumerate(text.splitlines(), 1):
        header = re.match(r"^\s*\[\s*([^\]]+?)\s*\]", line)
        if header:
            current = re.sub(r'\s*\.\s*', ".", header.group(1).replace('"', ""))  # [tenants."a.b"] is tenants.a.b
            if not section and current == key:
                return number
        elif current == section and assignment.match(line) or current == "" and top_level.match(line):
            return number
    return 0


def load(path: str | None, overrides: dict[str, Any]) -> dict[str, Any]:
    """Defaults, then the file at `path`, then `overrides` (top-level keys from the command line)."""
    config = defaults()
    text = ""
    origins: Origins = {}  # tenant name -> where its keys are set
    if path:
        text = _text(path)
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from None
        _merge(config, data, path, text, origins)
    if config["tenants_dir"]:
        _load_tenants_dir(config, config["tenants_dir"], path or "", text, origins)
    for key, value in overrides.items():
        try:
            config[key] = _coerce(SCHEMA[""][key], value)
        except ValueError as exc:
            raise ConfigError(f"--{key.replace('_', '-')}: {exc}") from None
    _check_exposure(config, origins)
    if config["server_moved"] and not config["server_reference"]:
        raise ConfigError("server_moved: needs server_reference (where the clients go)")
    if config["tenant_required"] and not config["tenants"]:
        raise ConfigError("tenant_required: no tenant is declared ([tenants.NAME] or tenants_dir): every client "
                          "would be refused")
    _check_auth_files(config)
    _check_tenant_logins(config, origins)
    _check_listeners(config, origins)
    _check_tls(config)
    _check_router_link(config)
    _check_store(config)
    _check_bridges(config, path or "", text)
    return config


def _check_store(config: dict[str, Any]) -> None:
    """`store`: empty or a PostgreSQL DSN, for a host that runs the router. The lines never repeat the
    value: a DSN may hold a password."""
    store = config["store"]
    if not store:
        return
    if not store.startswith(("postgresql://", "postgres://")):
        raise ConfigError("store: must be empty (SQLite in data_dir) or a PostgreSQL DSN (postgresql://... or "
                          "postgres://...)")
    if config["role"] == "node":
        raise ConfigError("store: not for role node (the router keeps the store)")
    if not config["persistence"]:
        raise ConfigError("store: a PostgreSQL store needs persistence = true")
    from psycopg import Error
    from psycopg.conninfo import conninfo_to_dict  # only where a PostgreSQL store is named

    try:
        host = str(conninfo_to_dict(store).get("host", ""))
    except Error:  # its text would repeat the DSN's parts, the password among them
        raise ConfigError("store: not a valid PostgreSQL URL (percent-encode any special character in the user "
                          "name or password, and use only libpq's parameters after '?')") from None
    if "@" in host:  # an unencoded '@' in the password: the rest of it would be taken for the host, and logged
        raise ConfigError("store: the host part holds an '@': percent-encode it in the password (%40)")


def _check_auth_files(config: dict[str, Any]) -> None:
    """Read the password file and the ACL once, so that a bad line stops startup, not a worker. The
    database is not asked: one that is down at startup answers CONNACK 0x03 until it is back."""
    if config["auth_database"] and config["password_file"]:
        raise ConfigError("auth_database and password_file: set one of them, not both")
    if config["auth_database_acl"] and (config["acl_file"] or not config["auth_database"]):
        raise ConfigError("auth_database_acl: needs auth_database, and acl_file empty")
    if config["auth_database"]:
        try:
            connect_args(config["auth_database"])
        except ValueError as exc:  # said without the value: it holds a password
            raise ConfigError(f"auth_database: {exc}") from None
    try:
        if config["password_file"]:
            PasswordFile.load(config["password_file"])
            _check_private(config["password_file"], config["strict_file_modes"])
        if config["console_admins"]:
            PasswordFile.load(config["console_admins"])
            _check_private(config["console_admins"], config["strict_file_modes"])
        if config["acl_file"]:
            AclFile.load(config["acl_file"])
        if config["jwt_jwks_file"]:
            TokenVerifier(config["jwt_jwks_file"], config["jwt_audience"], config["jwt_issuer"], config["jwt_username_claim"])
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _check_tenant_logins(config: dict[str, Any], origins: Origins) -> None:
    """Each tenant's login and ACL files read once, and the keys that name a tenant from a login checked
    against what they need, so that a bad line or setting stops startup with its place."""
    if config["auth_database_tenant_column"] and not config["auth_database"]:
        raise ConfigError("auth_database_tenant_column: needs auth_database (the table that holds the column)")
    keys = config["jwt_jwks_file"] or any(table["jwt_jwks_file"] for table in config["tenants"].values())
    if config["jwt_tenant_claim"] and not keys:
        raise ConfigError("jwt_tenant_claim: needs jwt_jwks_file (the keys of the tokens that carry the claim)")
    if config["tenant_certificate_field"] and not config["tls"]["require_certificate"]:
        raise ConfigError("tenant_certificate_field: needs tls.require_certificate = true")
    for name, table in config["tenants"].items():
        for key in ("jwt_audience", "jwt_issuer"):
            if table[key] and not table["jwt_jwks_file"]:
                raise ConfigError(f"{origins[name](key)}: key 'tenants.{name}.{key}' needs tenants.{name}.jwt_jwks_file")
        for key in ("password_file", "acl_file", "jwt_jwks_file", "console_admins"):
            if table[key]:
                try:
                    _read_tenant_file(key, table, config)
                except (ValueError, ConfigError) as exc:
                    raise ConfigError(f"{origins[name](key)}: key 'tenants.{name}.{key}': {exc}") from None
        _check_tenant_database(name, table, origins)


def _check_tenant_database(name: str, table: dict[str, Any], origins: Origins) -> None:
    """A tenant's auth_database checked as the broker's is (the URL only, said without it: it holds a password)."""

    def where() -> str:  # only for an error (origins scan the file)
        return f"{origins[name]('auth_database')}: key 'tenants.{name}.auth_database'"

    if table["auth_database"] and table["password_file"]:
        raise ConfigError(f"{where()}: set it or tenants.{name}.password_file, not both")
    if table["auth_database"]:
        try:
            connect_args(table["auth_database"])
        except ValueError as exc:
            raise ConfigError(f"{where()}: {exc}") from None
    if table["auth_database_acl"] and (table["acl_file"] or not table["auth_database"]):
        raise ConfigError(f"{origins[name]('auth_database_acl')}: key 'tenants.{name}.auth_database_acl': needs "
                          f"tenants.{name}.auth_database, and tenants.{name}.acl_file empty")


def _read_tenant_file(key: str, table: dict[str, Any], config: dict[str, Any]) -> None:
    """Read a tenant's `key` file as a worker will; ValueError (file:line: why) when it cannot be."""
    path = table[key]
    if key in ("password_file", "console_admins"):
        PasswordFile.load(path)
        _check_private(path, config["strict_file_modes"])
    elif key == "acl_file":
        AclFile.load(path)
    else:
        TokenVerifier(path, table["jwt_audience"], table["jwt_issuer"], config["jwt_username_claim"])


def _check_private(path: str, strict: bool) -> None:
    """A password file holds hashes and SCRAM keys, which a local user could guess against offline:
    readable by others, it is refused (strict_file_modes) or warned about, at start and at each reload."""
    exposed = others_may_read(path)
    if not exposed:
        return
    said = f"password_file: {path} is readable by other users (mode {exposed:o}): chmod o-rw it"
    if strict:
        raise ConfigError(f"{said} (strict_file_modes)")
    log.warning("%s, or set strict_file_modes = true to refuse such a file", said)


def _check_tls(config: dict[str, Any]) -> None:
    """Build the TLS context once, so that a missing or bad certificate stops startup, not a worker
    (or the console)."""
    if tls.wanted(config) or tls.console_wanted(config):
        try:
            tls.server_context(config["tls"])
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def _check_router_link(config: dict[str, Any]) -> None:
    """The link and the role must fit each other; the CURVE key files are read once, so that a
    missing or bad one stops startup, not the router."""
    role = config["role"]
    if role == "router" and not config["router_bind"]:
        raise ConfigError("role router: needs router_bind = \"tcp://HOST:PORT\" (where the nodes join it)")
    if role == "node" and not config["router"]:
        raise ConfigError("role node: needs router = \"tcp://HOST:PORT\" (the router's router_bind)")
    if role != "node" and config["router"]:
        raise ConfigError("router: only for role node (this host runs the router itself)")
    if role == "node" and config["router_bind"]:
        raise ConfigError("router_bind: not for role node (the router binds it; set router)")
    if config["direct_bind"]:
        if role != "node":
            raise ConfigError("direct_bind: only for role node (the workers of one host reach each other by ipc://)")
        if (urlsplit(config["direct_bind"]).port or 0) + config["workers"] > 65536:
            raise ConfigError(f"direct_bind: its port + workers ({config['workers']}) passes 65535")
    if role != "all" and not config["router_curve_dir"]:
        raise ConfigError(f"role {role}: needs router_curve_dir with the keys the router and its nodes share")
    if config["router_curve_dir"]:
        if not config["router_bind"] and not config["router"]:
            raise ConfigError("router_curve_dir: needs a tcp:// router_bind (the ipc:// link has no keys)")
        curve_keys(config["router_curve_dir"])


def curve_keys(key_dir: str) -> dict[str, str]:
    """The CURVE keys of a tcp:// router link (z85): the server's and the workers' (client) pair, read
    from key_dir (as `zmq.auth.create_certificates(key_dir, "server")` and `"client"` write them),
    or new ones that only this run's processes learn."""
    if not key_dir:
        (server_public, server_secret), (client_public, client_secret) = zmq.curve_keypair(), zmq.curve_keypair()
    else:
        pairs = []
        for name in ("server", "client"):
            path = os.path.join(key_dir, f"{name}.key_secret")
            try:
                public, secret = zmq.auth.load_certificate(path)
            except (OSError, ValueError) as exc:  # a missing file is an OSError without strerror
                raise ConfigError(f"router_curve_dir: {exc}") from None
            if len(public) != 40 or not secret or len(secret) != 40:
                raise ConfigError(f"router_curve_dir: {path} holds no CURVE key pair (z85, 40 characters each)")
            pairs.append((public, secret))
        (server_public, server_secret), (client_public, client_secret) = pairs
    return {"server_public": server_public.decode(), "server_secret": server_secret.decode(),
            "client_public": client_public.decode(), "client_secret": client_secret.decode()}


def listeners(config: dict[str, Any]) -> list[tuple[str, str, int, str]]:
    """(scheme, host, port, owning tenant) of every enabled listener: the broker's own (tenant "", the
    plain MQTT one first), then each tenant's in its table's order, the tenants by name; the scheme is
    one of mqtt, mqtts, ws, wss. A listener's place in this list names it to the workers (handoff.py)."""
    found = [("mqtt", config["host"], config["port"], "")]
    secure, websocket = config["tls"], config["websocket"]
    if secure["enabled"]:
        found.append(("mqtts", secure["host"] or config["host"], secure["port"], ""))
    if websocket["enabled"]:
        found.append(("wss" if websocket["tls"] else "ws", websocket["host"] or config["host"], websocket["port"], ""))
    for name, table in sorted(config["tenants"].items()):
        found.extend((*tenants.listener(url), name) for url in table["listeners"])
    return found


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def logins(config: dict[str, Any]) -> list[str]:
    """The sources of logins the config names, as the startup line says them."""
    found = []
    if config["password_file"]:
        found.append(f"password file {config['password_file']}")
    if config["auth_database"]:
        found.append("database (auth_database)")  # its URL may hold a password: never logged
    if config["jwt_jwks_file"]:
        found.append(f"JWT keys {config['jwt_jwks_file']}")
    return found


def security_line(config: dict[str, Any]) -> str:
    """What the operator is told at startup about who may connect (the safe default says so)."""
    if not logins(config):
        if config["allow_anonymous"]:
            return "no authentication: anonymous clients allowed (allow_anonymous = true)"
        return "no authentication configured: listening on loopback only"
    acl = config["acl_file"] or ("the database's ACL" if config["auth_database_acl"] else "none (all topics)")
    return (f"authentication: {', '.join(logins(config))}; anonymous clients "
            f"{'allowed' if config['allow_anonymous'] else 'refused'}; ACL: {acl}")


def _check_exposure(config: dict[str, Any], origins: Origins) -> None:
    """Safe default: without authentication the broker stays on loopback unless told otherwise. A
    tenant's listener counts the tenant's own logins and anonymous rule, where it has them."""
    if config["role"] == "router":  # a router has no listeners
        return
    for scheme, host, port, name in listeners(config):
        table = config["tenants"].get(name) if name else None
        anonymous = config["allow_anonymous"] if table is None or table["allow_anonymous"] is None else table["allow_anonymous"]
        guarded = logins(config) or table is not None and tenants.tenant(name, table).own_logins
        if guarded or anonymous or is_loopback(host):
            continue
        if table is None:
            raise ConfigError(f"host {host!r}: listening beyond loopback needs authentication "
                              "(password_file or auth_database) or allow_anonymous = true")
        raise ConfigError(f"{origins[name]('listeners')}: tenants.{name}.listeners: {scheme}://{_address(host, port)}: "
                          "listening beyond loopback needs authentication (the tenant's or the broker's "
                          "password_file, jwt_jwks_file or auth_database) or allow_anonymous = true")


def _merge(config: dict[str, Any], data: dict[str, Any], path: str, text: str, origins: Origins) -> None:
    for key, value in data.items():
        if key == "tenants":
            _merge_tenants(config["tenants"], value, path, text, origins)
        elif key == "bridges":
            _merge_bridges(config["bridges"], value, path, text)
        elif isinstance(value, dict) and key in SCHEMA and key:
            for sub, sub_value in value.items():
                _set(config[key], key, sub, sub_value, path, text)
        else:
            _set(config, "", key, value, path, text)


def _merge_tenants(found: dict[str, Any], data: Any, path: str, text: str, origins: Origins) -> None:
    """The [tenants.NAME] tables of the config file."""
    if not isinstance(data, dict) or not all(isinstance(table, dict) for table in data.values()):
        raise ConfigError(f"{path}:{_line_of(text, '', 'tenants')}: key 'tenants' must hold [tenants.NAME] tables")
    for name, table in data.items():
        _add_tenant(found, name, table, path, text, f"tenants.{name}", origins)


def _merge_bridges(found: dict[str, Any], data: Any, path: str, text: str) -> None:
    """The [bridges.NAME] tables: each bridge's keys, its rules parsed (acceptor/bridges/rules.py) and stored as
    plain tables, its [bridges.NAME.tls] table."""
    if not isinstance(data, dict) or not all(isinstance(table, dict) for table in data.values()):
        raise ConfigError(f"{path}:{_line_of(text, '', 'bridges')}: key 'bridges' must hold [bridges.NAME] tables")
    for name, table in data.items():
        section = f"bridges.{name}"
        if not BRIDGE_NAME.fullmatch(name):
            raise ConfigError(f"{path}:{_line_of(text, '', section)}: bridge name {name!r}: must be 1 to 64 letters, "
                              "digits, '_' or '-'")
        bridge = found[name] = _defaults(BRIDGE)
        for key, value in table.items():
            if key in ("out", "in") and isinstance(value, list):
                bridge[key] = [_bridge_rule(rule, f"{section}.{key}[{index}]", path, _line_of(text, section, key))
                               for index, rule in enumerate(value)]
            elif key == "tls" and isinstance(value, dict):
                bridge["tls"] = _defaults(BRIDGE_TLS)
                for sub, sub_value in value.items():
                    _set(bridge["tls"], f"{section}.tls", sub, sub_value, path, text)
            else:
                _set(bridge, section, key, value, path, text)
        if not bridge["address"]:
            raise ConfigError(f"{path}:{_line_of(text, '', section)}: [{section}] needs address (the remote's HOST:PORT)")
        if not bridge["out"] and not bridge["in"]:
            raise ConfigError(f"{path}:{_line_of(text, '', section)}: [{section}] needs an out or in rule")


def _bridge_rule(table: Any, name: str, path: str, line: int) -> dict[str, Any]:
    try:
        rule = bridge_rules.parse(table)
    except ValueError as exc:
        raise ConfigError(f"{path}:{line}: key '{name}': {exc}") from None
    return {"filter": rule.filter, "prefix": rule.prefix, "strip": rule.strip, "qos": rule.qos, "retain": rule.retain}


def _check_bridges(config: dict[str, Any], path: str, text: str) -> None:
    """Bridges run beside the listeners of one host (role all), in declared tenants, with TLS files
    that load (read once here, so a bad one stops startup, not the bridge)."""
    for name, bridge in config["bridges"].items():
        section = f"bridges.{name}"
        if config["role"] != "all":
            raise ConfigError(f"{path}:{_line_of(text, '', section)}: [{section}]: bridges run with role all only")
        if bridge["tenant"] and bridge["tenant"] not in config["tenants"]:
            raise ConfigError(f"{path}:{_line_of(text, section, 'tenant')}: key '{section}.tenant': no tenant "
                              f"{bridge['tenant']!r} is declared")
        if bridge["tls"] is not None:
            try:
                client_context(bridge["tls"])
            except (OSError, ValueError) as exc:
                raise ConfigError(f"{path}:{_line_of(text, '', section + '.tls')}: [{section}.tls]: {exc}") from None


def _add_tenant(found: dict[str, Any], name: str, table: dict[str, Any], path: str, text: str, section: str,
                origins: Origins) -> None:
    """Check a tenant's name and keys into `found`, and where its keys are set into `origins`;
    `section`: where its keys are in `text` ("": a tenants_dir file, at its top)."""
    unfit = tenants.unfit_name(name)
    if unfit:
        raise ConfigError(f"{path}:{_line_of(text, '', section) if section else 1}: {unfit}")
    found[name] = _defaults(TENANT)
    for key, value in table.items():
        _set(found[name], f"tenants.{name}", key, value, path, text, section)
    origins[name] = lambda key: f"{path}:{_line_of(text, section, key)}"


def _load_tenants_dir(config: dict[str, Any], directory: str, path: str, text: str, origins: Origins) -> None:
    """Each NAME.toml of tenants_dir: one tenant; a name the config file declares too is an error that
    names both places."""
    try:
        files = sorted(entry for entry in os.listdir(directory) if entry.endswith(".toml"))
    except OSError as exc:
        raise ConfigError(f"tenants_dir: cannot read {directory}: {exc.strerror}") from None
    for file in files:
        name, file_path = file[:-len(".toml")], os.path.join(directory, file)
        if name in config["tenants"]:
            raise ConfigError(f"tenant {name!r}: declared twice, in {path}:{_line_of(text, '', f'tenants.{name}')} "
                              f"and in {file_path}")
        file_text = _text(file_path)
        try:
            table = tomllib.loads(file_text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{file_path}: invalid TOML: {exc}") from None
        _add_tenant(config["tenants"], name, table, file_path, file_text, "", origins)


def _text(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from None


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _check_listeners(config: dict[str, Any], origins: Origins) -> None:
    """Tenant listeners (`origins`: where each tenant sets them): none on another listener's
    host:port, TLS ones only with a certificate, and few enough for a worker to tell them apart."""
    found = listeners(config)
    if len(found) > MAX_LISTENERS:
        raise ConfigError(f"{len(found)} listeners: at most {MAX_LISTENERS}")
    for index, (scheme, host, port, name) in enumerate(found):
        if not name:
            continue
        said = f"{origins[name]('listeners')}: tenants.{name}.listeners: {scheme}://{_address(host, port)}"
        if scheme in ("mqtts", "wss") and not config["tls"]["certfile"]:
            raise ConfigError(f"{said} needs the [tls] certfile (and keyfile)")
        for other_scheme, other_host, other_port, other in found[:index]:
            if port and port == other_port and (host == other_host or {host, other_host} & {"0.0.0.0", "::"}):
                owner = f"tenant {other}'s" if other else "the broker's"
                raise ConfigError(f"{said} clashes with {owner} {other_scheme} listener on {_address(other_host, other_port)}")


def _set(target: dict[str, Any], section: str, key: str, value: Any, path: str, text: str,
         found_in: str | None = None) -> None:
    """Check `key` of `section` into `target`; `found_in`: the section `text` sets it in, when not
    `section` (a tenants_dir file sets a tenant's keys at its top)."""
    name = f"{section}.{key}" if section else key

    def where() -> str:  # only for an error: finding the line scans the file (2,000 tenants: 2,000 scans)
        return f"{path}:{_line_of(text, section if found_in is None else found_in, key)}"

    option = _options(section).get(key)
    if option is None:
        hint = f" ({key} is a top-level key: set it above the file's first [table])" if section and key in _options("") else ""
        raise ConfigError(f"{where()}: unknown key '{name}'{hint}")
    try:
        target[key] = _coerce(option, value)
    except ValueError as exc:
        raise ConfigError(f"{where()}: key '{name}' {exc}") from None
