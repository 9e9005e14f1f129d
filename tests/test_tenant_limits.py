"""The tenant limits only the router can judge (issue 23, wave 2: limits-router), in the router core
(tests/router_harness.py): connections, the connection rate and persistent sessions refuse a CONNECT
(SESSION names the limit), subscriptions a filter (SUBACK 0x97), retained messages are not kept,
a session's queue drops past the tenant's cap; every hit is counted and logged at most once per 10 s."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as paho
import pytest

from plexmq import tenants, wire
from plexmq.acceptor import config as cfg
from plexmq.mqtt import properties as props
from plexmq.mqtt import v5
from plexmq.mqtt.reasons import CONNECTION_RATE_EXCEEDED, QUOTA_EXCEEDED
from plexmq.router.tenants import Tenant
from plexmq.wire import Kick, Session, Suback
from plexmq.workers.auth.logins import SERVER_UNAVAILABLE
from tests.cli import write
from tests.conftest import Broker
from tests.mqtt import Client, RawClient
from tests.router_harness import Deliver, Routed, RouterHarness, WorkerEnd, routed_of


def limited(h: RouterHarness, name: str = "a", **limits: float) -> Tenant:
    """Tenant `name` of the harness's router, with these limits applied."""
    h.router.apply_limits(name, tenants.Tenant(name, **limits))  # type: ignore[arg-type]  # the limits' own kinds
    return h.router.tenant(name)


def answer(h: RouterHarness, end: WorkerEnd, conn: int, client_id: str, clean: bool = True, **connect: object) -> Session:
    """The SESSION that answers a CONNECT of tenant "a" that waits for it (connack_sent 0)."""
    end.connect(conn, client_id, clean, tenant="a", **connect)  # type: ignore[arg-type]  # the keywords of connect
    h.turn()
    found = [r for r in end.take() if isinstance(r, Session)]
    assert len(found) == 1, found
    return found[0]


def test_max_connections_holds_across_workers_and_a_connection_that_ends_makes_room() -> None:
    h = RouterHarness()
    w0, w1 = h.worker("w0"), h.worker("w1")
    a = limited(h, max_connections=2)
    assert answer(h, w0, 1, "c1") == Session(1, False, [])
    assert answer(h, w1, 2, "c2") == Session(2, False, [])
    assert answer(h, w0, 3, "c3") == Session(3, False, [], "max_connections")
    assert a.limit_hits["max_connections"] == 1 and a.connections == 2
    assert "c3" not in a.sessions and (b"w0", 3) not in h.router.conn_tenants  # forgotten: no session, no will
    w0.gone(3)  # the refused connection closes: nothing to undo
    w1.gone(2)
    assert answer(h, w0, 4, "c4") == Session(4, False, [])
    assert a.connections == 2


def test_taking_a_live_session_over_is_not_a_connection_more() -> None:
    h = RouterHarness()
    w0 = h.worker("w0")
    a = limited(h, max_connections=1)
    assert answer(h, w0, 1, "dev") == Session(1, False, [])
    w0.connect(2, "dev", tenant="a")
    h.turn()
    records = w0.take()
    assert Kick(1) in records and Session(2, False, []) in records
    w0.kicked(1)
    assert a.connections == 1 and not a.limit_hits


def test_a_connection_registered_again_is_never_refused() -> None:
    """A worker that joins again (a restarted router) registers the connections it holds, CONNACK sent."""
    h = RouterHarness()
    w0 = h.worker("w0")
    a = limited(h, max_connections=1)
    assert answer(h, w0, 1, "c1") == Session(1, False, [])
    w0.connect(2, "c2", tenant="a", connack_sent=1)
    h.turn()
    assert w0.take() == [] and a.connections == 2 and not a.limit_hits


def test_max_connection_rate_is_a_bucket_of_one_seconds_worth() -> None:
    h = RouterHarness()
    w0 = h.worker("w0")
    a = limited(h, max_connection_rate=2)
    assert [answer(h, w0, n, f"c{n}").refused for n in (1, 2, 3)] == ["", "", "max_connection_rate"]
    h.router.apply_limits("a", a.limits)  # a reload that leaves the rate as it was: the bucket stays empty
    assert answer(h, w0, 9, "c9").refused == "max_connection_rate"
    a.filled_at -= 0.5  # half a second later: one more
    assert [answer(h, w0, n, f"c{n}").refused for n in (4, 5)] == ["", "max_connection_rate"]
    a.filled_at -= 60.0  # long idle: still only one second's worth
    assert [answer(h, w0, n, f"c{n}").refused for n in (6, 7, 8)] == ["", "", "max_connection_rate"]
    assert a.limit_hits["max_connection_rate"] == 4


def test_a_refusal_for_another_limit_takes_no_token() -> None:
    h = RouterHarness()
    w0 = h.worker("w0")
    a = limited(h, max_connection_rate=1, max_connections=1)
    assert answer(h, w0, 1, "c1").refused == ""
    a.filled_at -= 1.0
    assert answer(h, w0, 2, "c2").refused == "max_connections"
    w0.gone(1)
    assert answer(h, w0, 3, "c3").refused == ""


def test_max_sessions_counts_persistent_sessions_online_or_offline() -> None:
    h = RouterHarness()
    w0 = h.worker("w0")
    a = limited(h, max_sessions=1)
    assert answer(h, w0, 1, "keep", clean=False) == Session(1, False, [])
    assert answer(h, w0, 2, "other", clean=False).refused == "max_sessions"
    assert answer(h, w0, 3, "clean").refused == ""  # a clean session is no persistent one
    w0.gone(1)
    assert answer(h, w0, 4, "other", clean=False).refused == "max_sessions"  # offline, still kept
    assert answer(h, w0, 5, "keep", clean=False) == Session(5, True, [])  # its own session: resumed
    assert answer(h, w0, 6, "keep", clean=False, fresh=True).refused == ""  # clean start replaces it
    assert a.limit_hits["max_sessions"] == 2


def test_max_subscriptions_refuses_a_filter_past_the_tenants_total() -> None:
    h = RouterHarness()
    w0 = h.worker("w0")
    a = limited(h, max_subscriptions=2)
    for conn in (1, 2):
        assert answer(h, w0, conn, f"c{conn}").refused == ""
    w0.subscribe(1, 1, [("x", 1), ("x", 0), ("y", 1), ("z", 1)])  # "x" again replaces its subscription
    h.turn()
    assert [r.codes for r in w0.take() if isinstance(r, Suback)] == [[1, 0, 1, QUOTA_EXCEEDED]]
    w0.subscribe(2, 1, [("z", 0)])  # another client of the tenant
    h.turn()
    assert [r.codes for r in w0.take() if isinstance(r, Suback)] == [[QUOTA_EXCEEDED]]
    w0.unsubscribe(1, 2, ["x"])
    w0.subscribe(2, 3, [("z", 0)])
    h.turn()
    assert [r.codes for r in w0.take() if isinstance(r, Suback)] == [[0]]
    w0.gone(1)  # a clean session's subscriptions go with it
    assert a.subscriptions == 1 and a.limit_hits["max_subscriptions"] == 2


def test_max_subscriptions_of_one_tenant_leaves_another_alone() -> None:
    h = RouterHarness()
    w0 = h.worker("w0")
    limited(h, max_subscriptions=1)
    w0.connect(1, "c", tenant="b")
    w0.subscribe(1, 1, [("x", 0), ("y", 0)])
    h.turn()
    assert [r.codes for r in w0.take() if isinstance(r, Suback)] == [[0, 0]]


def retained_topics(h: RouterHarness, tenant: str = "a") -> dict[str, bytes]:
    return {topic: m.payload for topic, m in h.router.tenants[tenant].retained.messages.items()}


def test_max_retained_messages_keeps_no_new_one_but_replacing_and_clearing_work() -> None:
    h = RouterHarness()
    w0 = h.worker("w0")
    a = limited(h, max_retained_messages=1)
    assert answer(h, w0, 1, "pub").refused == "" and answer(h, w0, 2, "sub").refused == ""
    w0.subscribe(2, 1, [("#", 0)])
    w0.pub(1, "r1", b"one", retain=True)
    w0.pub(1, "r2", b"two", retain=True)  # not kept, still routed live
    h.turn()
    assert [r.payload for r in w0.take() if isinstance(r, Deliver)] == [b"one", b"two"]
    assert retained_topics(h) == {"r1": b"one"} and a.limit_hits["max_retained_messages"] == 1
    w0.pub(1, "r1", b"one again", retain=True)
    assert retained_topics(h) == {"r1": b"one again"}
    w0.pub(1, "r1", b"", retain=True)
    w0.pub(1, "r2", b"two", retain=True)
    assert retained_topics(h) == {"r2": b"two"} and a.limit_hits["max_retained_messages"] == 1


def test_a_publisher_that_can_be_told_hears_of_the_refusal_and_its_message_is_not_routed() -> None:
    h = RouterHarness()
    w0 = h.worker("w0")
    a = limited(h, max_retained_messages=1)
    assert answer(h, w0, 1, "pub").refused == "" and answer(h, w0, 2, "sub").refused == ""
    w0.subscribe(2, 1, [("#", 0)])
    h.turn()
    w0.take()
    w0.pub(1, "r1", b"one", qos=1, pid=1, retain=True, ask_match=True)
    w0.pub(1, "r2", b"two", qos=1, pid=2, retain=True, ask_match=True)
    w0.pub(1, "r1", b"one again", qos=2, pid=3, retain=True, ask_match=True)
    h.turn()
    records = w0.take()
    assert [r.payload for r in records if isinstance(r, Deliver)] == [b"one", b"one again"]
    assert routed_of(records) == Routed(3, 3, (1 | wire.REFUSED_AT,))
    assert retained_topics(h) == {"r1": b"one again"} and a.limit_hits["max_retained_messages"] == 1


def test_max_retained_bytes_counts_topic_and_payload_bytes() -> None:
    h = RouterHarness()
    w0 = h.worker("w0")
    a = limited(h, max_retained_bytes=20)
    assert answer(h, w0, 1, "pub").refused == ""
    w0.pub(1, "r1", b"12345678", retain=True)  # 10 bytes
    w0.pub(1, "r2", b"1234567", retain=True)  # 9: 19 in all
    w0.pub(1, "r3", b"12", retain=True)  # 4 more: not kept
    assert retained_topics(h) == {"r1": b"12345678", "r2": b"1234567"} and a.retained.bytes == 19
    w0.pub(1, "r1", b"123456789", retain=True)  # a replacement one byte larger: 20, kept
    w0.pub(1, "r2", b"12345678", retain=True)  # one byte larger again: 21, not kept
    w0.pub(1, "r1", b"1", retain=True)  # frees 8
    w0.pub(1, "r3", b"12", retain=True)  # now fits: 3 + 9 + 4
    assert retained_topics(h) == {"r1": b"1", "r2": b"1234567", "r3": b"12"} and a.retained.bytes == 16
    assert a.limit_hits["max_retained_bytes"] == 2


def test_max_queued_messages_caps_the_tenants_sessions_only() -> None:
    h = RouterHarness(max_inflight=1, max_queued=100)
    w0 = h.worker("w0")
    a = limited(h, max_queued_messages=1)
    for tenant in ("a", ""):
        w0.connect(1, "dev", clean=False, tenant=tenant)
        w0.subscribe(1, 1, [("t", 1)])
        w0.gone(1)
        w0.connect(2, "pub", tenant=tenant, connack_sent=1)
        for n in range(4):
            w0.pub(2, "t", b"m%d" % n, qos=1, pid=n + 1)
        w0.gone(2)
    assert len(a.sessions["dev"].unacked) == 2  # the window (1) and the tenant's queue (1)
    assert len(h.router.default.sessions["dev"].unacked) == 4
    assert a.limit_hits["max_queued_messages"] == 2 and not h.router.default.limit_hits


def test_a_limit_hit_is_counted_each_time_and_logged_once_per_ten_seconds(caplog: pytest.LogCaptureFixture) -> None:
    h = RouterHarness()
    w0 = h.worker("w0")
    a = limited(h, max_connections=1)
    caplog.set_level(logging.WARNING, "plexmq.router")
    for conn in (1, 2, 3):
        answer(h, w0, conn, f"c{conn}")
    lines = [r.getMessage() for r in caplog.records if "max_connections" in r.getMessage()]
    assert len(lines) == 1 and "tenant a" in lines[0] and "max_connections 1" in lines[0]
    a.logged_at["max_connections"] -= 10.0
    answer(h, w0, 4, "c4")
    assert len([r for r in caplog.records if "max_connections" in r.getMessage()]) == 2
    assert a.limit_hits["max_connections"] == 3


def test_limits_taken_away_at_a_reload_refuse_nothing() -> None:
    h = RouterHarness()
    w0 = h.worker("w0")
    limited(h, max_connections=1, max_queued_messages=1)
    h.router.apply_limits("a", tenants.Tenant("a"))
    assert [answer(h, w0, n, f"c{n}").refused for n in (1, 2)] == ["", ""]
    assert "a" not in h.router.outbox.capped


def test_a_declared_tenant_is_made_only_when_named_and_then_takes_its_limits() -> None:
    """Thousands of tenants declared cost the router no `Tenant` (and no work each second) until a
    CONNECT or the store names one."""
    h = RouterHarness()
    w0 = h.worker("w0")
    for i in range(1000):
        h.router.apply_limits(f"t{i}", tenants.Tenant(f"t{i}", max_connections=1))
    assert list(h.router.tenants) == [""]
    end = h.worker("w1")
    end.connect(1, "c1", tenant="t7")
    end.connect(2, "c2", tenant="t7")
    h.turn()
    assert h.router.tenants["t7"].limits.max_connections == 1 and list(h.router.tenants) == ["", "t7"]
    assert [r.refused for r in end.take() if isinstance(r, Session)] == ["", "max_connections"]
    assert w0.take() == []


# -- config -------------------------------------------------------------------------------------------


def test_the_limits_are_read_into_the_tenant_and_a_bad_one_names_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "[tenants.acme]\nmax_connections = 5\nmax_connection_rate = 2.5\nmax_queued_messages = 7\n")
    acme = tenants.Tenants.from_config(cfg.load(str(path), {})).declared["acme"]
    assert (acme.max_connections, acme.max_connection_rate, acme.max_queued_messages, acme.max_sessions) == (5, 2.5, 7, 0)
    assert acme.limits_connects and not tenants.Tenant("b", max_subscriptions=1).limits_connects
    path = write(tmp_path, "[tenants.acme]\n\nmax_subscriptions = -1\n")
    with pytest.raises(cfg.ConfigError, match=r":3.*max_subscriptions"):
        cfg.load(str(path), {})


# -- the real broker: the limits hold across its two workers --------------------------------------------

BROKER = """tenant_separator = "@"

[tenants.acme]
max_connections = 2

[tenants.slow]
max_connection_rate = 0.01

[tenants.few]
max_subscriptions = 1

[tenants.kept]
max_retained_messages = 1
"""


def refused(port: int, username: str, v5: bool) -> tuple[int, str | None]:
    """The CONNACK code (and a 5.0 one's reason string) of a refused connection, which the broker closes."""
    raw = RawClient(port)
    if v5:
        present, code, told = raw.connect5("x", username=username)
    else:
        (present, code), told = raw.connect("x", username=username), {}
    assert not present and raw.read_until_closed() == b""
    raw.close()
    return code, told.get(props.REASON_STRING)


def test_the_broker_refuses_connections_and_subscriptions_past_a_tenants_limits(
        tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    b = start_broker("--config", str(write(tmp_path, BROKER)), "--workers", "2")
    held = [Client(b.port, f"c{n}", username=f"c{n}@acme") for n in (1, 2)]  # one on each worker (least loaded)
    assert refused(b.port, "c3@acme", False) == (SERVER_UNAVAILABLE, None)
    assert refused(b.port, "c3@acme", True) == (QUOTA_EXCEEDED, "tenant 'acme': max_connections reached")
    others = Client(b.port, "c3", username="c3")  # the default tenant has no limit
    Client(b.port, "first", username="first@slow", protocol=paho.MQTTv5).disconnect()  # the bucket's one token
    assert refused(b.port, "next@slow", False) == (SERVER_UNAVAILABLE, None)
    assert refused(b.port, "next@slow", True) == (CONNECTION_RATE_EXCEEDED, "tenant 'slow': max_connection_rate reached")
    sub4, sub5 = Client(b.port, "s4", username="s4@few"), Client(b.port, "s5", username="s5@few", protocol=paho.MQTTv5)
    assert sub4.subscribe("a", 1) == [1]
    assert sub4.subscribe("b", 1) == [0x80]
    assert sub5.subscribe("c", 1) == [QUOTA_EXCEEDED]
    for client in [*held, others, sub4, sub5]:
        client.disconnect()


def test_a_retained_message_past_the_limit_is_refused_to_a_5_publisher_and_only_not_kept_for_others(
        tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    b = start_broker("--config", str(write(tmp_path, BROKER)), "--workers", "2")
    pub5 = RawClient(b.port)
    assert pub5.connect5("p5", username="p5@kept")[1] == 0
    pub5.send(v5.encode_publish(b"r1", b"one", 1, True, packet_id=1))
    assert pub5.recv()[1][:3] == b"\x00\x01\x10"  # kept; nobody subscribes: 0x10
    watcher = Client(b.port, "w", username="w@kept")
    assert watcher.subscribe("r/#") == [0]
    pub5.send(v5.encode_publish(b"r/2", b"two", 1, True, packet_id=2))
    assert pub5.recv()[1][:3] == b"\x00\x02" + bytes([QUOTA_EXCEEDED])  # refused: not routed either
    pub4 = Client(b.port, "p4", username="p4@kept")
    pub4.publish("r/3", b"three", qos=1, retain=True)  # 3.1.1 cannot be told: routed, not kept
    assert watcher.get().payload == b"three"
    late = Client(b.port, "late", username="late@kept")
    assert late.subscribe("#") == [0]
    assert late.get().topic == "r1" and late.nothing()
    for client in (watcher, pub4, late):
        client.disconnect()
    pub5.close()
