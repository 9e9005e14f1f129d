"""The outbound half of a client connection: what the broker writes to the client and the flow
control that bounds it. `Outbound` is a mixin of `Connection` (workers/connection.py), which keeps the
read loop, the inbound state and the lifecycle; as a mixin it costs the fan-out path no lookup (a
delivery is one method of the connection, as before).

Every write of a loop turn is gathered in `out` and written once by the worker's flush. QoS 1/2
deliveries beyond the inflight window (`window`: max_inflight, 5.0: the client's Receive Maximum too)
wait in a bounded queue; QoS 0 is what gets dropped first when it is full. `inflight` holds the stage
of each delivery in flight: 1 (QoS 1, awaiting PUBACK), 2 (QoS 2, awaiting PUBREC) or -2 (PUBREL
sent, awaiting PUBCOMP); the client's acks (workers/handlers/acks.py) move it through `received` and
`done`. Packet ids: the router numbers a persistent session's deliveries (ROUTER_PIDS_FROM and up), this
worker a clean session's (below). 5.0 topic aliases are chosen by workers/aliases.py as each PUBLISH is
written. While the socket's output is backed up (`pause_writing`), deliveries queue and the client is
not read.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

from plexmq import wire
from plexmq.mqtt import v4 as p
from plexmq.mqtt import v5
from plexmq.workers import aliases
from plexmq.workers.states import CLOSED

if TYPE_CHECKING:
    import asyncio

    from plexmq.workers.counters import Tally
    from plexmq.workers.negotiated import Negotiated
    from plexmq.workers.tenant_limits import Limits
    from plexmq.workers.worker import Worker

_frame = p.frame
_publish_header = p.publish_header
_publish_header5 = v5.publish_header
_LAST_OWN_PID = wire.ROUTER_PIDS_FROM - 1

# What an MQTT 5 message carries besides its payload: (properties as plexmq/wire.py has them, the
# time.time() second it expires at or 0)
Extra = tuple[bytes, int]
# An outbound message waiting for room: (topic, payload, qos, retain, dup, packet id or 0, extra);
# a plain 3.1.1 QoS 0 packet forwarded as it is waits as (None, packet, 0, False, False, 0, None)
Queued = tuple[bytes | None, bytes, int, bool, bool, int, Extra | None]
# One record's shared 5.0 QoS 0 packets as each topic alias sends them, made for the first subscriber
# that needs the form, keyed as `aliases.choose` answers: n sets alias n (topic named), -n uses it
Forms = dict[int, bytes]


class Outbound:
    __slots__ = ("out", "inflight", "queue", "next_pid", "paused", "window", "messages_out", "bytes_out")

    if TYPE_CHECKING:  # the connection's, which this half reads
        worker: Worker
        conn_id: int
        transport: asyncio.Transport | None
        tally: Tally
        limits: Limits | None
        state: int
        persistent: bool
        v5: Negotiated | None

        def read_on(self) -> None: ...

    def __init__(self, window: int) -> None:
        self.window = window  # outgoing QoS 1/2 in flight at most (5.0: the client's receive maximum too)
        self.out: list[bytes] = []
        self.inflight: dict[int, int] = {}  # packet id -> qos (2 becomes -2 once PUBREL is sent)
        self.queue: deque[Queued] | tuple[()] = ()  # a deque only while something waits (an empty one costs 760 bytes)
        self.next_pid = 1
        self.paused = False  # the transport's output is backed up (pause_writing): reading waits too
        # the console's per-client figures (router/listing.py): PUBLISHes given to it to send (written, or
        # queued: a few of those are dropped later, and counted so), and bytes written to its socket
        self.messages_out: int = 0
        self.bytes_out: int = 0

    # -- the transport's output ------------------------------------------------------------------

    def pause_writing(self) -> None:
        """Output backed up: deliveries queue (bounded), and the client is not read, so what it sends
        cannot pile up answers either (PINGRESP, acks; a WebSocket's pongs) while it does not read them."""
        self.paused = True
        self.transport.pause_reading()  # type: ignore[union-attr]  # writing: it has its transport

    def resume_writing(self) -> None:
        self.paused = False
        self.read_on()
        self.pump()

    def write(self, data: bytes) -> None:
        """Gathered until the worker's flush at the end of the loop turn: one socket write per turn."""
        out = self.out
        if not out:
            self.worker.dirty.append(self)
            self.worker.flush_soon()
        out.append(data)

    def flush(self) -> None:
        if self.out and self.transport is not None:
            data = b"".join(self.out)
            self.tally.bytes_out += len(data)  # once per write
            self.bytes_out += len(data)
            self.transport.write(data)
        self.out.clear()

    def stop_sending(self) -> None:
        """The connection closed: what waits is dropped and nothing is in flight any more."""
        self.queue = ()
        self.worker.queuing.discard(self)
        self.inflight.clear()

    # -- messages to the client ----------------------------------------------------------------

    def deliver(self, topic: bytes, payload: bytes, qos: int, retain: bool, dup: bool, packet_id: int,
                qos0_packet: bytes | None, extra: Extra | None = None, forms: Forms | None = None) -> None:
        """Send now if the window and the socket allow it, else queue (bounded, QoS 0 dropped first).
        `qos0_packet`: the QoS 0 PUBLISH already encoded for this connection's version (shared; 5.0:
        with `forms`, its aliased forms)."""
        self.messages_out += 1
        if self.paused or self.queue or (qos and len(self.inflight) >= self.window):
            return self._enqueue((topic, payload, qos, retain, dup, packet_id, extra))
        if qos0_packet is not None and (self.v5 is None or self.v5.writes_as_is()):
            self.write(qos0_packet)  # the fan-out hot path
            return
        if qos and packet_id in self.inflight:
            return  # a restarted router resends what it cannot know we already sent
        self._send(topic, payload, qos, retain, dup, packet_id, extra, qos0_packet, forms)

    def deliver_raw(self, packets: bytes, count: int) -> None:
        """`count` plain 3.1.1 QoS 0 PUBLISH packets, written as they are unless the connection is backed up."""
        self.messages_out += count
        if self.paused or self.queue:
            self._enqueue_packets(packets)
        else:
            self.write(packets)

    def _enqueue_packets(self, packets: bytes) -> None:
        """Queue a raw run packet by packet, each to be written as it is."""
        pos = 0
        while pos < len(packets):
            _first, _start, stop = _frame(packets, pos, 1 << 28)  # type: ignore[misc]  # whole packets: never None
            self._enqueue((None, packets[pos:stop], 0, False, False, 0, None))
            pos = stop

    def deliver_raw5(self, topic: bytes, packets: bytes, count: int, forms: Forms) -> None:
        """A raw run of `count` packets to `topic` rewritten for 5.0 (`v5.publishes_from_v4`), written with this
        connection's topic alias; queued message by message when backed up (or one by one when the
        client's Maximum Packet Size may leave some out), so each is aliased when it is written (a
        client that takes them as they are gets them queued as they are: not encoded again)."""
        negotiated: Negotiated = self.v5  # type: ignore[assignment]  # 5.0 forms go to 5.0 clients only
        as_is = negotiated.writes_as_is()
        self.messages_out += count
        if self.paused or self.queue:
            if as_is:
                self._enqueue_packets(packets)
            else:
                for payload in v5.payloads(packets):
                    self._enqueue((topic, payload, 0, False, False, 0, None))
        elif as_is:
            self.write(packets)
        elif not self._write_shared(topic, packets, forms):
            for payload in v5.payloads(packets):
                self._send(topic, payload, 0, False, False, 0, None)

    def publish_header(self, topic: bytes, size: int, qos: int, retain: bool, dup: bool, packet_id: int,
                       extra: Extra | None, alias: int = 0) -> bytes | None:
        """A PUBLISH up to its payload of `size` bytes, in this connection's version (5.0: with topic
        alias `alias` (0: none; `topic` is then empty when the alias is already set), the message's
        properties and the rest of its expiry interval); None when the message has expired."""
        if self.v5 is None:
            if extra is not None and extra[1] and extra[1] <= time.time():
                return None  # expired
            return _publish_header(topic, size, qos, retain, dup, packet_id)
        block: bytes | None
        if extra is None:
            if not alias:
                return _publish_header5(topic, size, qos, retain, dup, packet_id)
            block = v5.alias_properties(alias)
        else:
            block = v5.message_properties(extra[0], extra[1], time.time(), alias)
        return None if block is None else _publish_header5(topic, size, qos, retain, dup, packet_id, block)

    def _send(self, topic: bytes, payload: bytes, qos: int, retain: bool, dup: bool, packet_id: int,
              extra: Extra | None, packet: bytes | None = None, forms: Forms | None = None) -> None:
        """Write one PUBLISH. `packet_id` 0: this worker numbers it (clean session, QoS 1/2); else the
        router did (persistent). `packet` (5.0, QoS 0): the record's shared PUBLISH and `forms` its
        aliased forms. An expired message, or one larger than a 5.0 client takes, is done with unsent
        [MQTT-3.1.2-25]."""
        if packet is not None and self._write_shared(topic, packet, forms):  # type: ignore[arg-type]  # `forms` comes with `packet`
            return
        numbered = packet_id or (self._take_pid() if qos else 0)
        negotiated = self.v5
        if negotiated is not None and negotiated.send_alias_max:
            header = self._aliased_header(negotiated, topic, len(payload), qos, retain, dup, numbered, extra)
        else:
            header = self.publish_header(topic, len(payload), qos, retain, dup, numbered, extra)
            if header is not None and negotiated is not None and not self.fits(len(header) + len(payload)):
                header = None
        if header is None:
            return self._unsent(packet_id)
        if qos:
            self.inflight[numbered] = qos
        self.write(header)
        self.write(payload)

    def _write_shared(self, topic: bytes, packets: bytes, forms: Forms) -> bool:
        """Write 5.0 QoS 0 PUBLISHes to `topic` that a record's subscribers share (one message, or a
        raw run) in the form this connection's topic alias asks for, made once per record in `forms`;
        False, with nothing written, when they do not all fit the client's Maximum Packet Size."""
        negotiated: Negotiated = self.v5  # type: ignore[assignment]  # 5.0 forms go to 5.0 clients only
        chosen = 0
        if negotiated.send_alias_max:
            chosen = aliases.choose(negotiated, topic)
            if chosen:
                aliased = forms.get(chosen)
                if aliased is None:
                    aliased = forms[chosen] = v5.with_topic_alias(packets, abs(chosen), chosen > 0)
                packets = aliased
        limit = negotiated.max_packet
        if limit and len(packets) > limit:
            return False
        self.write(packets)
        if chosen >= 0 and negotiated.send_alias_max:
            aliases.note(negotiated, topic, chosen)
        return True

    def _aliased_header(self, negotiated: Negotiated, topic: bytes, size: int, qos: int, retain: bool, dup: bool,
                        packet_id: int, extra: Extra | None) -> bytes | None:
        """The header of a PUBLISH to a 5.0 client that takes topic aliases, with the alias the policy
        picks, noted as written; None when the message has expired or does not fit the client's
        Maximum Packet Size (nothing noted: only what is written sets an alias)."""
        chosen = aliases.choose(negotiated, topic)
        header = self.publish_header(topic if chosen >= 0 else b"", size, qos, retain, dup, packet_id, extra,
                                     abs(chosen))
        if header is not None and chosen > 0 and not self.fits(len(header) + size):
            chosen = 0  # a new alias adds 3 bytes: without one, it may fit (an alias in use only makes it smaller)
            header = self.publish_header(topic, size, qos, retain, dup, packet_id, extra)
        if header is None or not self.fits(len(header) + size):
            return None
        if chosen >= 0:
            aliases.note(negotiated, topic, chosen)
        return header

    def fits(self, size: int) -> bool:
        """Whether a packet of `size` bytes fits the 5.0 client's Maximum Packet Size."""
        limit = self.v5.max_packet if self.v5 is not None else 0
        return not limit or size <= limit

    def _unsent(self, router_pid: int) -> None:
        """A message dropped for this client: counted, and a persistent session's copy finished
        with the router as if it had been sent."""
        self.worker.counters.dropped += 1
        self.tally.dropped += 1
        if router_pid:
            self.worker.link.ack(self.conn_id, router_pid, wire.ACK_DONE)

    def _take_pid(self) -> int:
        """The next free packet id of those the worker numbers (the router's start at ROUTER_PIDS_FROM)."""
        pid = self.next_pid
        inflight = self.inflight
        while pid in inflight:
            pid = pid % _LAST_OWN_PID + 1
        self.next_pid = pid % _LAST_OWN_PID + 1
        return pid

    def _enqueue(self, item: Queued) -> None:
        queue = self.queue
        worker = self.worker
        limits = self.limits
        if len(queue) >= (worker.settings.max_queued if limits is None else limits.max_queued):
            worker.counters.dropped += 1  # the new message, or a queued QoS 0 it evicts
            self.tally.dropped += 1
            if limits is not None and limits.max_queued != worker.settings.max_queued:
                worker.counters.limit_hit(limits.tenant, "max_queued_messages")
            if item[2] == 0:
                return
            for i, queued in enumerate(queue):
                if queued[2] == 0:
                    del queue[i]  # type: ignore[union-attr]  # full: a deque, not the empty tuple
                    break
            else:
                return
        if not queue:
            queue = self.queue = deque()
            worker.queuing.add(self)
        queue.append(item)

    def pump(self) -> None:
        """Move queued messages out while the window and the socket have room."""
        queue = self.queue
        window = self.window
        while queue and not self.paused and self.state != CLOSED:
            topic, payload, qos, retain, dup, packet_id, extra = queue[0]
            if topic is None:
                self.write(payload)
            elif qos == 0 or len(self.inflight) < window:
                self._send(topic, payload, qos, retain, dup, packet_id, extra)
            else:
                break
            queue.popleft()
        if not queue:
            self.queue = ()
            self.worker.queuing.discard(self)

    # -- the client's acknowledgements (workers/handlers/acks.py) --------------------------------

    def received(self, packet_id: int) -> None:
        """PUBREC for a QoS 2 delivery awaiting it: PUBREL is next (the caller writes it)."""
        self.inflight[packet_id] = -2
        if self.persistent or packet_id >= wire.ROUTER_PIDS_FROM:
            self.worker.link.ack(self.conn_id, packet_id, wire.ACK_RECEIVED)

    def done(self, packet_id: int) -> None:
        """PUBACK or PUBCOMP: the delivery is done; the window has room again."""
        del self.inflight[packet_id]
        if self.persistent or packet_id >= wire.ROUTER_PIDS_FROM:  # numbered by the router: it waits for this
            self.worker.link.ack(self.conn_id, packet_id, wire.ACK_DONE)
        if self.queue:
            self.pump()

    def resend_pubrel(self, packet_id: int) -> None:
        """RESEND_REL: a resumed session's QoS 2 delivery that awaits its PUBCOMP."""
        self.inflight[packet_id] = -2
        self.write(p.encode_pubrel(packet_id))
