"""End to end: shared subscriptions (`$share/{group}/{filter}`) for 5.0 and 3.1.1 clients on several
workers: balanced by the router (round robin, random, sticky), retained never sent to them, a QoS 1/2
message of a member that disconnects before acknowledging it goes to another member, and offline
persistent members get messages only when no member is online. Where a test shows that a member got
nothing more, a marker on a plain subscription of its own that must come next stands in for a wait."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as paho

from plexmq.mqtt import properties as P
from plexmq.mqtt import v4, v5
from tests.conftest import Broker
from tests.mqtt import Client, RawClient
from tests.steps import raw5, recv_publish, subscribe5, uid


def marker(share: str, n: int) -> str:
    """The marker topic of member `n` of `share` (a topic name: wildcards spelt out)."""
    return f"marker/{share.replace('+', 'plus').replace('#', 'hash')}/{n}"


def members(port: int, share: str, count: int) -> list[Client]:
    """`count` paho clients, 5.0 and 3.1.1 by turns, subscribed to `share` at QoS 1 and, plainly,
    each to its own marker topic."""
    clients = []
    for n in range(count):
        c = Client(port, protocol=paho.MQTTv5 if n % 2 == 0 else paho.MQTTv311)
        assert c.subscribe(share, 1) == [1]
        assert c.subscribe(marker(share, n), 1) == [1]
        clients.append(c)
    return clients


def rest_is_empty(pub: Client, share: str, clients: list[Client]) -> bool:
    """True when each client's next message is its marker: it got nothing after what was taken."""
    for n, c in enumerate(clients):
        pub.publish(marker(share, n), "marker", 1)
        if c.get().payload != b"marker":
            return False
    return True


def test_round_robin_over_members_of_both_versions_and_a_plain_subscriber_beside(broker: Broker) -> None:
    base = f"shared/rr/{uid()}"
    share = f"$share/g/{base}/+"
    group = members(broker.port, share, 3)
    plain = Client(broker.port)
    assert plain.subscribe(f"{base}/+", 1) == [1]
    pub = Client(broker.port)
    for n in range(6):
        pub.publish(f"{base}/x", f"m{n}", 1)
    for n in range(6):  # in order, member after member
        message = group[n % 3].get()
        assert (message.topic, message.payload, message.qos, message.retain) == (f"{base}/x", f"m{n}".encode(), 1, False)
        assert plain.get().payload == f"m{n}".encode()  # a plain subscription still gets every one
    assert rest_is_empty(pub, share, group)
    for c in (*group, plain, pub):
        c.disconnect()


def test_raw_qos0_runs_are_balanced_too_and_an_unsubscribed_member_gets_nothing(broker: Broker) -> None:
    base = f"shared/q0/{uid()}"
    share = f"$share/g/{base}"
    group = members(broker.port, share, 2)
    pub = Client(broker.port)  # 3.1.1 QoS 0: the router gets these as raw runs
    for n in range(4):
        pub.publish(base, f"m{n}", 0)
    got = sorted([group[0].get().payload, group[0].get().payload, group[1].get().payload, group[1].get().payload])
    assert got == [b"m0", b"m1", b"m2", b"m3"]
    assert rest_is_empty(pub, share, group)
    unsubscribed = threading.Event()
    group[0].client.on_unsubscribe = lambda *_args: unsubscribed.set()
    group[0].client.unsubscribe(share)
    assert unsubscribed.wait(5)
    for n in range(3):
        pub.publish(base, f"after {n}", 1)
    assert [group[1].get().payload for _ in range(3)] == [b"after 0", b"after 1", b"after 2"]
    assert rest_is_empty(pub, share, group)
    for c in (*group, pub):
        c.disconnect()


def test_retained_messages_are_not_sent_to_a_shared_subscription(broker: Broker) -> None:
    base = f"shared/ret/{uid()}"
    pub = Client(broker.port)
    pub.publish(base, "retained", 1, retain=True)
    share = f"$share/g/{base}"
    group = members(broker.port, share, 2)
    assert rest_is_empty(pub, share, group)
    pub.publish(base, "", 1, retain=True)
    for c in (*group, pub):
        c.disconnect()


def test_unacknowledged_messages_of_a_member_that_disconnects_go_to_another(broker: Broker) -> None:
    base = f"shared/redo/{uid()}"
    share = f"$share/g/{base}"
    first, _ = raw5(broker.port)  # joins first: round robin starts with it
    assert subscribe5(first, 1, [(share, 2)]) == [2]
    other = Client(broker.port, protocol=paho.MQTTv5)
    assert other.subscribe(share, 2) == [2]
    legacy = RawClient(broker.port)  # a 3.1.1 member, which does not acknowledge either
    legacy.connect(f"redo-311-{uid()}")
    legacy.send(v4.encode_subscribe(1, [(share, 1)]))
    assert legacy.recv()[0] == 0x90
    pub = Client(broker.port)
    pub.publish(base, "at 1", 1)  # to first
    pub.publish(base, "at 2", 2)  # to other
    pub.publish(base, "to legacy", 1)  # to legacy
    pub.publish(base, "at 2 again", 2)  # to first
    got = [recv_publish(first)[2], recv_publish(first)[2]]
    assert got == [b"at 1", b"at 2 again"]
    assert other.get().payload == b"at 2"
    first_byte, body = legacy.recv()
    assert first_byte >> 4 == v4.PUBLISH and body.endswith(b"to legacy")
    first.close()  # neither PUBACK nor PUBREC: both go to another member
    legacy.close()
    redone = sorted(other.get().payload for _ in range(3))
    assert redone == [b"at 1", b"at 2 again", b"to legacy"]
    other.disconnect()
    pub.disconnect()


def test_offline_persistent_members_get_messages_only_when_no_member_is_online(broker: Broker) -> None:
    base = f"shared/off/{uid()}"
    share = f"$share/g/{base}"
    cid = f"off-{uid()}"
    kept, _ = raw5(broker.port, cid, properties={P.SESSION_EXPIRY_INTERVAL: 600})
    assert subscribe5(kept, 1, [(share, 1), (f"marker/{base}", 1)]) == [1, 1]
    kept.send(v5.encode_disconnect())
    kept.read_until_closed()
    online = Client(broker.port)
    assert online.subscribe(share, 1) == [1]
    pub = Client(broker.port)
    for n in range(3):
        pub.publish(base, f"while online {n}", 1)
    assert [online.get().payload for _ in range(3)] == [f"while online {n}".encode() for n in range(3)]
    online.disconnect()  # the only online member leaves: the persistent member's session keeps them
    for n in range(2):
        pub.publish(base, f"while none {n}", 1)
    pub.publish(f"marker/{base}", "marker", 1)
    kept, (present, _code, _props) = raw5(broker.port, cid, clean_start=False,
                                          properties={P.SESSION_EXPIRY_INTERVAL: 600})
    assert present
    got: list[bytes] = []

    def take() -> None:
        _topic, packet_id, payload, _props, _first = recv_publish(kept)
        kept.send(v5.encode_ack(v5.PUBACK, packet_id))
        got.append(payload)

    for _ in range(3):
        take()
    # what the router gave `online` before it heard that it left goes on to the kept session then, maybe
    # after the marker (shared messages keep no order across members, nor topics theirs)
    assert sorted(got) == [b"marker", b"while none 0", b"while none 1"]
    pub.publish(f"marker/{base}", "marker again", 1)
    take()
    assert got[-1] == b"marker again"  # and nothing more came
    kept.send(v5.encode_disconnect(0, {P.SESSION_EXPIRY_INTERVAL: 0}))
    kept.read_until_closed()
    pub.disconnect()


def test_sticky_and_random_strategies(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    for strategy in ("sticky", "random"):
        config = tmp_path / f"{strategy}.toml"
        config.write_text(f'shared_subscription_strategy = "{strategy}"\n')
        b = start_broker("--workers", "2", "--config", str(config))
        share = f"$share/g/shared/{strategy}"
        group = members(b.port, share, 3)
        pub = Client(b.port)
        for n in range(9):
            pub.publish(f"shared/{strategy}", f"m{n}", 1)
        received: list[list[bytes | bytearray]] = [[] for _ in group]
        for n, c in enumerate(group):
            pub.publish(marker(share, n), "marker", 1)
            while (payload := c.get().payload) != b"marker":
                received[n].append(payload)
        assert sorted(p for got in received for p in got) == sorted(f"m{n}".encode() for n in range(9))
        if strategy == "sticky":
            assert sorted(len(got) for got in received) == [0, 0, 9]  # one member took them all, in order
            assert max(received, key=len) == [f"m{n}".encode() for n in range(9)]
        for c in (*group, pub):
            c.disconnect()
