"""End to end: a 5.0 session's own expiry interval (kept, ended when it passes, changed at DISCONNECT)
and the will delay interval with the will's properties. The end of a session is an event the broker
logs ("persistent session expired"), which the tests await; where they show that a will was not
published, a marker that must come next stands in for a wait."""

from __future__ import annotations

import time

import paho.mqtt.client as paho

from plexmq.mqtt import properties as P
from plexmq.mqtt import v5
from tests.conftest import Broker, wait_for
from tests.mqtt import Client, RawClient
from tests.steps import connect, publish, raw5, recv_publish, subscribe5, uid


def expired(broker: Broker, client_id: str) -> None:
    """Wait until the broker has ended the session of `client_id`."""
    wait_for(lambda: f"client {client_id}: persistent session expired" in broker.output(), 10,
             f"the session of {client_id} to expire")


def offline_session(port: int, client_id: str, expiry: int, at_disconnect: int | None = None) -> None:
    """A session with a QoS 1 subscription, left offline; `at_disconnect`: the expiry set at DISCONNECT."""
    topic = f"v5/expiry/{uid()}"
    c, (_present, code, _props) = raw5(port, client_id, properties={P.SESSION_EXPIRY_INTERVAL: expiry})
    assert code == 0
    assert subscribe5(c, 1, [(topic, 1)]) == [1]
    told = {} if at_disconnect is None else {P.SESSION_EXPIRY_INTERVAL: at_disconnect}
    c.send(v5.encode_disconnect(0, told))
    c.read_until_closed()


def present(port: int, client_id: str) -> bool:
    """Whether the broker still has the session (resumed, then ended)."""
    c, (found, _code, _props) = raw5(port, client_id, clean_start=False)
    c.send(v5.encode_disconnect())
    c.read_until_closed()
    return found


def test_a_session_ends_when_its_own_expiry_interval_has_passed(broker: Broker) -> None:
    brief, lasting = f"brief-{uid()}", f"lasting-{uid()}"
    offline_session(broker.port, lasting, 3600)  # offline first, but for an hour
    offline_session(broker.port, brief, 1)
    expired(broker, brief)
    assert not present(broker.port, brief)
    assert present(broker.port, lasting)


def test_the_expiry_set_at_disconnect_replaces_the_one_at_connect(broker: Broker) -> None:
    shortened, lengthened = f"shortened-{uid()}", f"lengthened-{uid()}"
    offline_session(broker.port, lengthened, 1, at_disconnect=3600)
    offline_session(broker.port, shortened, 3600, at_disconnect=1)
    expired(broker, shortened)  # offline after the other one: the other would have gone first
    assert present(broker.port, lengthened)


STAGGER = 0.2  # seconds between the sessions of a deadline test: the router's turns meet each at another phase
LATE = 0.5  # seconds a deadline may be late here: 100 ms, and slack for a busy 2-core CI machine


def test_no_session_can_be_resumed_after_its_expiry_interval(broker: Broker) -> None:
    """[MQTT-4.1.0-2] Of six sessions with expiry 1 s left offline at moments spread over a second,
    none is present 0.5 s after its interval ended: the end is checked when the client comes back, so
    this holds whatever the timers (they drifted 1-2 s)."""
    left_at = {}
    for i in range(6):
        client_id = f"on-time-{i}-{uid()}"
        offline_session(broker.port, client_id, 1)
        left_at[client_id] = time.monotonic()  # the router has it offline at this moment or just after
        time.sleep(STAGGER)  # the moments under test, spread over the router's second
    for client_id, at in left_at.items():
        time.sleep(max(0.0, at + 1 + LATE - time.monotonic()))  # the deadline under test
        assert not present(broker.port, client_id), f"{client_id} resumed {time.monotonic() - at:.2f} s offline"


def test_delayed_wills_come_on_time(broker: Broker) -> None:
    """Wills delayed 1 s, of connections lost at moments spread over a second, each come 1 s after
    the loss and within LATE more (the router's timers fire when due, not on a drifting tick)."""
    topic = f"v5/on-time/{uid()}"
    watcher, _connack = raw5(broker.port)
    assert subscribe5(watcher, 1, [(f"{topic}/#", 0)]) == [0]
    lost_at = {}
    for i in range(4):
        c = RawClient(broker.port)
        will = v5.Will(f"{topic}/{i}", b"gone", 0, False, {P.WILL_DELAY_INTERVAL: 1})
        assert c.connect5(f"on-time-will-{i}-{uid()}", properties={P.SESSION_EXPIRY_INTERVAL: 60}, will=will)[1] == 0
        c.close()  # no DISCONNECT: the will is due 1 s after the broker sees the connection go
        lost_at[f"{topic}/{i}"] = time.monotonic()
        time.sleep(STAGGER)  # the moments under test, spread over the router's second
    for _ in lost_at:
        got, _pid, payload, _props, _first = recv_publish(watcher)
        took = time.monotonic() - lost_at[got]
        assert payload == b"gone"
        assert 1 - 0.05 <= took <= 1 + LATE, f"the will of {got} came {took:.2f} s after its connection was lost"
    watcher.close()


def test_a_delayed_will_waits_and_is_not_sent_when_the_client_comes_back(broker: Broker) -> None:
    topic = f"v5/delay/{uid()}"
    watcher = Client(broker.port, protocol=paho.MQTTv5)
    assert watcher.subscribe(f"{topic}/#", 1) == [1]
    carried: P.Properties = {P.CONTENT_TYPE: "text/plain", P.USER_PROPERTY: [("why", "lost"), ("why", "again")]}

    def drop(client_id: str, delay: int, expiry: int) -> None:
        """Connect with a will delayed by `delay` s in a session of `expiry` s, and lose the connection."""
        c = RawClient(broker.port)
        will = v5.Will(f"{topic}/{client_id}", b"gone", 1, False,
                       {**carried, P.WILL_DELAY_INTERVAL: delay, P.MESSAGE_EXPIRY_INTERVAL: 600})
        assert c.connect5(client_id, properties={P.SESSION_EXPIRY_INTERVAL: expiry}, will=will)[1] == 0
        c.close()  # no DISCONNECT: the will is due

    back, late, ended = f"back-{uid()}", f"late-{uid()}", f"ended-{uid()}"
    drop(back, 3600, 3600)
    c, (found, _code, _props) = raw5(broker.port, back, clean_start=False,
                                     properties={P.SESSION_EXPIRY_INTERVAL: 3600})
    assert found
    c.send(v5.encode_disconnect(0, {P.SESSION_EXPIRY_INTERVAL: 0}))  # back in time: that will is never sent
    c.read_until_closed()
    drop(late, 1, 3600)  # published once its delay has passed
    drop(ended, 3600, 1)  # published when its session ends, before the delay
    got = {}
    for _ in range(2):
        message = watcher.get(timeout=10)
        got[message.topic] = message
    assert sorted(got) == sorted([f"{topic}/{late}", f"{topic}/{ended}"])
    for message in got.values():
        assert message.payload == b"gone"
        assert message.properties.ContentType == "text/plain"  # type: ignore[union-attr]  # a 5.0 message has properties
        assert message.properties.UserProperty == [("why", "lost"), ("why", "again")]  # type: ignore[union-attr]  # as above
        assert 590 <= message.properties.MessageExpiryInterval <= 600  # type: ignore[union-attr]  # as above
    marker = Client(broker.port)
    marker.publish(f"{topic}/marker", "marker", 1)
    assert watcher.get().payload == b"marker"  # and nothing of `back` before it
    marker.disconnect()
    watcher.disconnect()


def test_a_will_without_delay_carries_its_properties_at_once(broker: Broker) -> None:
    topic = f"v5/willprops/{uid()}"
    watcher = RawClient(broker.port)
    watcher.connect5(f"watch-{uid()}")
    assert subscribe5(watcher, 1, [(topic, 1)]) == [1]
    c = RawClient(broker.port)
    will = v5.Will(topic, b"bye", 1, False, {P.RESPONSE_TOPIC: "replies/x", P.CORRELATION_DATA: b"\x00\x01",
                                             P.PAYLOAD_FORMAT_INDICATOR: 1})
    c.connect5(f"v5-wp-{uid()}", will=will)
    c.close()
    got_topic, packet_id, payload, props, _first = recv_publish(watcher)
    watcher.send(v5.encode_ack(v5.PUBACK, packet_id))
    assert (got_topic, payload) == (topic, b"bye")
    assert props == {P.PAYLOAD_FORMAT_INDICATOR: 1, P.RESPONSE_TOPIC: "replies/x", P.CORRELATION_DATA: b"\x00\x01"}
    watcher.close()


def test_receive_maximum_is_the_sessions_window_across_a_reconnect(broker: Broker) -> None:
    """A persistent 5.0 session with Receive Maximum 5: never more than 5 deliveries unacknowledged,
    and the router's window for its session is 5 too, not max_inflight (20): after a reconnect only
    the 5 that were sent come again with DUP, the others come for the first time (DUP 0) as acks
    make room."""
    client_id, topic = f"rm5-{uid()}", f"v5/window/{uid()}"
    told = {P.SESSION_EXPIRY_INTERVAL: 300, P.RECEIVE_MAXIMUM: 5}
    c, (_present, code, _props) = raw5(broker.port, client_id, properties=told)
    assert code == 0
    assert subscribe5(c, 1, [(topic, 1)]) == [1]
    publisher = connect(broker.port)
    for n in range(12):
        publish(publisher, topic, b"%d" % n, qos=1, packet_id=n + 1)  # its PUBACK: kept in the session
    assert [recv_publish(c)[2] for _ in range(5)] == [b"0", b"1", b"2", b"3", b"4"]  # none acknowledged
    c.close()
    c, (present, code, _props) = raw5(broker.port, client_id, clean_start=False, properties=told)
    assert (present, code) == (True, 0)
    unacked: list[int] = []
    got: list[tuple[bytes, bool]] = []
    while len(got) < 12:
        _topic, packet_id, payload, _props, first = recv_publish(c)
        got.append((payload, bool(first & 0x08)))
        unacked.append(packet_id)
        assert len(unacked) <= 5
        if len(unacked) == 5 or len(got) == 12:
            c.send(v5.encode_ack(v5.PUBACK, unacked.pop(0)))
    assert got == [(b"%d" % n, n < 5) for n in range(12)]
