"""A tenant's limits that a worker judges alone (workers/tenant_limits.py), in-process
(tests/connection_harness.py): what a 5.0 CONNACK tells, and what goes over each limit gets, in 3.1.1
and 5.0; every hit counted for its tenant. Tenant "lim" sets limits, tenant "free" sets none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from plexmq import wire
from plexmq.acceptor import config as cfg
from plexmq.mqtt import properties as props
from plexmq.mqtt import reasons, v5
from plexmq.mqtt import v4 as p
from plexmq.mqtt.connect import Will
from plexmq.tenants import Tenant, Tenants
from plexmq.workers.settings import Settings
from plexmq.workers.tenant_limits import BATCH, TICK, Limits, limited
from tests.cli import write
from tests.connection_harness import Client, ConnectionHarness, deliver

BROKER_MAX_PACKET = 1 << 20


def harness(**limits: object) -> ConnectionHarness:
    """A worker (one of two: `workers=2`) with tenant "lim" limited by `limits` and tenant "free"."""
    overrides: dict[str, Any] = {key: value for key, value in limits.items() if key in ("max_subscriptions", "rate_disconnects")}
    tenant = Tenant("lim", **{key: value for key, value in limits.items() if key not in overrides})  # type: ignore[arg-type]  # the test's fields
    return ConnectionHarness(tenants=Tenants({"lim": tenant, "free": Tenant("free")}, "@"), workers=2, **overrides)


def test_a_tenants_table_sets_its_limits_and_each_worker_takes_its_share(tmp_path: Path) -> None:
    config = cfg.load(str(write(tmp_path, "workers = 4\n[tenants.acme]\nmax_packet_size = 1000\nmax_qos = 1\n"
                                          "max_session_expiry = 60\nmax_subscriptions_per_client = 5\n"
                                          "message_rate = 100\nbyte_rate = 4000\n[tenants.free]\n")), {})
    settings = Settings.from_config(config)
    assert settings.tenants.declared["acme"] == Tenant("acme", max_packet_size=1000, max_qos=1, max_session_expiry=60,
                                                             max_subscriptions_per_client=5, message_rate=100.0,
                                                             byte_rate=4000.0)
    assert settings.tenants.declared["free"] == Tenant("free")
    limits = Limits(settings.tenants.declared["acme"], settings)
    assert (limits.message_rate, limits.byte_rate, limits.max_subscriptions) == (25.0, 1000.0, 5)
    assert limited(settings.tenants.declared["acme"]) and not limited(settings.tenants.declared["free"])


def read_connack(c: Client) -> tuple[bool, int, dict]:
    [packet] = c.packets()
    assert packet.kind == p.CONNACK
    return (*p.decode_connack(0, packet.body), {}) if not c.v5 else v5.decode_connack(0, packet.body)


def closed_with(c: Client, code: int) -> None:
    """`c` was closed: a 5.0 client told `code` in a DISCONNECT, a 3.1.1 one told nothing."""
    assert c.transport.closed
    packets = c.packets()
    if c.v5:
        [disconnect] = packets
        assert disconnect.kind == p.DISCONNECT and disconnect.body[0] == code
    else:
        assert packets == []


def test_the_connack_tells_a_5_client_its_tenants_limits() -> None:
    h = harness(max_packet_size=1000, max_qos=1, max_session_expiry=60)
    c = h.client("dev", False, version=5, username="dev@lim", properties={props.SESSION_EXPIRY_INTERVAL: 3600})
    connack = c.conn.connack5(False)
    assert connack is not None
    told = v5.decode_connack(0, connack[2:])[2]
    assert (told[props.MAXIMUM_PACKET_SIZE], told[props.MAXIMUM_QOS], told[props.SESSION_EXPIRY_INTERVAL]) == (1000, 1, 60)
    assert c.conn.v5 is not None and c.conn.v5.session_expiry == 60
    assert h.worker.counters.limit_hits == {("lim", "max_session_expiry"): 1}

    free = h.client("other", version=5, username="dev@free")
    told = v5.decode_connack(0, free.conn.connack5(False)[2:])[2]  # type: ignore[index]  # it fits
    assert told[props.MAXIMUM_PACKET_SIZE] == BROKER_MAX_PACKET
    assert props.MAXIMUM_QOS not in told and props.SESSION_EXPIRY_INTERVAL not in told
    assert free.conn.limits is None  # a tenant without limits pays nothing for them


def test_the_session_expiry_cap_reaches_the_router_and_holds_at_disconnect() -> None:
    h = harness(max_session_expiry=60)
    c = h.open()
    c.v5 = True
    c.send(v5.encode_connect("dev", False, 60, username="dev@lim", protocol_level=5,
                             properties={props.SESSION_EXPIRY_INTERVAL: 0xFFFFFFFF}))
    [record] = h.records()
    assert wire.Connect(*record.fields).expiry == 60
    c.conn.session_ready(False, [])
    c.packets()
    c.send(v5.encode_disconnect(0, {props.SESSION_EXPIRY_INTERVAL: 999}))
    assert [r.fields[1] for r in h.records() if r.kind == "SESSION_EXPIRY"] == [60]


def test_a_tenant_packet_size_above_the_brokers_is_the_brokers() -> None:
    h = harness(max_packet_size=BROKER_MAX_PACKET * 2)
    c = h.client("dev", version=5, username="dev@lim")
    assert c.conn.max_size() == BROKER_MAX_PACKET


@pytest.mark.parametrize("version", [4, 5])
def test_a_packet_above_the_tenants_maximum_closes_the_connection_0x95(version: int) -> None:
    h = harness(max_packet_size=100)
    encode = v5.encode_publish if version == 5 else p.encode_publish
    c = h.client("dev", version=version, username="dev@lim")
    c.send(encode(b"t", b"x" * 50, 1, packet_id=1))
    assert not c.transport.closed
    c.packets()
    c.send(encode(b"t", b"x" * 100))
    closed_with(c, reasons.PACKET_TOO_LARGE)
    assert h.worker.counters.limit_hits == {("lim", "max_packet_size"): 1}
    free = h.client("other", version=version, username="dev@free")
    free.send(encode(b"t", b"x" * 100))
    assert not free.transport.closed


@pytest.mark.parametrize("version", [4, 5])
def test_a_publish_above_the_tenants_max_qos_closes_the_connection_0x9b(version: int) -> None:
    h = harness(max_qos=1)
    encode = v5.encode_publish if version == 5 else p.encode_publish
    c = h.client("dev", version=version, username="dev@lim")
    c.send(encode(b"t", b"x", 1, packet_id=1))
    assert not c.transport.closed
    c.send(encode(b"t", b"x", 2, packet_id=2))
    closed_with(c, reasons.QOS_NOT_SUPPORTED)
    assert h.worker.counters.limit_hits == {("lim", "max_qos"): 1}
    free = h.client("other", version=version, username="dev@free")
    free.send(encode(b"t", b"x", 2, packet_id=2))
    assert not free.transport.closed


@pytest.mark.parametrize("version,code", [(4, 0x05), (5, reasons.QOS_NOT_SUPPORTED)])
def test_a_will_above_the_tenants_max_qos_is_refused(version: int, code: int) -> None:
    h = harness(max_qos=0)
    c = h.open()
    c.v5 = version == 5
    c.send(v5.encode_connect("dev", True, 60, Will("w", b"bye", 1, False), username="dev@lim", protocol_level=version))
    assert read_connack(c)[1] == code
    assert c.transport.closed and h.records() == []


@pytest.mark.parametrize("version", [4, 5])
def test_subscriptions_are_granted_at_most_the_tenants_max_qos(version: int) -> None:
    h = harness(max_qos=1)
    encode = v5.encode_subscribe if version == 5 else p.encode_subscribe
    c = h.client("dev", version=version, username="dev@lim")
    c.send(encode(1, [("a", 2), ("b", 0)]))
    [record] = h.records()
    assert [grant & 3 for _filter, grant in wire.Subscribe(*record.fields).filters] == [1, 0]
    assert h.worker.counters.limit_hits == {("lim", "max_qos"): 1}


@pytest.mark.parametrize("version", [4, 5])
def test_max_subscriptions_per_client_replaces_the_brokers(version: int) -> None:
    """The router answers the SUBACK with the worker's refusal: 0x97 (3.1.1: 0x80)."""
    h = harness(max_subscriptions_per_client=2, max_subscriptions=1)
    encode = v5.encode_subscribe if version == 5 else p.encode_subscribe
    c = h.client("dev", version=version, username="dev@lim")
    c.send(encode(1, [("a", 0), ("b", 0), ("c", 0)]))
    [record] = h.records()
    assert [grant for _filter, grant in wire.Subscribe(*record.fields).filters] == [0, 0, reasons.QUOTA_EXCEEDED]
    assert h.worker.counters.limit_hits == {("lim", "max_subscriptions_per_client"): 1}
    free = h.client("other", version=version, username="dev@free")  # the broker's max_subscriptions
    free.send(encode(1, [("a", 0), ("b", 0)]))
    [record] = h.records()
    assert [grant for _filter, grant in wire.Subscribe(*record.fields).filters] == [0, reasons.QUOTA_EXCEEDED]


def test_the_tenants_max_queued_messages_caps_a_clean_sessions_queue_in_the_worker() -> None:
    """A backed-up client of the tenant queues at most its max_queued_messages (the router caps its
    persistent sessions' queues); a client of another tenant keeps the broker's max_queued_messages."""
    h = harness(max_queued_messages=1)
    lim, free = h.client("a", username="a@lim"), h.client("b", username="b@free")
    for c in (lim, free):
        c.pause_writing()
        h.from_router(*(deliver(b"t", bytes([n]), 1, [(c.conn_id, 1, 0)]) for n in range(3)))
    assert (len(lim.conn.queue), len(free.conn.queue)) == (1, 3)
    assert h.worker.counters.limit_hits == {("lim", "max_queued_messages"): 2}


def published(h: ConnectionHarness) -> int:
    """PUBLISH packets the worker sent the router since the last call."""
    return sum(r.fields[0] for r in h.records() if r.kind in ("PUB0", "PUB0_V5"))


def burst(count: int, size: int = 1, version: int = 4) -> bytes:
    encode = v5.encode_publish if version == 5 else p.encode_publish
    return b"".join(encode(b"t", b"x" * size) for _ in range(count))


def test_the_tenants_message_rate_is_shared_by_its_clients_on_a_worker() -> None:
    """message_rate 10 over two workers: this one reads 5 a second of all the tenant's clients together;
    another tenant's client on it is not slowed."""
    h = harness(message_rate=10.0)
    one, two = h.client("one", username="a@lim"), h.client("two", username="b@lim")
    free = h.client("free", username="c@free")
    one.send(burst(3))
    two.send(burst(3))
    assert published(h) == 5  # one's 3, then two's 2: the bucket is empty
    assert not two.transport.reading and one.transport.reading
    free.send(burst(100))
    assert published(h) == 100 and free.transport.reading
    assert h.worker.counters.limit_hits == {("lim", "message_rate"): 1}
    h.loop.advance(0.2 + TICK)  # one more message's worth (and the timers' millisecond): two's last
    assert published(h) == 1 and not two.conn.buf


def test_a_throttled_client_is_read_again_once_the_bucket_holds_a_batch() -> None:
    """message_rate 2000 over two workers: a bucket of 1000 here. A client past it is not read again until
    the bucket holds a batch (BATCH seconds' worth, 50): one wake-up, one hit and one router batch per 50
    packets, not per packet."""
    h = harness(message_rate=2000.0)
    c = h.client("dev", username="a@lim")
    c.send(burst(1200))
    assert published(h) == 1000 and not c.transport.reading
    h.loop.advance(BATCH / 2)
    assert published(h) == 0  # half a batch: still paused
    h.loop.advance(BATCH / 2 + 2 * TICK)  # (a TICK more than the timer's: float sums)
    assert 50 <= published(h) <= 52 and not c.transport.reading
    assert h.worker.counters.limit_hits == {("lim", "message_rate"): 2}  # one per pause


def test_the_tenants_waiting_clients_take_turns_on_one_timer() -> None:
    """Three clients wait for an empty bucket of 5 a second: one wake-up each 0.2 s (not one per client),
    and each refill goes to the next in line."""
    h = harness(message_rate=10.0)
    first = h.client("first", username="f@lim")
    clients = [h.client(f"dev{i}", username=f"d{i}@lim") for i in range(3)]
    timers = len(h.loop.timers)
    first.send(burst(5))  # empties it
    assert published(h) == 5
    for c in clients:
        c.send(burst(2))
    assert published(h) == 0 and len(h.loop.timers) == timers + 1
    took = []
    for _ in range(6):
        h.loop.advance(0.2 + TICK)
        [record] = [r for r in h.records() if r.kind == "PUB0"]
        took.append(record.fields[1])
    ids = [c.conn_id for c in clients]
    assert took == ids + ids


def test_the_tenants_byte_rate_slows_its_clients() -> None:
    h = harness(byte_rate=2000.0)  # 1000 bytes a second on this worker
    c = h.client("dev", username="a@lim")
    c.send(burst(20, 96))  # 100-byte packets: 10 fit the bucket
    assert published(h) == 10 and not c.transport.reading
    assert h.worker.counters.limit_hits == {("lim", "byte_rate"): 1}
    h.loop.advance(1.0)
    assert published(h) == 10


def test_rate_limit_action_disconnect_closes_a_client_over_its_tenants_rate_0x96() -> None:
    h = harness(message_rate=10.0, rate_disconnects=True)
    c = h.client("dev", version=5, username="a@lim")
    c.send(burst(5, version=5))
    assert not c.transport.closed
    c.send(burst(5, version=5))
    closed_with(c, reasons.MESSAGE_RATE_TOO_HIGH)
