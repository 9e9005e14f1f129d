"""One client connection in a worker: its reads, its inbound state and its lifecycle. What each packet
from the client does is in workers/handlers/ (one module per packet); what the broker writes to it
(the outbound window, the queue, packet ids, topic aliases) is its `Outbound` half (workers/outbound.py).

Reads are parsed in place (a buffer is kept only for a partial packet, a bytearray that each read
appends to and that is copied once, when the packet is whole: reading a packet costs its size however
many pieces it comes in).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from plexmq import wire
from plexmq.mqtt import properties as props
from plexmq.mqtt import reasons, v5
from plexmq.mqtt import v4 as p
from plexmq.mqtt.kinds import AUTH, CONNECT, DISCONNECT, PUBREL, SUBSCRIBE, UNSUBSCRIBE
from plexmq.mqtt.topics import subscribed
from plexmq.workers.handlers import HANDLERS
from plexmq.workers.handlers.connect import CONNACK_OPTIONAL, handle_connect
from plexmq.workers.outbound import Outbound
from plexmq.workers.states import AUTHENTICATING, CHALLENGED, CLOSED, CONNECTED, CONNECTING, NEW
from plexmq.workers.tenant_limits import Limits, pause, refill
from plexmq.workers.tls import common_name

if TYPE_CHECKING:
    from plexmq.archive_format import Sender
    from plexmq.workers.auth.acl import Checker
    from plexmq.workers.negotiated import Negotiated
    from plexmq.workers.worker import Worker

log = logging.getLogger("plexmq.worker")

_frame = p.frame
# MQTT 3.1 let a client set DUP on a PUBREL, SUBSCRIBE or UNSUBSCRIBE it sends again (flags 0b1010);
# 3.1.1 fixed their flags at 0b0010
_DUP_IN_31 = frozenset((PUBREL, SUBSCRIBE, UNSUBSCRIBE))


def peer_name(address: object) -> str:
    """host:port of a socket address."""
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)


class Connection(Outbound, asyncio.Protocol):
    __slots__ = ("worker", "conn_id", "transport", "buf", "state", "client_id", "username", "sender", "peer", "keepalive",
                 "deadline", "wheel_slot", "persistent", "disconnected", "kicked", "will", "subs", "waiting", "checker",
                 "fast", "screened", "cert_username", "credit_messages", "credit_bytes", "credit_at", "throttled", "level",
                 "v5", "tenant", "local_name", "routes", "limits", "cert_tenant", "tally",
                 "messages_in", "bytes_in", "connected_at", "incoming", "claimed")

    def __init__(self, worker: Worker, conn_id: int, deadline: float) -> None:
        super().__init__(worker.settings.max_inflight)
        self.worker = worker
        self.conn_id = conn_id
        self.transport: asyncio.Transport | None = None
        self.buf: bytes | bytearray = b""  # what reads left: a partial packet, or what a rate limit or a login held
        self.state = NEW
        self.client_id = ""
        self.username: str | None = None
        self.cert_username: str | None = None  # use_identity_as_username: the verified certificate's CN ("": none)
        self.sender: Sender | None = None  # made at the first archived PUBLISH
        self.peer = ""
        self.keepalive = 0
        self.level = 4  # the CONNECT's protocol level: 3 is MQTT 3.1, 5 is MQTT 5.0
        self.v5: Negotiated | None = None  # what a 5.0 client agreed on at CONNECT
        # its tenant (plexmq/tenants.py): until CONNECT, the owner of the listener it came on ("": none)
        self.tenant = ""
        self.local_name: str | None = None  # its username within its tenant (a suffix naming the tenant taken off)
        self.routes = worker.routes.default  # its tenant's table of local routes
        self.limits: Limits | None = None  # its tenant's limits on this worker, found at CONNECT (None: it sets none)
        self.cert_tenant = ""  # the tenant its client certificate names (tenant_certificate_field; "": none)
        self.tally = worker.counters.tally(self.tenant)  # its tenant's numbers (workers/counters.py), set with `tenant`
        self.deadline = deadline
        self.wheel_slot = -1
        self.persistent = False
        # a session that ends with the connection: its QoS 2 packet ids received and not yet released
        # (PUBREL), each with the path it took: True the router's, False this worker's (`Worker.publish`);
        # made at the first (most connections never publish at QoS 2: 64 bytes each saved)
        self.incoming: dict[int, bool] | None = None
        self.disconnected = False  # a DISCONNECT arrived: no will
        self.kicked = False  # closed by the router (takeover): it handled the will already
        self.will: p.Will | None = None
        # filters asked for or resumed with the session (filter -> grant): registered again with a new
        # router, and judged against the ACL
        self.subs: dict[str, int] | None = None
        self.waiting = 0  # SUBSCRIBE and UNSUBSCRIBE the router has not answered yet
        self.checker: Checker | None = None  # the ACL's answers for this client; None: no ACL
        self.fast = False  # plain QoS 0 PUBLISH runs go to the router untouched (connected, no ACL)
        self.screened = False  # deliveries are checked against the ACL's read rules (`judge_reads`)
        # what is left of the client's buckets (client_message_rate, client_byte_rate) at credit_at
        self.credit_messages = self.credit_bytes = self.credit_at = 0.0
        self.throttled = False  # reading waits for the buckets to refill
        # the console's per-client figures (router/listing.py; `Outbound` counts what goes out): PUBLISHes
        # read (once per read, as the rate limits count them), bytes read, the time.time() of its CONNACK
        self.messages_in: int = 0
        self.bytes_in: int = 0
        self.connected_at: float = 0.0
        self.claimed = 0  # time.monotonic_ns() of its first claim of the client id (`register`)

    @property
    def closed(self) -> bool:
        return self.state == CLOSED

    # -- transport callbacks ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport (TCP, TLS, or the WebSocket's)
        self.peer = peer_name(transport.get_extra_info("peername"))
        worker = self.worker
        if worker.identity_as_username or worker.tenant_field:
            cert = transport.get_extra_info("peercert")  # verified by the handshake; None on a plain listener
            if cert and worker.identity_as_username:
                self.cert_username = common_name(cert)  # judged at CONNECT (tls.unfit_username)
                log.debug("client certificate from %s: CN %r", self.peer, self.cert_username)
            if cert and worker.tenant_field:
                self.cert_tenant = common_name(cert, worker.tenant_field)  # judged at CONNECT (tenants.resolve)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.state != CLOSED:
            self.close("connection lost" if exc is None else f"socket error: {exc}")

    def data_received(self, data: bytes) -> None:
        worker = self.worker
        settings = worker.settings
        if self.state == CLOSED:
            return
        self.tally.bytes_in += len(data)  # once per read
        self.bytes_in += len(data)
        if self.state == AUTHENTICATING or self.state == CONNECTING:  # read on once the login, the session is decided
            self.buf = self.buf or bytearray()
            self.buf += data
            if self.state == CONNECTING:
                self.transport.pause_reading()  # type: ignore[union-attr]  # reading: has its transport
            return
        if self.keepalive:
            self.deadline = worker.now() + self.keepalive * 1.5
        if self.buf:
            self.buf += data  # a bytearray, appended to in place
            if self._partial():
                return
            buf = bytes(self.buf)
        else:
            buf = data
        pos = 0
        end = len(buf)
        limits = self.limits
        max_size = settings.max_packet_size if limits is None else limits.max_packet_size
        # a run: plain QoS 0 PUBLISH packets to one topic, forwarded to the router as they are and
        # matched there once (a device's read usually holds one topic)
        run = -1  # its start
        run_topic = b""
        count = 0
        published = 0  # PUBLISH packets of this read, for client_message_rate
        rated = settings.rate_limited or limits is not None and limits.rated
        limit, max_published = self._allowance(end) if rated else (end, end)
        known_topics = worker.known_topics
        archiving = worker.archive is not None
        skipped: list[tuple[int, int]] = []  # packets of the run that the archive filters leave out
        plain = self.v5 is None  # 5.0: only PUBLISHes without properties take the raw path
        try:
            while pos < limit:
                found = _frame(buf, pos, max_size)
                if found is None:
                    break
                first, start, stop = found
                if published >= max_published and first & 0xF0 == 0x30:
                    break  # the rest waits in the buffer until the client's bucket has refilled
                # a 5.0 PUBLISH joins the run when its property block is empty (the byte after its topic is 0)
                if first == 0x30 and self.fast and stop - start >= 2 and (
                        (topic_end := start + 2 + ((buf[start] << 8) | buf[start + 1])) < stop and buf[topic_end] == 0
                        or plain):
                    topic = buf[start + 2:topic_end]
                    if run < 0 or topic != run_topic:
                        to_archive = known_topics.get(topic) if topic_end <= stop else None
                        if to_archive is None:
                            p.decode_publish(0, buf[start:stop])  # validates, raises MalformedPacket
                            if topic[:1] == b"$":  # no client without an ACL writes one (acl.may_publish):
                                if run >= 0:  # never remembered, so each goes to handle_publish to be refused
                                    self._forward(buf, run, pos, run_topic, count, skipped)
                                    run = -1
                                self._packet(p.PUBLISH, 0, buf[start:stop])
                                published += 1
                                pos = stop
                                continue
                            to_archive = worker.remember_topic(topic)
                        if run >= 0:
                            self._forward(buf, run, pos, run_topic, count, skipped)
                        run, run_topic, count = pos, topic, 0
                    elif topic_end > stop:
                        p.decode_publish(0, buf[start:stop])  # a topic longer than its packet: raises
                    count += 1
                    published += 1
                    if archiving and not to_archive:
                        skipped.append((pos, stop))
                else:
                    if run >= 0:
                        self._forward(buf, run, pos, run_topic, count, skipped)
                        run = -1
                    published += first >> 4 == p.PUBLISH
                    self._packet(first >> 4, first & 15, buf[start:stop])
                    if self.state == CLOSED:
                        return
                    if self.state == AUTHENTICATING or self.state == CONNECTING:
                        # what the client sent after its CONNECT waits for the session: a SUBSCRIBE needs it
                        # at the router, a QoS 2 PUBLISH sent again its packet ids (a takeover may wait)
                        self.buf = bytearray(memoryview(buf)[stop:])
                        if self.state == CONNECTING:
                            if stop < end:
                                self.transport.pause_reading()  # type: ignore[union-attr]  # as above
                            worker.flush_soon()  # its CONNECT
                        return
                pos = stop
        except p.MalformedPacket as exc:
            if run >= 0:
                self._forward(buf, run, pos, run_topic, count, skipped)
            if exc.code == reasons.PACKET_TOO_LARGE and limits is not None and max_size < settings.max_packet_size:
                worker.counters.limit_hit(self.tenant, "max_packet_size")
            self.close(v5.refusal(exc), code=exc.code)
            return
        if run >= 0:
            self._forward(buf, run, pos, run_topic, count, skipped)
        self.buf = bytearray(memoryview(buf)[pos:]) if pos < end else b""
        self.messages_in += published
        worker.flush_soon()
        if rated:
            self._charge(published, pos)

    def _partial(self) -> bool:
        """Whether `buf` holds less than its first packet; a header that breaks the format counts as
        whole, for the read loop to refuse it."""
        try:
            return _frame(self.buf, 0, self.max_size()) is None
        except p.MalformedPacket:
            return False

    def max_size(self) -> int:
        """The largest packet it may send: its tenant's max_packet_size, else the broker's."""
        limits = self.limits
        return self.worker.settings.max_packet_size if limits is None else limits.max_packet_size

    # -- rate limits: per client, and its tenant's share on this worker (workers/tenant_limits.py); -----
    # -- buckets that hold one second's worth and refill at the rate ------------------------------------

    def _allowance(self, end: int) -> tuple[int, int]:
        """How far into the buffer this read may go (bytes) and how many PUBLISH packets it may take."""
        worker = self.worker
        settings = worker.settings
        now = worker.now()
        limit = max_published = end
        if settings.rate_limited:
            elapsed = now - self.credit_at if self.credit_at else math.inf  # the first read finds them full
            self.credit_at = now
            rate = settings.message_rate
            if rate:
                self.credit_messages = refill(self.credit_messages, elapsed, rate)
                max_published = int(self.credit_messages)
            rate = settings.byte_rate
            if rate:
                self.credit_bytes = refill(self.credit_bytes, elapsed, rate)
                limit = min(end, int(self.credit_bytes))  # a packet that starts within it is read whole
        limits = self.limits
        if limits is not None and limits.rated:
            tenant_limit, tenant_published = limits.allowance(now, end)
            limit, max_published = min(limit, tenant_limit), min(max_published, tenant_published)
        return limit, max_published

    def _charge(self, published: int, consumed: int) -> None:
        """Take what this read used; a bucket that cannot pay for the next packet stops reading the
        client until it has refilled (pause, not buffer: the rest of the read waits in `buf`)."""
        worker = self.worker
        settings = worker.settings
        wait = 0.0
        if settings.rate_limited:
            rate = settings.message_rate
            if rate:
                self.credit_messages -= published
                wait = pause(self.credit_messages, rate)
            rate = settings.byte_rate
            if rate:
                self.credit_bytes -= consumed
                wait = max(wait, pause(self.credit_bytes, rate))
        limits = self.limits
        tenant_wait, tenant_limit = limits.charge(published, consumed) if limits is not None and limits.rated else (0.0, "")
        if tenant_wait > 0:
            worker.counters.limit_hit(self.tenant, tenant_limit)
        if (wait > 0 or tenant_wait > 0) and self.transport is not None:
            # a whole packet left unread: the read held more than the buckets allowed
            if settings.rate_disconnects and self.buf and _frame(self.buf, 0, self.max_size()) is not None:
                if tenant_wait > wait:
                    return self.close(f"its tenant is over its {tenant_limit} (rate_limit_action = disconnect)",
                                      code=reasons.MESSAGE_RATE_TOO_HIGH)
                return self.close("faster than its rate limit (rate_limit_action = disconnect)",
                                  code=reasons.QUOTA_EXCEEDED)
            self.throttled = True
            self.transport.pause_reading()
            if tenant_wait > wait:
                limits.hold(self, tenant_wait, worker.loop)  # type: ignore[union-attr]  # a tenant_wait: it has limits
            else:
                worker.loop.call_later(wait, self.refilled)

    def refilled(self) -> None:
        """The buckets that held it have refilled (a call_later, or its tenant's turn: `Limits.hold`)."""
        self.throttled = False
        self.read_on()

    def read_on(self) -> None:
        """Read the client again unless something still holds it: a login being decided, the router's
        answer to its CONNECT, output backed up (`paused`), empty rate buckets (`throttled`); each of them
        ends by calling this."""
        if self.state == CLOSED or self.state == AUTHENTICATING or self.state == CONNECTING or self.paused or \
                self.throttled:
            return
        self.transport.resume_reading()  # type: ignore[union-attr]  # not CLOSED: it has its transport
        if self.buf:
            self.data_received(b"")  # what the last read could not take yet

    def _forward(self, buf: bytes, run: int, end: int, topic: bytes, count: int, skipped: list[tuple[int, int]]) -> None:
        """Route a run of `count` plain QoS 0 PUBLISH packets to `topic` as they are (`Worker.publish_run`),
        and archive them (but the `skipped` ones) just as they are."""
        packets = buf[run:end]
        worker = self.worker
        worker.publish_run(self, topic, count, packets, self.v5 is not None)
        if worker.archive is not None:
            if skipped:
                kept, at = [], run
                for start, stop in skipped:
                    kept.append(buf[at:start])
                    at = stop
                kept.append(buf[at:end])
                skipped.clear()
                packets = b"".join(kept)
            if packets:
                worker.archive_packets(self, packets)

    # -- packets from the client: workers/handlers/, one module per packet ------------------------

    def _packet(self, kind: int, flags: int, body: bytes) -> None:
        if self.state == NEW:
            if kind != CONNECT:
                return self.close(f"packet type {kind} before CONNECT")
            return handle_connect(self, flags, body)
        if self.state == CHALLENGED and kind != AUTH and kind != DISCONNECT:
            return self.close(f"packet type {kind} before the authentication ended")  # [MQTT-3.1.2-30]
        handler = HANDLERS.get(kind)
        if handler is None:
            return self.close(f"packet type {kind} not allowed from a client")
        if self.level == 3 and flags == 0x0A and kind in _DUP_IN_31:
            flags = 0x02  # read as 3.1.1 reads the packet
        handler(self, flags, body)

    def register(self, connack_sent: bool, fresh: bool = False) -> None:
        """Claim the session with the router; `fresh`: discard an earlier one (clean session, clean
        start); `connack_sent`: the client has its CONNACK already (a new clean session's connection,
        or one registered again with a restarted router, which then also gets the subscriptions):
        nothing is answered."""
        will = self.will
        will_extra = None  # a 5.0 will's delay, properties (as they travel) and message expiry interval
        if will is not None and will.properties:
            told = will.properties
            will_extra = [told.get(props.WILL_DELAY_INTERVAL, 0), props.forwarded(told).hex(),
                          told.get(props.MESSAGE_EXPIRY_INTERVAL, 0)]
        link = self.worker.link
        if not self.claimed:
            self.claimed = time.monotonic_ns()
        if self.v5 is not None:
            expiry = self.v5.session_expiry
        else:  # 3.1/3.1.1: persistent_client_expiration, or its tenant's max_session_expiry
            expiry = self.limits.max_session_expiry if self.limits is not None and self.limits.max_session_expiry else -1
        link.connect(wire.Connect(self.conn_id, self.client_id, self.persistent, self.username,
                                  will.topic if will else None, will.qos if will else 0, will.retain if will else False,
                                  max(self.inflight, default=0) + 1 if connack_sent else 0, fresh, expiry, will_extra,
                                  self.tenant, self.window, self.claimed),
                     will.payload if will else b"")
        if connack_sent and self.subs:
            link.subscribe(self.conn_id, 0, [[f, qos] for f, qos in self.subs.items()])

    def take_rules(self, checker: Checker | None) -> None:
        """New ACL rules for this client (a reload, a changed ACL table, a re-authentication): they
        apply to its next PUBLISH and its next delivery."""
        self.checker = checker
        self.fast = checker is None
        self.judge_reads()

    def judge_reads(self) -> None:
        """Whether deliveries to this client need their topic checked: some filter of its session
        reaches topics its rules do not let it read (decided here, not per message)."""
        checker = self.checker
        self.screened = checker is not None and any(not checker.reads_all(subscribed(f)) for f in self.subs or ())

    def ask(self) -> None:
        """A SUBSCRIBE or UNSUBSCRIBE goes to the router: counted until its answer (or the close)."""
        self.waiting += 1
        self.worker.unanswered += 1

    def answered(self) -> None:
        self.waiting -= 1
        self.worker.unanswered -= 1

    def session_ready(self, present: bool, resumed: list[tuple[str, int]]) -> None:
        """The router has the session (`resumed`: the subscriptions it had, judged here against this
        client's rules, which may not be those of the user that made them): CONNACK, then whatever
        it resends follows."""
        if resumed:
            subs = dict(resumed)
            subs.update(self.subs or ())
            self.subs = subs
            self.judge_reads()
        self.state = CONNECTED
        self.worker.connected[self.level] += 1
        self.tally.connections += 1
        self.connected_at = time.time()
        if self.v5 is None:
            self.write(p.encode_connack(present and self.level > 3, 0))  # 3.1 has no session-present flag
        else:
            self.write(self.connack5(present))  # type: ignore[arg-type]  # accept made sure one fits
        log.info("client %s connected from %s", self.client_id, self.peer)

    def connack5(self, present: bool) -> bytes | None:
        """The success CONNACK of a 5.0 client, within its Maximum Packet Size (`CONNACK_OPTIONAL`);
        None when none fits."""
        return v5.within(self.v5.max_packet, partial(v5.encode_connack, present, 0),  # type: ignore[union-attr]  # a 5.0 client
                         self.worker.connack_properties(self.v5, self.limits), CONNACK_OPTIONAL)  # type: ignore[arg-type]  # as above

    def send5(self, encode: Callable[[props.Properties | None], bytes], told: props.Properties | None = None,
              optional: frozenset[int] = frozenset()) -> bool:
        """Write the 5.0 packet `encode(told)` within the client's Maximum Packet Size, leaving out what
        `v5.within` may; False, with nothing written, when it does not fit even so [MQTT-3.1.2-24].
        Packets without properties of 5 bytes or less always fit: a client whose limit is smaller gets
        no CONNACK (`handlers.connect.accept`)."""
        packet = v5.within(self.v5.max_packet, encode, told, optional)  # type: ignore[union-attr]  # a 5.0 client
        if packet is None:
            log.debug("client %s: a packet of type %d left unsent, larger than its maximum packet size (%d)",
                      self.client_id, encode(None)[0] >> 4, self.v5.max_packet)  # type: ignore[union-attr]  # as above
            return False
        self.write(packet)
        return True

    def acknowledge(self, packet_id: int, qos: int, code: int) -> None:
        """PUBACK (QoS 1) or PUBREC (QoS 2) for a PUBLISH of the client; 5.0 also hears a refusal's
        reason code (3.1.1 has no way to say it: the message is acknowledged and dropped). Bare, as
        mosquitto and EMQX send them: a reason string here would only restate the code, and Paho's
        5.0 client refuses a PUBACK longer than 4 bytes. Reason strings go where they say more, on a
        refused CONNACK and on DISCONNECT (which Request Problem Information = 0 allows [MQTT-3.1.2-29])."""
        negotiated = self.v5
        if negotiated is None:
            self.write(p.encode_puback(packet_id) if qos == 1 else p.encode_pubrec(packet_id))
            return
        if qos == 1:
            negotiated.receiving -= 1
        elif code >= 0x80:  # a refused QoS 2 flow ends here: no PUBREL comes
            negotiated.releasing.discard(packet_id)
            if self.incoming is not None:
                self.incoming.pop(packet_id, None)
        self.write(v5.encode_ack(p.PUBACK if qos == 1 else p.PUBREC, packet_id, code))

    # -- closing -----------------------------------------------------------------------------------

    def close(self, reason: str, level: int = logging.INFO, code: int = 0) -> None:
        """Close the connection; tell the router (which publishes the will unless DISCONNECT came).
        `code`: the MQTT 5 reason a 5.0 client is told in a DISCONNECT, with `reason` as its reason
        string (only once it has had its CONNACK [MQTT-3.14.0-1])."""
        if self.state == CLOSED:
            return
        registered = self.state == CONNECTING or self.state == CONNECTED
        if self.state == CONNECTED:
            self.worker.connected[self.level] -= 1
            self.tally.connections -= 1
        if code and self.v5 is not None and self.state == CONNECTED:
            self.send5(partial(v5.encode_disconnect, code), {props.REASON_STRING: reason})
        # said before the socket closes: whoever sees it closed finds the reason in the log already
        log.log(level, "client %s (%s) closed: %s", self.client_id or "-", self.peer, reason)
        self.state = CLOSED
        self.fast = self.screened = False
        self.flush()
        if self.transport is not None:
            self.transport.close()
        self.worker.forget(self, registered and not self.kicked, not self.disconnected)
        # the keepalive wheel holds the object until its slot comes round: keep only a husk
        self.transport = None
        self.buf = b""
        self.stop_sending()
        self.will = self.subs = self.checker = self.sender = self.v5 = None
