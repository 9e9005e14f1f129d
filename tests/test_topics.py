"""End to end: topic filters (`+`, `#`, `$` topics), SUBACK codes, overlapping subscriptions, UNSUBSCRIBE, order.

Raw clients throughout, so that every check is on the bytes. An absence ("this client got nothing
more") is never waited for with a sleep: the subscriber sends a SUBSCRIBE to a fresh filter, and the
SUBACK is a barrier. The router answers it after every earlier PUBLISH it has routed (those were
acknowledged to the publisher before), and the worker writes the deliveries it got first.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from plexmq.mqtt import v4 as p
from tests.conftest import Broker
from tests.mqtt import RawClient
from tests.steps import as_pub, connect, publish, raw_on, subscribe, sync, uid, worker_of

# ------------------------------------------------------------------------------------ matching


def test_plus_and_hash_match_end_to_end(broker: Broker) -> None:
    pre = f"tm{uid()}"
    topics = [f"{pre}/a", f"{pre}/a/b", f"{pre}/a/b/c", f"{pre}/x/b", f"{pre}/a/c", f"{pre}/a//c", pre]
    expected = {
        f"{pre}/+": {f"{pre}/a"},
        f"{pre}/+/b": {f"{pre}/a/b", f"{pre}/x/b"},
        f"{pre}/a/+/c": {f"{pre}/a/b/c", f"{pre}/a//c"},
        f"{pre}/+/+": {f"{pre}/a/b", f"{pre}/x/b", f"{pre}/a/c"},
        f"{pre}/a/#": {f"{pre}/a", f"{pre}/a/b", f"{pre}/a/b/c", f"{pre}/a/c", f"{pre}/a//c"},
        f"{pre}/a/b/c/#": {f"{pre}/a/b/c"},  # '#' matches the parent level
        f"{pre}/#": set(topics),
        "+/a": {f"{pre}/a"},
        pre: {pre},
        f"{pre}/a/b": {f"{pre}/a/b"},
    }
    subs = {}
    for i, topic_filter in enumerate(expected):
        subs[topic_filter] = connect(broker.port)
        assert subscribe(subs[topic_filter], i + 1, [(topic_filter, 0)]) == [0]
    pub = connect(broker.port)
    for topic in topics:
        publish(pub, topic, topic.encode(), qos=1)
    for topic_filter, c in subs.items():
        got = [m for m in sync(c) if m.topic.startswith(pre)]  # "+/a" may see other tests' topics
        assert sorted(m.topic for m in got) == sorted(expected[topic_filter]), topic_filter
        assert all(m.payload == m.topic.encode() and m.qos == 0 and not m.retain for m in got)
        c.close()
    pub.close()


def test_hash_matches_the_parent_level(broker: Broker) -> None:
    topic = f"parent/{uid()}"
    sub = connect(broker.port)
    assert subscribe(sub, 1, [(f"{topic}/#", 1)]) == [1]
    pub = connect(broker.port)
    publish(pub, topic, b"parent", qos=1)
    assert [(m.topic, m.payload, m.qos) for m in sync(sub)] == [(topic, b"parent", 1)]
    sub.close()
    pub.close()


def test_dollar_topics_escape_first_level_wildcards(tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    """Clients publish to a `$` topic only where an ACL names it (below), here `$test.../#`; `#` reaches
    every other topic, but no `$` one."""
    u = uid()
    dollar, plain = f"$test{u}/x", f"test{u}/x"
    acl = tmp_path / "acl"
    acl.write_text(f"topic readwrite #\ntopic readwrite $test{u}/#\n")
    config = tmp_path / "plexmq.toml"
    config.write_text(f'acl_file = "{acl}"\nallow_anonymous = true\n')
    broker = start_broker("--workers", "2", "--config", str(config))
    subs = {f: connect(broker.port) for f in ("#", "+/x", f"$test{u}/#", f"$test{u}/+", "+/+")}
    for i, (topic_filter, c) in enumerate(subs.items()):
        assert subscribe(c, i + 1, [(topic_filter, 0)]) == [0]
    pub = connect(broker.port)
    publish(pub, dollar, b"dollar", qos=1)
    publish(pub, plain, b"plain", qos=1)
    expected = {"#": [plain], "+/x": [plain], "+/+": [plain], f"$test{u}/#": [dollar], f"$test{u}/+": [dollar]}
    for topic_filter, c in subs.items():
        got = [m.topic for m in sync(c) if m.topic in (dollar, plain)]
        assert got == expected[topic_filter], topic_filter
        c.close()
    pub.close()


def test_without_an_acl_no_client_publishes_to_sys_but_to_other_dollar_topics(broker: Broker) -> None:
    """`$SYS` is the broker's, and a `$share/` name reaches nobody: such a PUBLISH is dropped, QoS 1/2
    still acknowledged (3.1.1), also retained and also on the raw QoS 0 path (the first sight of its
    topic, and again), and a will there refuses the CONNECT (0x05). Another `$` topic is the
    clients', as in mosquitto."""
    u = uid()
    spoof, mine, plain = f"$SYS/broker/spoof{u}", f"$test{u}/x", f"plain{u}"
    sub = connect(broker.port)
    assert subscribe(sub, 1, [(spoof, 1), (f"$test{u}/#", 2), (plain, 1)]) == [1, 2, 1]
    pub = connect(broker.port)
    pub.send(b"".join(p.encode_publish(topic.encode(), payload, 0) for topic, payload in
                      [(plain, b"a"), (spoof, b"q0"), (plain, b"b"), (mine, b"mine q0"), (spoof, b"q0 again")]))
    publish(pub, spoof, b"q1", 1)
    publish(pub, mine, b"mine q2", 2, packet_id=2)
    publish(pub, spoof, b"retained", 1, retain=True, packet_id=3)
    publish(pub, f"$share/g/{plain}", b"shared", 1, packet_id=4)
    publish(pub, plain, b"c", 1, packet_id=5)
    got = [(m.topic, m.payload) for m in sync(sub)]
    assert [m for m in got if m[0] == plain] == [(plain, b"a"), (plain, b"b"), (plain, b"c")]
    assert [m for m in got if m[0] != plain] == [(mine, b"mine q0"), (mine, b"mine q2")]
    late = connect(broker.port)
    assert subscribe(late, 1, [(spoof, 1)]) == [1]
    assert sync(late) == [], "a client's retained message on a $SYS topic was kept"
    willing = RawClient(broker.port)
    assert willing.connect(f"will-{u}", will=p.Will(spoof, b"gone", 0, True))[1] == 5
    willing.read_until_closed()
    for c in (sub, pub, late):
        c.close()


def test_invalid_filters_get_0x80_one_code_per_filter_in_order(broker: Broker) -> None:
    u = uid()
    sub = connect(broker.port)
    filters = [(f"v{u}/ok", 1), ("a/#/b", 0), (f"v{u}/+/x", 2), ("a+", 1), ("#a", 0), (f"v{u}/#", 0), ("a/b#", 2),
               ("+a/b", 1)]
    sub.send(p.encode_subscribe(0x1234, filters))
    assert sub.recv() == (0x90, b"\x12\x34" + bytes([0x01, 0x80, 0x02, 0x80, 0x80, 0x00, 0x80, 0x80]))
    # the valid filters of that SUBSCRIBE work, at their granted QoS (one copy, the highest)
    pub = connect(broker.port)
    publish(pub, f"v{u}/ok", b"1", qos=2)
    publish(pub, f"v{u}/y/x", b"2", qos=2)
    assert [(m.topic, m.payload, m.qos) for m in sync(sub)] == [(f"v{u}/ok", b"1", 1), (f"v{u}/y/x", b"2", 2)]
    sub.close()
    pub.close()


def test_overlapping_subscriptions_deliver_one_copy_at_the_highest_qos(broker: Broker) -> None:
    pre = f"ov{uid()}"
    sub = connect(broker.port)
    assert subscribe(sub, 1, [(f"{pre}/+", 0), (f"{pre}/#", 1)]) == [0, 1]
    assert subscribe(sub, 2, [(f"{pre}/t", 2), ("+/t", 0)]) == [2, 0]
    pub = connect(broker.port)
    publish(pub, f"{pre}/t", b"q2", qos=2)
    publish(pub, f"{pre}/t", b"q1", qos=1)
    publish(pub, f"{pre}/t", b"q0", qos=0)
    publish(pub, f"{pre}/u", b"u2", qos=2)  # matched by "+" (QoS 0) and "#" (QoS 1): at QoS 1
    got = [(m.topic, m.payload, m.qos) for m in sync(sub) if m.topic.startswith(pre)]
    assert got == [(f"{pre}/t", b"q2", 2), (f"{pre}/t", b"q1", 1), (f"{pre}/t", b"q0", 0), (f"{pre}/u", b"u2", 1)]
    sub.close()
    pub.close()


def test_unsubscribe_stops_delivery_and_overlapping_filter_keeps_working(broker: Broker) -> None:
    pre = f"un{uid()}"
    sub = connect(broker.port)
    assert subscribe(sub, 1, [(f"{pre}/t", 2), (f"{pre}/#", 0)]) == [2, 0]
    pub = connect(broker.port)
    publish(pub, f"{pre}/t", b"before", qos=2)
    assert [(m.payload, m.qos) for m in sync(sub)] == [(b"before", 2)]

    sub.send(p.encode_unsubscribe(0x0107, [f"{pre}/t"]))
    assert sub.recv() == (0xB0, b"\x01\x07")
    publish(pub, f"{pre}/t", b"after", qos=2)
    assert [(m.payload, m.qos) for m in sync(sub)] == [(b"after", 0)]  # only "#" is left, at QoS 0

    sub.send(p.encode_unsubscribe(0x0108, [f"{pre}/#", f"{pre}/never-subscribed"]))
    assert sub.recv() == (0xB0, b"\x01\x08")
    publish(pub, f"{pre}/t", b"gone", qos=1)
    assert sync(sub) == []
    sub.close()
    pub.close()


def test_order_is_kept_per_topic_and_publisher(broker: Broker) -> None:
    """500 QoS 1 messages pipelined by one publisher arrive in order at a subscriber on the other worker."""
    topic = f"order/{uid()}"
    sub = connect(broker.port)
    assert subscribe(sub, 1, [(topic, 1)]) == [1]
    sub_worker = worker_of(broker, sub)
    pub = raw_on(broker, avoid=sub_worker)
    assert pub.connect(f"order-pub-{uid()}") == (False, 0)
    n = 500
    pub.send(b"".join(p.encode_publish(topic.encode(), b"%d" % i, 1, packet_id=i + 1) for i in range(n)))
    for i in range(n):
        assert pub.recv() == (0x40, (i + 1).to_bytes(2, "big"))
    received: list[int] = []
    while len(received) < n:
        first, body = sub.recv()
        m = as_pub(first, body)
        assert (m.topic, m.qos) == (topic, 1)
        received.append(int(m.payload))
        sub.send(p.encode_puback(m.packet_id))
    assert received == list(range(n))
    assert sync(sub) == []
    sub.close()
    pub.close()


def test_order_is_kept_across_qos_levels(broker: Broker) -> None:
    """QoS 0, 1 and 2 messages of one publisher on one topic keep their order (one subscriber at QoS 2)."""
    topic = f"order/mixed/{uid()}"
    sub = connect(broker.port)
    assert subscribe(sub, 1, [(topic, 2)]) == [2]
    pub = connect(broker.port)
    n = 300
    qos_of = [(0, 1, 0, 2, 0)[i % 5] for i in range(n)]
    pub.send(b"".join(p.encode_publish(topic.encode(), b"%d" % i, qos_of[i], packet_id=i + 1 if qos_of[i] else 0)
                      for i in range(n)))
    pubacks: set[int] = set()
    pubcomps: set[int] = set()
    while len(pubacks) + len(pubcomps) < sum(1 for q in qos_of if q):
        first, body = pub.recv()
        pid = int.from_bytes(body, "big")
        if first == 0x50:
            pub.send(p.encode_pubrel(pid))
        else:
            assert first in (0x40, 0x70), hex(first)
            (pubacks if first == 0x40 else pubcomps).add(pid)
    assert pubacks == {i + 1 for i in range(n) if qos_of[i] == 1}
    assert pubcomps == {i + 1 for i in range(n) if qos_of[i] == 2}
    publish(pub, f"order/fence/{uid()}", b"", 1)  # the trailing QoS 0 messages are routed too
    got = sync(sub)
    assert [(int(m.payload), m.qos) for m in got] == [(i, qos_of[i]) for i in range(n)]
    sub.close()
    pub.close()
