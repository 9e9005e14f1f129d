"""Per-client rate limits (client_message_rate, client_byte_rate): a client that sends faster is read
more slowly (its data waits in its socket), so it is held to the rate and nothing it sent is lost;
with rate_limit_action = "disconnect" it is closed instead (MQTT 5: 0x97). A tenant's message_rate slows
all its clients together, and no other tenant's."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from plexmq.acceptor.status import scrape
from plexmq.mqtt import properties as P
from plexmq.mqtt import v4 as p
from plexmq.mqtt import v5
from tests.cli import metrics_url
from tests.conftest import Broker, wait_for
from tests.mqtt import Client, RawClient
from tests.steps import uid


def burst_takes(b: Broker, count: int, payload: bytes, qos: int = 0, tenant: str = "") -> float:
    """Seconds between the first and the last of `count` PUBLISHes that one client sends in a single
    write, as its subscriber receives them; every one must arrive, in order. Both clients log in to
    `tenant` (tenant_separator "@") if one is named."""
    topic = f"rate/{uid()}"
    suffix = f"@{tenant}" if tenant else ""
    sub = Client(b.port, f"rate-sub-{uid()}", username=f"sub{suffix}")
    sub.subscribe(topic, qos)
    pub = RawClient(b.port)
    assert pub.connect(f"rate-pub-{uid()}", username=f"pub{suffix}") == (False, 0)
    pub.send(b"".join(p.encode_publish(topic.encode(), b"%06d" % i + payload, qos, packet_id=i + 1 if qos else 0)
                      for i in range(count)))
    first = sub.get()
    started = time.monotonic()
    got = [first.payload[:6]] + [sub.get().payload[:6] for _ in range(count - 1)]
    took = time.monotonic() - started
    assert got == [b"%06d" % i for i in range(count)]
    if qos:
        acks = [pub.recv() for _ in range(count)]
        assert acks == [(0x40, (i + 1).to_bytes(2, "big")) for i in range(count)]
    pub.send(p.PINGREQ_PACKET)  # the throttled client is still served
    assert pub.recv() == (0xD0, b"")
    pub.close()
    sub.disconnect()
    return took


def limited(tmp_path: Path, start_broker: Callable[..., Broker], text: str) -> Broker:
    config = tmp_path / "plexmq.toml"
    config.write_text(text)
    return start_broker("--workers", "1", "--config", str(config))


def test_message_rate_holds_a_publisher_to_it_and_loses_nothing(tmp_path: Path,
                                                               start_broker: Callable[..., Broker]) -> None:
    b = limited(tmp_path, start_broker, "client_message_rate = 200.0\n")
    # the bucket holds 200; the other 400 come at 200/s, so about 2 s
    assert burst_takes(b, 600, b"m") >= 1.5
    assert burst_takes(b, 300, b"q", qos=1) >= 0.3  # QoS 1: acknowledged in order, all of them


def test_byte_rate_holds_a_publisher_to_it(tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    b = limited(tmp_path, start_broker, "client_byte_rate = 20000.0\n")
    # 60 packets of ~1 KB: the bucket holds 20 KB, the other ~40 KB come at 20 KB/s
    assert burst_takes(b, 60, b"x" * 1000) >= 1.5


def test_without_limits_a_burst_is_not_slowed(start_broker: Callable[..., Broker]) -> None:
    """The same burst with the defaults: the limits above are what slowed it."""
    b = start_broker("--workers", "1")
    assert burst_takes(b, 600, b"m") < 1.5


def test_rate_limit_action_disconnect_closes_a_client_over_its_rate_with_0x97(
        tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    config = tmp_path / "plexmq.toml"
    config.write_text('client_message_rate = 5.0\nrate_limit_action = "disconnect"\n')
    b = start_broker("--workers", "1", "--config", str(config))
    within = RawClient(b.port)  # 5 in one read: what the bucket holds
    within.connect5(f"rate-ok-{uid()}", properties={P.REQUEST_PROBLEM_INFORMATION: 0})
    within.send(b"".join(v5.encode_publish(b"rate/ok", b"x", 1, packet_id=n) for n in range(1, 6)))
    # each taken (0x10: nobody subscribes)
    assert [within.recv() for _ in range(5)] == [(0x40, n.to_bytes(2, "big") + b"\x10") for n in range(1, 6)]
    over = RawClient(b.port)  # 20 at once: far beyond it
    over.connect5(f"rate-over-{uid()}")
    over.send(b"".join(v5.encode_publish(b"rate/over", b"x", 0) for _ in range(20)))
    data = over.read_until_closed()
    found = v5.frame(data, 0, len(data) + 1)
    assert found is not None and found[0] == 0xE0, data
    assert v5.decode_reason_only(v5.DISCONNECT, 0, data[found[1]:found[2]])[0] == 0x97
    within.send(p.PINGREQ_PACKET)  # the other client is still served
    assert within.recv() == (0xD0, b"")
    within.close()


def test_a_tenants_message_rate_slows_its_publisher_and_not_another_tenants_on_the_same_worker(
        tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    """Tenant `noisy` may publish 50 a second (its bucket holds 50); `quiet` has no limit. Both flood the
    one worker with the same burst: by the time quiet's subscriber has all of it, noisy's has at most
    what its rate let through."""
    b = limited(tmp_path, start_broker, 'tenant_separator = "@"\n[tenants.noisy]\nmessage_rate = 50.0\n[tenants.quiet]\n')
    count, topic = 2000, f"flood/{uid()}"
    subs = {name: Client(b.port, f"sub-{uid()}", username=f"s@{name}") for name in ("noisy", "quiet")}
    pubs = {name: RawClient(b.port) for name in subs}
    for name in subs:
        subs[name].subscribe(topic)
        assert pubs[name].connect(f"pub-{uid()}", username=f"p@{name}") == (False, 0)
    burst = b"".join(p.encode_publish(topic.encode(), b"%06d" % i) for i in range(count))
    started = time.monotonic()
    pubs["noisy"].send(burst)
    pubs["quiet"].send(burst)
    assert [subs["quiet"].get().payload for _ in range(count)] == [b"%06d" % i for i in range(count)]
    elapsed = time.monotonic() - started
    assert 0 < subs["noisy"].messages.qsize() <= 50 * elapsed + 50
    for name in subs:
        pubs[name].close()
        subs[name].disconnect()


def test_a_tenant_held_at_its_message_rate_is_read_once_per_batch(tmp_path: Path,
                                                                  start_broker: Callable[..., Broker]) -> None:
    """Tenant `slow` may publish 400 a second (its bucket holds 400): of 1,200 QoS 1 PUBLISHes in one
    write, 800 wait. Its publisher is paused until the bucket holds a batch (workers/tenant_limits.py
    `pause`), and each pause is one limit hit: far fewer hits than packets that waited (one wake-up,
    one hit and one router batch per packet before), and every message still arrives, in order, each
    acknowledged in order."""
    b = limited(tmp_path, start_broker, 'tenant_separator = "@"\n[tenants.slow]\nmessage_rate = 400.0\n')
    url = metrics_url(b)
    count = 1200
    burst_takes(b, count, b"m", qos=1, tenant="slow")  # asserts the order and the acknowledgements
    # the report that has both clients gone was made after the last pause
    wait_for(lambda: scrape(url).get(("plexmq_tenant_connections", (("tenant", "slow"),))) == 0, 10,
             "the tenant's clients gone in the workers' report")
    hits = scrape(url).get(("plexmq_tenant_limit_hits_total", (("limit", "message_rate"), ("tenant", "slow"))), 0)
    assert 0 < hits <= count // 10
