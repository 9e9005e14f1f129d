"""CONNECT: the protocol level, the client id, the keepalive, the login (which may wait for a password
check or a database, or run an enhanced authentication exchange), the will against the ACL; then the
session is claimed from the router, whose answer (`Connection.session_ready`) sends the CONNACK. A
5.0 client also agrees its limits here (`workers.negotiated`) and hears every refusal's reason code
and reason string; with `server_reference` set every client is sent there instead. A node's worker
without a router (`RouterLink.missing`) refuses every CONNECT; one of a single-host broker lets it
wait for its own router, which may be loading a large store after a restart. Its tenant is
found (plexmq/tenants.py) before its login is checked, against that tenant's logins (`Auth.of`); where
nothing named one, a broker-wide login may (`settle`): one that cannot be found is refused. Its
tenant's limits (workers/tenant_limits.py) are found with the tenant, once."""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import time
import uuid
from functools import partial
from typing import TYPE_CHECKING

from plexmq.bans import Ban, BanSet
from plexmq.mqtt import properties as props
from plexmq.mqtt import reasons, v4, v5
from plexmq.mqtt.connect import Connect, RefusedConnect, decode_connect
from plexmq.mqtt.framing import PROTOCOL_ERROR
from plexmq.tenants import (
    CERTIFIED,
    DISABLED,
    NONE_FOUND,
    OWN_LOGINS,
    OWN_PORT,
    UNKNOWN,
    Found,
    Refused,
    local_name,
    resolve,
    settle,
)
from plexmq.workers.auth import scram
from plexmq.workers.auth.acl import may_publish
from plexmq.workers.auth.logins import BAD_CREDENTIALS, NOT_AUTHORIZED, SERVER_UNAVAILABLE
from plexmq.workers.negotiated import Negotiated
from plexmq.workers.states import AUTHENTICATING, CHALLENGED, CONNECTING
from plexmq.workers.tls import unfit_username

if TYPE_CHECKING:
    from plexmq.workers.connection import Connection
    from plexmq.workers.tenant_limits import Limits
    from plexmq.workers.worker import Worker

log = logging.getLogger("plexmq.worker")

MQISDP_MAX_CLIENT_ID = 23  # MQTT 3.1 limits client ids to 23 characters
IDENTIFIER_REJECTED = 0x02  # 3.1.1 CONNACK return codes; the others come from workers.auth.logins
# the 5.0 reason code for each 3.1.1 CONNACK return code
_AS_V5 = {0x01: reasons.UNSUPPORTED_PROTOCOL_VERSION, IDENTIFIER_REJECTED: reasons.CLIENT_IDENTIFIER_NOT_VALID,
          SERVER_UNAVAILABLE: reasons.SERVER_UNAVAILABLE, BAD_CREDENTIALS: reasons.BAD_USER_NAME_OR_PASSWORD,
          NOT_AUTHORIZED: reasons.NOT_AUTHORIZED}
# a connection without a tenant: its CONNACK code (3.1.1; 5.0 through _AS_V5) and reason string
_NO_TENANT = {UNKNOWN: (BAD_CREDENTIALS, "unknown tenant {!r}"), NONE_FOUND: (NOT_AUTHORIZED, "no tenant found"),
              OWN_PORT: (BAD_CREDENTIALS, "this port serves tenant {!r} only"),
              CERTIFIED: (BAD_CREDENTIALS, "the client certificate is tenant {!r}'s"),
              DISABLED: (SERVER_UNAVAILABLE, "tenant {!r} is disabled"),
              OWN_LOGINS: (BAD_CREDENTIALS, "tenant {!r} checks logins of its own")}
# CONNACK properties a client can do without, left out (after the reason string) of a CONNACK larger
# than its Maximum Packet Size: without them it sends no topic aliases, and takes what the broker
# offers as available (it offers all of it). Its limits, its client id, its keep alive and the end of
# its authentication stay: a client that cannot take them gets no CONNACK.
CONNACK_OPTIONAL = frozenset((props.TOPIC_ALIAS_MAXIMUM, props.RESPONSE_INFORMATION, props.SERVER_REFERENCE,
                              props.RETAIN_AVAILABLE, props.WILDCARD_SUBSCRIPTION_AVAILABLE,
                              props.SUBSCRIPTION_IDENTIFIER_AVAILABLE, props.SHARED_SUBSCRIPTION_AVAILABLE))


def handle_connect(conn: Connection, flags: int, body: bytes) -> None:
    """The first packet of a connection."""
    try:
        connect = decode_connect(flags, body, conn.worker.settings.max_user_properties)
    except v4.UnsupportedProtocol as exc:
        conn.write(v4.encode_connack(False, 0x01))  # [MQTT-3.1.2-2]
        return conn.close(f"unsupported protocol level {exc.level}")
    except RefusedConnect as exc:
        return _refuse_broken(conn, exc)
    worker = conn.worker
    settings = worker.settings
    conn.level = connect.protocol_level
    method = None
    if conn.level == 5:
        negotiated = conn.v5 = Negotiated(connect, settings.topic_alias_maximum)
        conn.window = min(settings.max_inflight, negotiated.receive_max)
        method = connect.properties.get(props.AUTHENTICATION_METHOD)
    if settings.server_reference:
        code = reasons.SERVER_MOVED if settings.server_moved else reasons.USE_ANOTHER_SERVER
        return refuse(conn, SERVER_UNAVAILABLE if conn.v5 is None else code, f"use {settings.server_reference}",
                      {props.SERVER_REFERENCE: settings.server_reference})
    missing = worker.node and worker.link.missing(worker.loop.time())
    if missing:  # nothing the client sent would be answered: 3.1.1 0x03, 5.0 0x88 Server unavailable
        return refuse(conn, SERVER_UNAVAILABLE, f"no router: {missing}")
    if conn.cert_username is not None:  # use_identity_as_username: the certificate is the login
        unfit = unfit_username(conn.cert_username)
        if unfit is not None:  # as mosquitto: a bad user name (0x04, 5.0: 0x86)
            return refuse(conn, BAD_CREDENTIALS, f"{unfit} (use_identity_as_username)")
    client_id = connect.client_id
    if not client_id:
        if conn.v5 is None and (not connect.clean_session or conn.level == 3):
            return refuse(conn, IDENTIFIER_REJECTED, "empty client id without clean session")
        client_id = f"plexmq-{uuid.uuid4().hex}"
        if conn.v5 is not None:
            conn.v5.assigned_id = client_id
    elif conn.level == 3 and len(client_id) > MQISDP_MAX_CLIENT_ID:
        return refuse(conn, IDENTIFIER_REJECTED, "MQTT 3.1 client id longer than 23 characters")
    bridge = settings.bridges.get(client_id)
    if bridge is not None:  # a bridge's own id (acceptor/bridges): its token is its login, the bridge's tenant its tenant
        return _bridge(conn, connect, client_id, *bridge)
    most = settings.max_keepalive
    if most and (connect.keepalive > most or not connect.keepalive):  # as mosquitto's max_keepalive
        if conn.v5 is None:  # 3.1.1 cannot be told another keepalive
            return refuse(conn, IDENTIFIER_REJECTED, f"keepalive {connect.keepalive} s, max_keepalive is {most} s")
        conn.v5.server_keepalive = most
    found = resolve(settings.tenants, conn.tenant, connect.username if conn.cert_username is None else conn.cert_username,
                    conn.cert_tenant)
    if not _take_tenant(conn, found, connect) or isinstance(found, Refused):
        return
    auth = worker.auth.of(conn.tenant)
    if method is not None and (method != scram.METHOD or auth.passwords is None or conn.cert_username):
        return refuse(conn, reasons.BAD_AUTHENTICATION_METHOD, f"authentication method {method!r} not offered")
    # the name its tenant's logins know: a tenant's own know the tenant-local one
    username = conn.local_name if auth.local else connect.username
    conn.client_id = client_id
    logs_in = method is None and conn.cert_username is None and auth.required
    if found.open and not logs_in and not _take_tenant(conn, settle(settings.tenants, found, ""), connect):
        return
    if method is not None:
        conn.v5.auth_method = method  # type: ignore[union-attr]  # a 5.0 CONNECT
        try:
            challenge(conn, connect.properties.get(props.AUTHENTICATION_DATA, b""), username)  # type: ignore[arg-type]  # binary
        except scram.Failed as failure:
            return fail_login(conn, failure)
        conn.v5.pending = connect  # type: ignore[union-attr]  # a 5.0 CONNECT
        conn.state = CHALLENGED
        return
    conn.username = username
    if conn.cert_username is not None:  # its certificate is its login (use_identity_as_username)
        conn.username = conn.cert_username
    elif logs_in:
        conn.state = AUTHENTICATING
        conn.transport.pause_reading()  # type: ignore[union-attr]  # reading: has its transport
        login = asyncio.ensure_future(auth.login(username, connect.password, client_address(conn)))
        login.add_done_callback(lambda done: _logged_in(conn, done, connect, found))
        return
    accept(conn, connect)


def _bridge(conn: Connection, connect: Connect, client_id: str, token: bytes, tenant: str) -> None:
    """A CONNECT with a bridge's client id: accepted with the token the acceptor gave that bridge alone
    (compared in constant time), refused without it, so that no client takes the bridge's session.
    Its window (and its session's, in the router) is the Receive Maximum it asks for."""
    if connect.password is None or not hmac.compare_digest(connect.password, token):
        return refuse(conn, BAD_CREDENTIALS, "bad user name or password", logged=f"client id {client_id!r} is a bridge's")
    declared = conn.worker.settings.tenants.declared.get(tenant)
    if _take_tenant(conn, Refused(DISABLED, tenant) if declared and not declared.enabled else Found(tenant, None), connect):
        conn.client_id = client_id
        if conn.v5 is not None:  # its window is its Receive Maximum, max_inflight or not: the more it holds
            conn.window = conn.v5.receive_max  # while the remote acknowledges, the faster it forwards
        accept(conn, connect)


def _within_limits(conn: Connection, limits: Limits, connect: Connect) -> bool:
    """Its tenant's limits on a CONNECT: a 5.0 session expiry above the cap is cut to it (the CONNACK
    says so); a will above the tenant's max_qos is refused (0x9B; 3.1.1: 0x05). False: refused."""
    negotiated = conn.v5
    if negotiated is not None and limits.max_session_expiry and negotiated.session_expiry > limits.max_session_expiry:
        negotiated.session_expiry = limits.max_session_expiry
        conn.worker.counters.limit_hit(conn.tenant, "max_session_expiry")
    if connect.will is not None and connect.will.qos > limits.max_qos:
        conn.worker.counters.limit_hit(conn.tenant, "max_qos")
        refuse(conn, NOT_AUTHORIZED if negotiated is None else reasons.QOS_NOT_SUPPORTED,
               f"will QoS {connect.will.qos} above the tenant's maximum QoS {limits.max_qos}")
        return False
    return True


def _take_tenant(conn: Connection, found: Found | Refused, connect: Connect) -> bool:
    """Place the connection in its tenant, with that tenant's limits on this worker; False when it has
    none or its CONNECT breaks them (refused)."""
    worker = conn.worker
    if isinstance(found, Refused):
        code, reason = _NO_TENANT[found.kind]
        if found.kind == DISABLED:  # a declared tenant: its refusals are its own (the others stay the listener's)
            conn.tenant, conn.tally = found.tenant, worker.counters.tally(found.tenant)
        refuse(conn, code, reason.format(found.tenant))
        return False
    conn.tenant, conn.local_name = found.tenant, found.username
    conn.routes = worker.routes.of(found.tenant)
    conn.tally = worker.counters.tally(found.tenant)
    limits = conn.limits = worker.tenant_limits(found.tenant)
    return limits is None or _within_limits(conn, limits, connect)


def handle_second_connect(conn: Connection, flags: int, body: bytes) -> None:
    conn.close("second CONNECT", code=PROTOCOL_ERROR)


def refuse(conn: Connection, code: int, reason: str, told: props.Properties | None = None, logged: str = "") -> None:
    """CONNACK with a refusal, then close. `code` is a 3.1.1 return code (1-5), which a 5.0 client
    hears as its 5.0 equivalent, or a 5.0 reason code (0x80 and up), which only 5.0 clients can get;
    `told`: more properties for a 5.0 client; `logged`: what the log says, where it says more than the
    client hears. Counted for the connection's tenant (until its tenant is found, the owner of the
    listener it came on) by the reason's 5.0 name."""
    conn.tally.refused[refusal_name(_AS_V5.get(code, code))] += 1
    if conn.v5 is None:
        conn.write(v4.encode_connack(False, code))
    else:
        conn.send5(partial(v5.encode_connack, False, _AS_V5.get(code, code)), {props.REASON_STRING: reason, **(told or {})},
                   CONNACK_OPTIONAL)
    conn.close(logged or reason)


def refuse_unserved(worker: Worker, now: float) -> None:
    """(each second, on a node) While no router serves the link, the CONNECTs waiting for its answer are
    refused as a new one is (3.1.1 0x03, 5.0 0x88 "no router: ..."): the answer will not come. One waits
    so when it came before the worker knew its join unanswered, or before it held the bans."""
    missing = worker.link.missing(now)
    if missing:
        for conn in [conn for conn in worker.conns.values() if conn.state == CONNECTING]:
            refuse(conn, SERVER_UNAVAILABLE, f"no router: {missing}")


def refusal_name(code: int) -> str:
    """How /metrics names a refusal: its 5.0 reason code's name, `bad_user_name_or_password`."""
    return reasons.name(code).lower().replace(" ", "_")


def _refuse_broken(conn: Connection, exc: RefusedConnect) -> None:
    """CONNACK with the reason code of the rule a 5.0 CONNECT breaks, then close (section 4.13.1); the
    reason string goes only where the client's Maximum Packet Size is known (its properties were read)."""
    reason = v5.refusal(exc)
    conn.tally.refused[refusal_name(exc.code)] += 1
    told: props.Properties | None = None if exc.properties is None else {props.REASON_STRING: reason}
    limit: int = exc.properties.get(props.MAXIMUM_PACKET_SIZE, 0) if exc.properties else 0  # type: ignore[assignment]  # an int
    packet = v5.within(limit, partial(v5.encode_connack, False, exc.code), told)
    if packet is not None:
        conn.write(packet)
    conn.close(reason)


def challenge(conn: Connection, client_first: bytes, username: str | None) -> None:
    """Start an enhanced authentication exchange (at CONNECT, or a re-authentication) of a 5.0
    connection: AUTH 0x18 with the server's first message; scram.Failed when it cannot go on, or when
    the SCRAM user is not `username` (the CONNECT's, or the one already logged in)."""
    negotiated = conn.v5
    passwords = conn.worker.auth.of(conn.tenant).passwords
    if passwords is None:
        raise scram.Failed("SCRAM is no longer offered (no password_file)", False)
    exchange = negotiated.exchange = scram.Exchange(passwords.scram_keys)  # type: ignore[union-attr]  # SCRAM runs with a password file
    server_first = exchange.first(client_first)
    if username is not None and exchange.username != username:
        raise scram.Failed(f"SCRAM user {exchange.username!r} is not the user name {username!r}", True)
    if not conn.send5(partial(v5.encode_auth, reasons.CONTINUE_AUTHENTICATION),
                      {props.AUTHENTICATION_METHOD: negotiated.auth_method,  # type: ignore[union-attr]  # as above
                       props.AUTHENTICATION_DATA: server_first}):
        raise scram.Failed("the server's AUTH does not fit the client's maximum packet size", False)


def fail_login(conn: Connection, failure: scram.Failed) -> None:
    """An exchange at CONNECT failed: CONNACK 0x86 (wrong proof) or 0x87, after the same growing
    delay as a wrong password from that address; reading waits meanwhile."""
    worker = conn.worker
    exchange = conn.v5.exchange  # type: ignore[union-attr]  # AUTH: a 5.0 connection
    passwords = worker.auth.of(conn.tenant).passwords
    user = exchange.username if exchange is not None else ""
    if passwords is not None and user in passwords and not passwords.has_scram_keys(user):
        log.warning("client %s: user %r has no SCRAM keys in %s: set its password again with plexmq passwd",
                    conn.client_id, user, passwords.path)
    code, reason = (BAD_CREDENTIALS, "bad user name or password") if failure.bad_proof else (NOT_AUTHORIZED, str(failure))
    conn.state = AUTHENTICATING
    conn.transport.pause_reading()  # type: ignore[union-attr]  # reading: has its transport
    worker.loop.call_later(worker.auth.failed(client_address(conn)), _refuse_failed, conn, code, reason, user)


def _refuse_failed(conn: Connection, code: int, reason: str, user: str) -> None:
    if conn.state == AUTHENTICATING:  # not closed meanwhile
        refuse(conn, code, reason, logged=f"{reason} (user {user!r})")


def client_address(conn: Connection) -> str:
    """The client's address without its port: failed logins are counted per address."""
    return conn.peer.rsplit(":", 1)[0]


def _logged_in(conn: Connection, login: asyncio.Future[tuple[int, str | None, float, str]], connect: Connect,
               found: Found) -> None:
    if conn.state != AUTHENTICATING:
        return  # closed while the password was checked
    if login.cancelled() or login.exception() is not None:
        log.error("client %s: cannot check the password: %s", conn.client_id, login.exception())
        return refuse(conn, SERVER_UNAVAILABLE, "authentication failed")
    code, identity, expires, named = login.result()
    if code:  # the log names the user who failed, as the client sent it
        reason = "bad user name or password" if code == BAD_CREDENTIALS else "not authorized"
        return refuse(conn, code, reason, logged=f"{reason} (user {connect.username!r})")
    if not proves_its_tenant(conn, identity):
        return
    if (named or found.open) and not _take_tenant(conn, settle(conn.worker.settings.tenants, found, named), connect):
        return
    conn.username = identity  # a tenant's own logins know the tenant-local name, the broker's the whole one
    conn.local_name = identity if conn.worker.auth.of(conn.tenant).local else local_name(
        conn.worker.settings.tenants, conn.tenant, identity)
    if expires:
        conn.worker.end_at(expires, conn)
    accept(conn, connect)
    conn.worker.flush_soon()  # the CONNECT record goes out at the end of this turn
    conn.read_on()  # unless refused; CONNECTED: a clean session has its CONNACK


def proves_its_tenant(conn: Connection, identity: str | None) -> bool:
    """A login through the broker's logins proves a broker-wide name (a password's user, a token's
    subject, the SCRAM user) even where the client sent no username: one whose suffix names another
    declared tenant is refused (0x87), so that a tenant's user never gets the rights of the default
    tenant, or of another, by leaving its username out. False: refused."""
    tenants = conn.worker.settings.tenants
    if identity is None or not tenants.separator or conn.worker.auth.of(conn.tenant).local:
        return True
    named = resolve(tenants, "", identity).tenant  # the tenant its suffix names, as a username's would
    if not named or named == conn.tenant or named not in tenants.declared:
        return True
    refuse(conn, NOT_AUTHORIZED, f"logged in as {identity!r}, a user of tenant {named!r}")
    return False


def _banned(conn: Connection, bans: BanSet) -> bool:
    """Whether one of `bans` (plexmq/bans.py: the router's, as this worker holds them) names the client,
    by its id, its username (as it logged in, or as its tenant knows it) or its address: then refused."""
    ban = bans.match(conn.tenant, conn.client_id, (conn.username, conn.local_name), conn.peer, time.time())
    if ban is None:
        return False
    refuse_banned(conn, ban)
    return True


def refuse_banned(conn: Connection, ban: Ban) -> None:
    """CONNACK for a banned client: 5.0 0x8A Banned with the ban's reason, 3.1.1 and 3.1 0x05 (not
    authorized), as mosquitto and EMQX answer."""
    refuse(conn, NOT_AUTHORIZED if conn.v5 is None else reasons.BANNED, f"banned: {ban.reason}" if ban.reason else "banned",
           logged=f"banned ({ban.kind} {ban.value!r}{': ' + ban.reason if ban.reason else ''})")


def accept(conn: Connection, connect: Connect) -> None:
    """Credentials accepted (`conn.username` is who logged in): check the will against the ACL (a `$`
    will topic too: `acl.may_publish`), then claim the session. A 5.0 session outlives its connection
    when its expiry interval is not 0; clean start alone says whether an earlier one is discarded. The
    keepalive is the client's, or the Server Keep Alive a 5.0 client was told instead."""
    worker = conn.worker
    if conn.v5 is not None and conn.v5.max_packet and conn.connack5(False) is None:  # before the session is claimed
        return conn.close(f"no CONNACK fits its maximum packet size ({conn.v5.max_packet} bytes)")
    bans = worker.bans
    if bans and _banned(conn, bans):
        return
    checker = worker.rules(conn)
    if connect.will is not None and not may_publish(checker, connect.will.topic):
        return refuse(conn, NOT_AUTHORIZED, f"will topic {connect.will.topic!r} not allowed")
    conn.take_rules(checker)  # no ACL: plain QoS 0 runs go to the router as they are (5.0: without properties)
    conn.persistent = not connect.clean_session if conn.v5 is None else conn.v5.session_expiry > 0
    keepalive = connect.keepalive if conn.v5 is None else conn.v5.server_keepalive or connect.keepalive
    conn.keepalive = keepalive
    conn.deadline = worker.now() + keepalive * 1.5 if keepalive else math.inf
    worker.wheel.add(conn)  # the keepalive deadline may come before the CONNECT timeout
    conn.state = CONNECTING
    conn.will = connect.will
    limits = worker.settings.tenants.declared.get(conn.tenant) if conn.tenant else None
    if connect.clean_session and not conn.persistent and (limits is None or not limits.limits_connects) \
            and worker.bans is not None:
        # a new session that ends with the connection: nothing to wait for from the router, which
        # claims the client id (takes an earlier connection over) before any later record of ours;
        # unless the router judges its tenant's CONNECTs (router/tenants.py), or has not yet told this
        # worker the bans (the router's BANS comes before its answer): then it answers
        conn.register(connack_sent=True, fresh=True)
        conn.session_ready(False, [])
    else:
        conn.register(connack_sent=False, fresh=connect.clean_session)
