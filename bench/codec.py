"""`python -m plexmq.bench.codec`: ns/op of plexmq's MQTT codecs (5.0 and 3.1.1) against mqtt5, the Rust/PyO3
MQTT 5 codec on PyPI, on the same packets.

It exists to weigh mqtt5 against our decoder by measurement; the verdict and its reasons are in
bench/RESULTS.md. mqtt5 is not a dependency of plexmq: without it, its column
reads "not installed".

Every decode starts from one whole packet in bytes, as mqtt5.read takes it; plexmq's side is `frame`,
then the kind's decoder on the body slice, as the connection's read loop does. Before timing, both
sides' decoded topic, payload and packet id (and CONNECT/SUBSCRIBE fields) are checked equal, and the
encodings byte-identical. plexmq encodes a PUBLISH from UTF-8 topic bytes (the broker keeps topics so);
mqtt5 builds a frozen PublishPacket from a str and writes it. Times: ns per call, best of --repeat
runs of --number calls (timeit, whose loop overhead is in every cell alike).
"""

from __future__ import annotations

import argparse
import platform
import timeit
from collections.abc import Callable
from importlib import metadata
from typing import Any

from plexmq.mqtt import v4
from plexmq.mqtt.connect import decode_connect, encode_connect
from plexmq.mqtt.framing import MAX_REMAINING_LENGTH, frame
from plexmq.mqtt.kinds import CONNECT, PUBACK, PUBLISH, SUBSCRIBE
from plexmq.mqtt.properties import (
    MESSAGE_EXPIRY_INTERVAL,
    RECEIVE_MAXIMUM,
    SESSION_EXPIRY_INTERVAL,
    SUBSCRIPTION_IDENTIFIER,
    USER_PROPERTY,
)
from plexmq.mqtt.v5 import decode_publish, decode_subscribe, encode_ack, encode_publish, encode_subscribe

try:  # not a dependency of plexmq: only measured where installed
    import mqtt5
    from mqtt5 import PubAckPacket, PublishPacket
    from mqtt5 import read as mqtt5_read

    QOS1 = mqtt5.QoS.AT_LEAST_ONCE
except ImportError:
    mqtt5 = None

TOPIC = "sensors/dev-42/temp"
TOPIC_BYTES = TOPIC.encode()
PAYLOAD = bytes(range(16))
USER_PROPS = [("unit", "celsius"), ("site", "plant-7")]
EXPIRY = {MESSAGE_EXPIRY_INTERVAL: 60}
FILTERS = [("sensors/+/temp", 1), ("alerts/#", 0)]
CONNECT_PROPS = {SESSION_EXPIRY_INTERVAL: 3600, RECEIVE_MAXIMUM: 100}

PUB0 = encode_publish(TOPIC_BYTES, PAYLOAD)
PUB0_PROPS = encode_publish(TOPIC_BYTES, PAYLOAD, properties={USER_PROPERTY: USER_PROPS, MESSAGE_EXPIRY_INTERVAL: 3600})
PUB1 = encode_publish(TOPIC_BYTES, PAYLOAD, 1, packet_id=4242)
CONN = encode_connect("dev-42", True, 60, None, "alice", b"s3cret-pw", 5, CONNECT_PROPS)
SUB = encode_subscribe(17, FILTERS, {SUBSCRIPTION_IDENTIFIER: 7})
PUB0_V4 = v4.encode_publish(TOPIC_BYTES, PAYLOAD)  # the equivalent 3.1.1 packets: no properties
PUB1_V4 = v4.encode_publish(TOPIC_BYTES, PAYLOAD, 1, packet_id=4242)
CONN_V4 = encode_connect("dev-42", True, 60, None, "alice", b"s3cret-pw", 4)
SUB_V4 = v4.encode_subscribe(17, FILTERS)

V5: dict[int, Callable[..., Any]] = {PUBLISH: decode_publish, CONNECT: decode_connect, SUBSCRIBE: decode_subscribe}
V4: dict[int, Callable[..., Any]] = {PUBLISH: v4.decode_publish, CONNECT: decode_connect,
                                     SUBSCRIBE: v4.decode_subscribe}
MAX_SIZE = MAX_REMAINING_LENGTH + 5


def read(decoders: dict[int, Callable[..., Any]], buf: bytes) -> Any:
    """One whole packet, as the read loop takes it: frame it, then decode its body by kind."""
    first, start, stop = frame(buf, 0, MAX_SIZE)  # type: ignore[misc]  # a whole packet
    return decoders[first >> 4](first & 0x0F, buf[start:stop])


def check() -> None:
    """plexmq's codecs and mqtt5 must do the same work: the same values decoded, the same bytes encoded."""
    for v5_buf, v4_buf in ((PUB0, PUB0_V4), (PUB1, PUB1_V4)):
        assert read(V5, v5_buf)[:3] == read(V4, v4_buf)
    assert read(V4, SUB_V4) == (17, FILTERS)
    assert read(V4, CONN_V4).username == read(V5, CONN).username == "alice"
    if mqtt5 is None:
        return
    for buf in (PUB0, PUB0_PROPS, PUB1):
        ref, size = mqtt5_read(buf)
        topic, packet_id, payload, props = read(V5, buf)
        assert (topic, packet_id or None, payload, size) == (ref.topic, ref.packet_id, ref.payload, len(buf))
        assert props.get(USER_PROPERTY, []) == ref.user_properties
        assert props.get(MESSAGE_EXPIRY_INTERVAL) == ref.message_expiry_interval
    ref, _ = mqtt5_read(CONN)
    got = read(V5, CONN)
    assert (got.client_id, got.username, got.password, got.keepalive, got.clean_session) == (
        ref.client_id, ref.username, ref.password, ref.keep_alive, ref.clean_start)
    assert {SESSION_EXPIRY_INTERVAL: ref.session_expiry_interval, RECEIVE_MAXIMUM: ref.receive_max} == CONNECT_PROPS
    assert got.properties == CONNECT_PROPS
    ref, _ = mqtt5_read(SUB)
    packet_id, filters, props = read(V5, SUB)
    assert (packet_id, filters) == (ref.packet_id, [(f.pattern, int(f.max_qos)) for f in ref.topic_filters])
    assert props[SUBSCRIPTION_IDENTIFIER] in (ref.subscription_id, [ref.subscription_id])
    assert encode_publish(TOPIC_BYTES, PAYLOAD, 1, packet_id=4242, properties=EXPIRY) == PublishPacket(
        TOPIC, PAYLOAD, qos=QOS1, packet_id=4242, message_expiry_interval=60).write()
    assert encode_ack(PUBACK, 4242) == PubAckPacket(4242).write() == v4.encode_puback(4242)


ROWS = [  # (operation, plexmq 5.0, mqtt5, plexmq 3.1.1 or None): timeit statements
    ("decode PUBLISH QoS 0, 16 B payload, no properties", "read(V5, PUB0)", "mqtt5_read(PUB0)", "read(V4, PUB0_V4)"),
    ("decode PUBLISH QoS 0 + 2 user properties + expiry", "read(V5, PUB0_PROPS)", "mqtt5_read(PUB0_PROPS)", None),
    ("decode PUBLISH QoS 1", "read(V5, PUB1)", "mqtt5_read(PUB1)", "read(V4, PUB1_V4)"),
    ("decode CONNECT (session expiry, receive max, user, password)", "read(V5, CONN)", "mqtt5_read(CONN)",
     "read(V4, CONN_V4)"),
    ("decode SUBSCRIBE (2 filters, subscription id)", "read(V5, SUB)", "mqtt5_read(SUB)", "read(V4, SUB_V4)"),
    ("encode PUBLISH QoS 1 + message expiry",
     "encode_publish(TOPIC_BYTES, PAYLOAD, 1, packet_id=4242, properties=EXPIRY)",
     "PublishPacket(TOPIC, PAYLOAD, qos=QOS1, packet_id=4242, message_expiry_interval=60).write()",
     "v4.encode_publish(TOPIC_BYTES, PAYLOAD, 1, packet_id=4242)"),
    ("encode PUBACK reason 0", "encode_ack(PUBACK, 4242)", "PubAckPacket(4242).write()", "v4.encode_puback(4242)"),
]


def ns_per_op(stmt: str, number: int, repeat: int) -> float:
    """Best of `repeat` runs of `number` calls of stmt, in ns per call."""
    return min(timeit.Timer(stmt, globals=globals()).repeat(repeat, number)) / number * 1e9


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m plexmq.bench.codec", description=__doc__.split("\n\n")[0])
    parser.add_argument("--number", type=int, default=200_000, help="calls per timing run (200000)")
    parser.add_argument("--repeat", type=int, default=5, help="timing runs; the best one counts (5)")
    args = parser.parse_args(argv)
    check()
    mqtt5_version = metadata.version("mqtt5") if mqtt5 is not None else "not installed"
    print(f"python {platform.python_version()} ({platform.python_implementation()}, {platform.system()} "
          f"{platform.machine()}), mqtt5 {mqtt5_version}")
    print(f"command: python -m plexmq.bench.codec --number {args.number} --repeat {args.repeat}"
          f"  (ns/op, best of {args.repeat} x {args.number} calls)\n")
    print("| operation | plexmq 5.0 | mqtt5 | plexmq 3.1.1 |")
    print("|---|---:|---:|---:|")
    for operation, ours, theirs, ours_v4 in ROWS:
        cells = [f"{ns_per_op(ours, args.number, args.repeat):.0f}",
                 f"{ns_per_op(theirs, args.number, args.repeat):.0f}" if mqtt5 is not None else "not installed",
                 f"{ns_per_op(ours_v4, args.number, args.repeat):.0f}" if ours_v4 else "-"]
        print(f"| {operation} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
