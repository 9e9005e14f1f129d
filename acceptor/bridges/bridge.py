"""One bridge: its link to this broker (`local`) and to the remote one, each kept up on its own with
backoff, and the two flows between them (`out`: local -> remote, `in`: remote -> local).

Loops: the local subscriptions carry No Local, so what `in` publishes here never goes `out` again;
a 5.0 remote's subscriptions carry it too, and a 3.1.1 remote is told that this is a bridge
(`try_private`, which mosquitto honours the same way). Retained messages keep their flag (Retain As
Published) unless a rule says `retain = false`, and a subscription's retained messages come only when
it is new (Retain Handling 1), not at every reconnect of a kept session."""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import time
from typing import Any

from plexmq.acceptor.bridges.flow import Flow
from plexmq.acceptor.bridges.link import Link, Login, Refused
from plexmq.acceptor.bridges.rules import Rule
from plexmq.acceptor.bridges.tls import client_context
from plexmq.bridge_status import local_client_id
from plexmq.mqtt import v4, v5
from plexmq.mqtt.framing import MalformedPacket
from plexmq.mqtt.kinds import DISCONNECT, PUBACK, PUBCOMP, PUBLISH, PUBREC, PUBREL, SUBACK
from plexmq.mqtt.reasons import SUCCESS

log = logging.getLogger("plexmq.bridge")

BACKOFF_FIRST = 0.2  # seconds before the second try; doubling with each failure after it ...
BACKOFF_MAX = 30.0  # ... up to this, each delay drawn between half and all of it (jitter)
# QoS 1/2 messages this broker may send the bridge unacknowledged (its Receive Maximum, which is also
# its session's window, above max_inflight: a wide one keeps the remote's window full while its PUBACKs
# come back; 1000 against 100: ~1.6x at QoS 1, bench/RESULTS.md), and the remote broker may
LOCAL_WINDOW = 1000
REMOTE_WINDOW = 100
LOCAL_KEEPALIVE = 60
NEVER = 0xFFFFFFFF  # the local session's expiry: it holds what waits for the remote
SUBSCRIPTION_OPTIONS = v5.NO_LOCAL | v5.RETAIN_AS_PUBLISHED | (1 << 4)  # + the QoS; Retain Handling 1


def backoff(failures: int) -> float:
    """Seconds to wait after `failures` failed tries in a row."""
    delay = min(BACKOFF_FIRST * 2 ** (failures - 1), BACKOFF_MAX)
    return random.uniform(delay / 2, delay)


class Side:
    """One broker a bridge is a client of, and what `plexmq bridges` says of it."""

    def __init__(self, what: str) -> None:
        self.what = what  # "local" or "remote"
        self.link: Link | None = None
        self.since = time.time()  # of the last state change
        self.reason = "connecting"  # what the state says when down


class Bridge:
    def __init__(self, name: str, table: dict[str, Any], local: tuple[str, int], token: str) -> None:
        self.name = name
        self.table = table
        self.token = token
        self.local_address = local
        self.remote_level = 5 if table["protocol"] == "5.0" else 4
        self.private = table["try_private"] and self.remote_level == 4
        self.tls = client_context(table["tls"]) if table["tls"] is not None else None
        self.local_login = Login(local_client_id(name), 5, False, LOCAL_KEEPALIVE, None, token.encode(), NEVER,
                                 LOCAL_WINDOW)
        self.out = Flow(f"bridge {name} out", tuple(Rule(**rule) for rule in table["out"]))
        self.into = Flow(f"bridge {name} in", tuple(Rule(**rule) for rule in table["in"]))
        self.local, self.remote = Side("local"), Side("remote")

    async def run(self) -> None:
        await asyncio.gather(self._keep(self.local), self._keep(self.remote))

    def status(self) -> dict[str, Any]:
        up = self.local.link is not None and self.remote.link is not None
        down = [side for side in (self.local, self.remote) if side.link is None]
        state = "connected" if up else f"{down[0].what} down: {down[0].reason}"
        return {"state": state, "tenant": self.table["tenant"],
                "since": max(self.local.since, self.remote.since) if up else down[0].since,
                "held": len(self.out.held), "sent": self.out.passed, "received": self.into.passed,
                "dropped": self.out.dropped + self.into.dropped}

    async def _keep(self, side: Side) -> None:
        """Connect `side`, serve it until it ends, again and again; failures back off."""
        failures = 0
        while True:
            try:
                link = await (self._open_local() if side is self.local else self._open_remote())
            except Refused as exc:
                failures += 1
                delay = backoff(failures)
                if str(exc) != side.reason:  # one line per state: a side that keeps failing so says it once
                    log.warning("bridge %s: %s down: %s; trying again with backoff (first in %.1f s)", self.name,
                                side.what, exc, delay)
                    side.reason, side.since = str(exc), time.time()
                await asyncio.sleep(delay)
                continue
            failures = 0
            side.link, side.since = link, time.time()
            try:
                await self._serve(side, link)
            except (EOFError, OSError, MalformedPacket) as exc:
                side.reason = str(exc) or type(exc).__name__
            except asyncio.CancelledError:  # the process stops: a clean goodbye (the sessions stay)
                link.send(v4.DISCONNECT_PACKET)  # 5.0's normal disconnection is the same 2 bytes
                raise
            finally:
                link.close()
                side.link, side.since = None, time.time()
                (self.out if side is self.local else self.into).source = None
                (self.into if side is self.local else self.out).destination = None
            failures = 1
            delay = backoff(failures)
            log.warning("bridge %s: %s down: %s; reconnecting in %.1f s", self.name, side.what, side.reason, delay)
            await asyncio.sleep(delay)

    def _up(self, side: Side, link: Link, subscribed: str) -> None:
        """Its line once its subscriptions are in place (what is published from then on is bridged)."""
        log.info("bridge %s: %s up (session %s%s)", self.name, side.what, "kept" if link.session_present else "new",
                 subscribed)

    async def _open_local(self) -> Link:
        host, port = self.local_address
        return await Link.open(host, port, self.local_login)

    async def _open_remote(self) -> Link:
        """The first of the addresses that accepts; 3.1.1 with try_private refused (return code 1) asks without it."""
        table = self.table
        login = Login(table["client_id"] or f"{socket.gethostname()}.{self.name}", self.remote_level, table["clean_start"],
                      table["keepalive"], table["username"] or None, table["password"].encode() or None,
                      table["session_expiry"], REMOTE_WINDOW, self.private)
        reasons = []
        for address in table["address"]:
            host, _, port = address.rpartition(":")
            host = host.strip("[]")
            try:
                return await Link.open(host, int(port), login, self.tls, table["tls"]["server_name"] if self.tls else None)
            except Refused as exc:
                if self.private and "return code 1" in str(exc):
                    self.private = False
                    log.info("bridge %s: %s does not take try_private: asking without it", self.name, address)
                reasons.append(str(exc))
        raise Refused("; ".join(reasons))

    async def _serve(self, side: Side, link: Link) -> None:
        """Subscribe, start both flows on this link, then take its packets until it ends."""
        local = side is self.local
        source, destination = (self.out, self.into) if local else (self.into, self.out)
        if source.rules:
            options = SUBSCRIPTION_OPTIONS if link.level == 5 else 0
            filters = [(rule.filter, rule.qos | options) for rule in source.rules]
            link.send(v5.encode_subscribe(1, filters) if link.level == 5 else v4.encode_subscribe(1, filters))
        else:
            self._up(side, link, "")
        source.source_up(link)
        destination.destination_up(link)
        while True:
            for kind, flags, body in await link.packets():
                if kind == PUBLISH:
                    if link.level == 5:
                        topic, packet_id, payload, properties = v5.decode_publish(flags, body, from_server=True)
                    else:
                        topic, packet_id, payload = v4.decode_publish(flags, body)
                        properties = {}
                    source.take(flags, packet_id, topic, payload, properties)
                elif kind in (PUBACK, PUBREC, PUBREL, PUBCOMP):
                    packet_id, code = (v5.decode_ack(kind, flags, body)[:2] if link.level == 5
                                       else (v4.decode_packet_id(flags, body, 2 if kind == PUBREL else 0), SUCCESS))
                    if kind == PUBREL:
                        source.released(packet_id)
                    elif kind == PUBREC:
                        destination.received(packet_id, code)
                    else:
                        destination.acknowledged(packet_id, code)
                elif kind == SUBACK:
                    codes = v5.decode_suback(SUBACK, flags, body)[1] if link.level == 5 else v4.decode_suback(flags, body)[1]
                    for rule, code in zip(source.rules, codes):
                        if code >= 0x80:
                            log.error("bridge %s: the %s broker refused the subscription to %s: %s", self.name, side.what,
                                      rule.filter, v5.describe(code) if link.level == 5 else f"return code {code:#x}")
                    self._up(side, link, f", {sum(code < 0x80 for code in codes)} of {len(codes)} subscriptions granted")
                elif kind == DISCONNECT:
                    code = v5.decode_reason_only(DISCONNECT, flags, body)[0] if link.level == 5 and body else 0
                    raise EOFError(f"DISCONNECT: {v5.describe(code)}")
                # PINGRESP: the read itself was the news (Link.heard)
