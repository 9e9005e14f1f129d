"""One direction of a bridge: the PUBLISHes one side (the source) sends, passed on to the other (the
destination) in order, each acknowledged to its source only once the destination has acknowledged it
(QoS 1: its PUBACK; QoS 2: its PUBCOMP, and the source then gets its PUBREC).

So nothing acknowledged is lost: a QoS 1/2 message held here (taken, not yet acknowledged) is still
the source's to send again, which it does when this process or its link dies (its session keeps it).
QoS 2 stays exactly once across reconnects: toward the destination a message it has received (PUBREC)
goes again as a PUBREL, never as a second PUBLISH; from the source, an id answered with PUBREC is
remembered until its PUBREL, so that a PUBLISH sent again meanwhile gets the PUBREC again, not passed on.
Out of the window a destination takes (its Receive Maximum), messages wait here in order; a
destination that comes back gets them all again in order, with DUP where its session may have them.
A resent message already held is not passed on twice; one the destination took while its source was
away is acknowledged when the source sends it again (`by_source` 0: an acknowledgement owed)."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

from plexmq.acceptor.bridges.link import Link
from plexmq.acceptor.bridges.rules import Rule, first
from plexmq.mqtt import properties as props
from plexmq.mqtt import v4, v5
from plexmq.mqtt.framing import encode_remaining_length

log = logging.getLogger("plexmq.bridge")


@dataclass(slots=True)
class Held:
    source_id: int | None  # the source's packet id, owed an acknowledgement (None: its session is gone, nothing owed)
    source_qos: int  # as the source sent it: 1 is acknowledged with PUBACK, 2 with PUBREC
    topic: bytes  # as the destination names it
    payload: bytes
    qos: int
    retain: bool
    properties: bytes  # 5.0 property entries passed on (props.forwarded)
    sent: bool = False  # sent to the destination once (resent with DUP where its session was kept)
    released: bool = False  # QoS 2: the destination has it (PUBREC), PUBREL sent, its PUBCOMP awaited


RELEASE_AWAITED = -1  # Flow.by_source: PUBREC sent for a QoS 2 message, the source's PUBREL awaited
MAPPED = 4096  # topics whose rule a flow remembers (`Flow.mapped`), then it starts again


class Flow:
    def __init__(self, name: str, rules: tuple[Rule, ...]) -> None:
        self.name = name  # "bridge NAME out" in the log
        self.rules = rules
        self.source: Link | None = None
        self.destination: Link | None = None
        self.held: dict[int, Held] = {}  # by the destination's packet id, in the order taken
        self.unsent: deque[int] = deque()
        # source packet id -> destination packet id; 0: acknowledgement owed; RELEASE_AWAITED
        self.by_source: dict[int, int] = {}
        # a topic -> the first rule that fits it (None: none) and the topic it takes on the other side
        self.mapped: dict[str, tuple[Rule | None, bytes]] = {}
        self.inflight = 0  # sent to the destination, not yet acknowledged (QoS 2: not yet completed)
        self.last_id = 0
        self.passed = 0  # messages the destination took (QoS 0: sent)
        self.dropped = 0  # no rule fits (a subscription of an earlier config), refused, or QoS 0 while away

    def take(self, flags: int, source_id: int, topic: str, payload: bytes, properties: props.Properties) -> None:
        """A PUBLISH from the source."""
        qos = (flags >> 1) & 0x03
        if qos and source_id in self.by_source:  # sent again: held still (nothing to do), or passed on while
            if self.by_source[source_id] <= 0:  # the source was away or its PUBREC lost: acknowledged (again)
                self._acknowledge(source_id, qos)
            return
        rule, mapped = self.mapped.get(topic) or self._map(topic)
        if rule is None:
            self.dropped += 1
            self._acknowledge(source_id if qos else None, qos)
            return
        held = Held(source_id if qos else None, qos, mapped, payload, min(qos, rule.qos),
                    bool(flags & 0x01) and rule.retain, props.forwarded(properties))
        if not held.qos:  # on now or never
            if self.destination is not None:
                self.destination.send(self._encode(held, 0, False))
                self.passed += 1
            else:
                self.dropped += 1
            self._acknowledge(held.source_id, qos)
            return
        self.last_id = packet_id = self._free_id()
        self.held[packet_id] = held
        if held.source_id is not None:
            self.by_source[held.source_id] = packet_id
        self.unsent.append(packet_id)
        self.pump()

    def _map(self, topic: str) -> tuple[Rule | None, bytes]:
        """`topic`'s rule and its topic on the other side, remembered: a flow carries few topics, many times."""
        if len(self.mapped) >= MAPPED:
            self.mapped.clear()
        rule = first(self.rules, topic)
        found = self.mapped[topic] = (rule, rule.topic(topic).encode() if rule is not None else b"")
        return found

    def _free_id(self) -> int:
        packet_id = self.last_id
        while True:
            packet_id = packet_id % 0xFFFF + 1
            if packet_id not in self.held:
                return packet_id

    def pump(self) -> None:
        """Send what waits, in order, as far as the destination's window goes."""
        destination = self.destination
        while destination is not None and self.unsent and self.inflight < destination.window:
            packet_id = self.unsent.popleft()
            held = self.held.get(packet_id)
            if held is None:
                continue  # acknowledged before it was sent again (a peer's stray PUBACK)
            destination.send(v4.encode_pubrel(packet_id) if held.released  # 5.0's success PUBREL: the same 4 bytes
                             else self._encode(held, packet_id, held.sent and destination.session_present))
            held.sent = True
            self.inflight += 1

    def _encode(self, held: Held, packet_id: int, dup: bool) -> bytes:
        destination = self.destination
        assert destination is not None
        qos = min(held.qos, destination.max_qos)
        if destination.level != 5:
            return v4.encode_publish(held.topic, held.payload, qos, held.retain, dup, packet_id)
        block = encode_remaining_length(len(held.properties)) + held.properties
        return v5.publish_header(held.topic, len(held.payload), qos, held.retain, dup, packet_id, block) + held.payload

    def received(self, packet_id: int, code: int) -> None:
        """The destination's PUBREC: the message is its own now; PUBREL releases it (`code` >= 0x80: refused)."""
        held = self.held.get(packet_id)
        if held is None or self.destination is None:
            return  # not one of ours
        if code >= 0x80:
            self.acknowledged(packet_id, code)
            return
        held.released = True
        self.destination.send(v4.encode_pubrel(packet_id))

    def acknowledged(self, packet_id: int, code: int) -> None:
        """The destination's PUBACK or PUBCOMP (`code` >= 0x80: it refused the message, which is dropped)."""
        held = self.held.pop(packet_id, None)
        if held is None:
            return  # not one of ours (acknowledged before: a resend's)
        self.inflight -= 1
        if code >= 0x80:
            self.dropped += 1
            log.warning("%s: the destination refused a message to %s: %s", self.name, held.topic.decode(), v5.describe(code))
        else:
            self.passed += 1
        self._acknowledge(held.source_id, held.source_qos)
        self.pump()

    def _acknowledge(self, source_id: int | None, qos: int) -> None:
        """PUBACK (QoS 1) or PUBREC (QoS 2) to the source; 5.0's success ones are the same 4 bytes."""
        if source_id is None:
            return
        if self.source is None:
            self.by_source[source_id] = 0  # it sends the message again when it is back: acknowledged then
        elif qos == 2:
            self.source.send(v4.encode_pubrec(source_id))
            self.by_source[source_id] = RELEASE_AWAITED
        else:
            self.source.send(v4.encode_puback(source_id))
            self.by_source.pop(source_id, None)

    def released(self, source_id: int) -> None:
        """The source's PUBREL: done with this id (PUBCOMP, also for an id forgotten with a lost session)."""
        if self.by_source.get(source_id) == RELEASE_AWAITED:
            del self.by_source[source_id]
        if self.source is not None:
            self.source.send(v4.encode_pubcomp(source_id))

    def source_up(self, link: Link) -> None:
        self.source = link
        if not link.session_present:  # what it had sent us is no longer its to send again
            self.by_source.clear()
            for held in self.held.values():
                held.source_id = None

    def destination_up(self, link: Link) -> None:
        """Everything held goes again, in order (with DUP where the destination kept the session; a QoS 2
        message it had received as a PUBREL, unless its session is new: then it has nothing to release)."""
        self.destination = link
        self.inflight = 0
        if not link.session_present:
            for held in self.held.values():
                held.released = False
        self.unsent = deque(self.held)
        self.pump()
