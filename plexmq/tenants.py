"""The declared tenants (issue 23) and the rule that finds a connection's tenant.

The config holds them as plain data (`config["tenants"]`: name -> its table's keys, checked by
acceptor/config.py); `Tenants.from_config` makes the frozen registry that the acceptor and each worker
read. The default tenant `""` is never declared: it always exists and is always enabled. `resolve` is
the rule of issue 23 (listener owner, then the username suffix, then the default or a refusal), kept
pure so that it can be tested as a table; the worker turns a refusal into a CONNACK.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

DEFAULT = ""  # the default tenant's name
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
NAME_RULE = "up to 64 letters, digits, '_', '.' or '-'"
# the scheme, host and port of a tenant's listener, as `listeners` writes them
LISTENER = re.compile(r"(?P<scheme>mqtts?|wss?)://(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9.-]+)):(?P<port>\d{1,5})")

# the limits the router judges (wave 2: limits-router): `Tenant` fields and [tenants.NAME] keys
ROUTER_LIMITS = ("max_connections", "max_connection_rate", "max_sessions", "max_subscriptions", "max_retained_messages",
                 "max_retained_bytes", "max_queued_messages")

# why a connection has no tenant
UNKNOWN = "unknown"  # its username (or its login) names a tenant that is not declared
# on a tenant's listener (its certificate), logins are that tenant's: a username naming another is refused
OWN_PORT = "own port"
CERTIFIED = "certified"
NONE_FOUND = "none found"  # nothing names a tenant and tenant_required is set
DISABLED = "disabled"  # its tenant is declared with enabled = false
OWN_LOGINS = "own logins"  # a broker-wide login names a tenant that checks logins of its own

# the limits each worker judges alone (wave 2: limits-worker), as `Tenant` fields and `[tenants.NAME]` keys
WORKER_LIMITS = ("max_packet_size", "max_qos", "max_session_expiry", "max_subscriptions_per_client", "message_rate",
                 "byte_rate")
# the tenant's own logins and ACL, as `Tenant` fields and `[tenants.NAME]` keys
LOGINS = ("password_file", "acl_file", "jwt_jwks_file", "jwt_audience", "jwt_issuer", "allow_anonymous")
# the tenant's own SQL logins (wave 2: tenant-sql), as `Tenant` fields and `[tenants.NAME]` keys
SQL_LOGINS = ("auth_database", "auth_database_acl")


@dataclass(frozen=True, slots=True)
class Tenant:
    """One declared tenant's config: where its clients connect, its logins and ACL, its limits."""
    name: str
    enabled: bool = True
    listeners: tuple[str, ...] = ()  # "mqtt://HOST:PORT" ...: connections on them are this tenant's
    # limits the router judges (wave 2: limits-router); 0: no limit
    max_connections: int = 0  # live connections
    max_connection_rate: float = 0.0  # CONNECTs accepted per second (a burst of one second's worth)
    max_sessions: int = 0  # persistent sessions kept, online or offline
    max_subscriptions: int = 0  # subscriptions of all its clients together
    max_retained_messages: int = 0
    max_retained_bytes: int = 0  # payload bytes
    max_queued_messages: int = 0  # per session, instead of the broker's max_queued_messages
    # reload (wave 2: reload)
    on_remove: str = "keep"  # a reload that removes it keeps its sessions and retained messages, or drops them ("drop")
    # limits each worker judges alone (wave 2: limits-worker; workers/tenant_limits.py); 0: the broker's own / none
    max_packet_size: int = 0
    max_qos: int = 2
    max_session_expiry: int = 0
    max_subscriptions_per_client: int = 0
    message_rate: float = 0.0  # the whole tenant's, over all workers
    byte_rate: float = 0.0
    # logins (wave 2: logins): its own; where it has none, the broker's apply
    password_file: str = ""
    acl_file: str = ""
    jwt_jwks_file: str = ""
    jwt_audience: str = ""
    jwt_issuer: str = ""
    allow_anonymous: bool | None = None  # None: the broker's
    # SQL logins (wave 2: tenant-sql): its users (and with auth_database_acl its ACL) in a database of its own
    auth_database: str = ""
    auth_database_acl: bool = False

    @property
    def own_logins(self) -> bool:
        """Whether its clients log in against its own files or database (with the tenant-local username), never the broker's."""
        return bool(self.password_file or self.jwt_jwks_file or self.auth_database)

    @property
    def limits_connects(self) -> bool:
        """Whether the router judges its CONNECTs (its clean sessions wait for the router's answer too)."""
        return bool(self.max_connections or self.max_connection_rate or self.max_sessions)


class Found(NamedTuple):
    tenant: str
    username: str | None  # the tenant-local username (without the suffix that named the tenant)
    open: bool = False  # nothing named a tenant yet, and the login may (`settle`)


class Refused(NamedTuple):
    kind: str  # UNKNOWN, OWN_PORT, CERTIFIED, NONE_FOUND, DISABLED or OWN_LOGINS
    tenant: str  # the name that was asked for ("" for NONE_FOUND); OWN_PORT, CERTIFIED: the one it is bound to


@dataclass(frozen=True, slots=True)
class Tenants:
    """The registry: the declared tenants and how a connection names one."""
    declared: Mapping[str, Tenant] = field(default_factory=dict)
    separator: str = ""  # tenant_separator: "" means usernames never name a tenant
    required: bool = False  # tenant_required
    # logins (wave 2: logins): whether a broker-wide login (a JWT claim, an SQL column) may name the tenant
    by_login: bool = False

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Tenants:
        return cls({name: tenant(name, table) for name, table in config["tenants"].items()},
                   config["tenant_separator"], config["tenant_required"],
                   bool(config["jwt_tenant_claim"] or config["auth_database_tenant_column"]))


def tenant(name: str, table: dict[str, Any]) -> Tenant:
    """The `Tenant` of a checked `[tenants.NAME]` table."""
    return Tenant(name, table["enabled"], tuple(table["listeners"]), on_remove=table["on_remove"],
                  **{key: table[key] for key in (*ROUTER_LIMITS, *WORKER_LIMITS, *LOGINS, *SQL_LOGINS)})


def unfit_name(name: str) -> str | None:
    """Why `name` cannot name a tenant, or None."""
    return None if NAME.fullmatch(name) else f"a tenant name is {NAME_RULE}, not {name!r}"


def listener(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a tenant listener's URL; ValueError when it is not one."""
    found = LISTENER.fullmatch(url)
    if found is None or int(found["port"]) > 65535:
        raise ValueError(url)
    return found["scheme"], found["v6"] or found["host"], int(found["port"])


def diff(old: Mapping[str, Tenant], new: Mapping[str, Tenant]) -> tuple[set[str], set[str], set[str]]:
    """(added, changed, removed) tenant names from `old` to `new`: what a reload must apply."""
    added = new.keys() - old.keys()
    removed = old.keys() - new.keys()
    changed = {name for name in new.keys() & old.keys() if new[name] != old[name]}
    return set(added), changed, set(removed)


def resolve(tenants: Tenants, owner: str, username: str | None, certified: str = "") -> Found | Refused:
    """The tenant of a connection on a listener of tenant `owner` ("": one of the broker's own) that
    logs in as `username`, with a client certificate whose tenant_certificate_field names `certified`
    ("": none). A certificate counts as the listener does, and must agree with it. On an owned listener a
    username suffix naming the owner is taken off, one naming another declared tenant is refused (the
    listener, or the certificate, binds its logins to its tenant), any other is part of the username.
    When nothing names one and a login may, the answer is `open`."""
    declared = tenants.declared
    bound = OWN_PORT
    if certified:
        if owner and owner != certified:
            return Refused(OWN_PORT, owner)
        if not owner:
            owner, bound = certified, CERTIFIED
    named, local = None, username
    if tenants.separator and username is not None and tenants.separator in username:
        prefix, _, suffix = username.rpartition(tenants.separator)
        if not owner or suffix in declared:
            named, local = suffix, prefix
    if owner:
        if named is not None and named != owner:
            return Refused(bound, owner)
        named = owner
    if named is None:
        if tenants.by_login:
            return Found(DEFAULT, username, True)
        return Refused(NONE_FOUND, DEFAULT) if tenants.required else Found(DEFAULT, username)
    found = declared.get(named)
    if found is None:
        return Refused(UNKNOWN, named)
    return Found(named, local) if found.enabled else Refused(DISABLED, named)


def settle(tenants: Tenants, found: Found, claimed: str) -> Found | Refused:
    """The tenant of a connection that `resolve` found as `found` once its login (checked by the broker's
    logins when `found` is open, else by `found.tenant`'s) named `claimed` ("": none): a login may name a
    tenant only where nothing else did, or the same one; that tenant must be declared, enabled, and
    without logins of its own (they were not the ones checked)."""
    if not claimed:
        return Refused(NONE_FOUND, DEFAULT) if found.open and tenants.required else found._replace(open=False)
    if not found.open:
        return found if claimed == found.tenant else Refused(UNKNOWN, claimed)
    named = tenants.declared.get(claimed)
    if named is None:
        return Refused(UNKNOWN, claimed)
    if not named.enabled:
        return Refused(DISABLED, claimed)
    if named.own_logins:
        return Refused(OWN_LOGINS, claimed)
    return Found(claimed, local_name(tenants, claimed, found.username))


def local_name(tenants: Tenants, name: str, username: str | None) -> str | None:
    """`username` within tenant `name`: without the suffix that names it, if it has one."""
    suffix = tenants.separator + name
    if name and tenants.separator and username is not None and username.endswith(suffix):
        return username[:-len(suffix)]
    return username
