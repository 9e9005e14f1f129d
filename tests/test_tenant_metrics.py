"""Each tenant's numbers on the real broker (issue 23): its `plexmq_tenant_*` series after known traffic
(two workers' tallies summed with the router's figures), none with `metrics_tenants = false`, its own
`$SYS` set in its own partition (the default tenant keeps the broker's), and `plexmq clients` and
`plexmq status` for one tenant."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from plexmq import wire
from plexmq.acceptor.status import Samples, scrape
from plexmq.mqtt import PROTOCOLS
from plexmq.router.ops.stats import TENANT_SYS, Stats
from plexmq.workers.counters import Counters
from tests.cli import cli, metrics_url, run, write
from tests.conftest import Broker, wait_for
from tests.mqtt import Client, RawClient
from tests.router_harness import Deliver, DeliverRaw, RouterHarness
from tests.test_router_tenants import connected

TENANTS = """tenant_separator = "@"
sys_interval = 1

[tenants.a]

[tenants.b]

[tenants.off]
enabled = false
"""


def tenant_values(samples: Samples, tenant: str) -> dict[str, float]:
    """The tenant's series, by name (a labelled one as name{label=value})."""
    found = {}
    for (name, labels), value in samples.items():
        named = dict(labels)
        if name.startswith("plexmq_tenant_") and named.pop("tenant") == tenant:
            found[name + "".join(f"{{{k}={v}}}" for k, v in named.items())] = value
    return found


def test_each_tenant_has_its_own_series_and_listing(tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    b = start_broker("--config", str(write(tmp_path, TENANTS)), "--workers", "2")
    url = metrics_url(b)
    sub, pub = Client(b.port, "sub", username="sub@a"), Client(b.port, "pub", username="pub@a")
    other = Client(b.port, "pub", username="pub@b")  # the same client id, in another tenant
    sub.subscribe("t/x", 1)
    for i in range(5):
        pub.publish("t/x", b"%d" % i, qos=1)
    for i in range(3):
        pub.publish("t/x", b"raw %d" % i)  # QoS 0: the raw path
    pub.publish("t/kept", b"r", qos=1, retain=True)
    for _ in range(8):
        sub.get()
    for i in range(2):
        other.publish("t/x", b"%d" % i, qos=1)  # nobody of b's subscribes to it
    refused = RawClient(b.port)
    assert refused.connect("x", username="x@off") == (False, 0x03)
    refused.read_until_closed()

    expected = {
        "a": {"plexmq_tenant_connections": 2, "plexmq_tenant_sessions": 2, "plexmq_tenant_subscriptions": 1,
              "plexmq_tenant_retained_messages": 1, "plexmq_tenant_messages_received_total": 9,
              "plexmq_tenant_messages_sent_total": 8, "plexmq_tenant_dropped_total": 0},
        "b": {"plexmq_tenant_connections": 1, "plexmq_tenant_sessions": 1, "plexmq_tenant_subscriptions": 0,
              "plexmq_tenant_retained_messages": 0, "plexmq_tenant_messages_received_total": 2,
              "plexmq_tenant_messages_sent_total": 0},
        "off": {"plexmq_tenant_connections": 0, "plexmq_tenant_refused_total{reason=server_unavailable}": 1},
    }
    seen: dict[str, dict[str, float]] = {}

    def counted() -> bool:
        samples = scrape(url)
        seen.update({tenant: tenant_values(samples, tenant) for tenant in expected})
        return all(seen[t].get(name) == value for t, wanted in expected.items() for name, value in wanted.items())

    try:
        wait_for(counted, 15, "each tenant's series to count its traffic")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {seen}") from None
    a, b_ = seen["a"], seen["b"]
    # bytes: a's publisher wrote 9 PUBLISHes (> 9 * 5 bytes) and its subscriber read 8; b's got only acks
    assert a["plexmq_tenant_bytes_received_total"] > 9 * 5 and a["plexmq_tenant_bytes_sent_total"] > 8 * 5
    assert b_["plexmq_tenant_bytes_sent_total"] < a["plexmq_tenant_bytes_sent_total"]
    assert a["plexmq_tenant_bytes_received_total"] > b_["plexmq_tenant_bytes_received_total"] > 0

    def rows(*args: str) -> list[list[str]]:
        return [row.split() for row in cli("clients", url, *args).splitlines()[1:-1]]

    assert sorted((row[0], row[-1]) for row in rows("--tenant", "a")) == [("pub", "a"), ("sub", "a")]
    assert sorted((row[0], row[-1]) for row in rows()) == [("pub", "a"), ("pub", "b"), ("sub", "a")]
    assert rows("--tenant", "") == []  # the default tenant has no client
    status = cli("status", url, "--once", "--tenant", "a")
    assert status.splitlines()[:3] == ["tenant a",
                                       "clients 2   sessions 2   subscriptions 1   retained 1   queued 0",
                                       "messages in 9   out 8"]
    assert "refused: server_unavailable: 1" in cli("status", url, "--once", "--tenant", "off")
    nope = run("status", "--metrics", url, "--once", "--tenant", "nope")
    assert (nope.returncode, nope.stderr.strip()) == (
        1, "plexmq status: no figures of tenant 'nope' (no such tenant, or metrics_tenants = false)")
    for client in (sub, pub, other):
        client.disconnect()


def test_metrics_tenants_false_serves_no_tenant_series(tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    b = start_broker("--config", str(write(tmp_path, "metrics_tenants = false\n" + TENANTS)), "--workers", "1")
    url = metrics_url(b)
    client = Client(b.port, "c", username="c@a")
    client.publish("t", b"x", qos=1)
    def counted() -> Samples | None:
        samples = scrape(url)
        return samples if samples.get(("plexmq_messages_received_total", ())) == 1 else None

    assert [name for name, _ in wait_for(counted, 10, "the message counted") if name.startswith("plexmq_tenant_")] == []
    client.disconnect()


def test_a_tenants_sys_topics_are_its_own(tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    b = start_broker("--config", str(write(tmp_path, TENANTS)), "--workers", "2")
    watcher = Client(b.port, "w", username="w@a")
    watcher.subscribe("$SYS/#")
    others = [Client(b.port, "c", username="c@a"), Client(b.port, "x", username="x@b"), Client(b.port, "y", username="y@b")]
    broad = Client(b.port, "broad")  # the default tenant's watcher: the broker's figures
    broad.subscribe("$SYS/broker/clients/connected")
    mine: dict[str, str] = {}
    theirs: dict[str, str] = {}

    def latest(client: Client, seen: dict[str, str]) -> dict[str, str]:
        while not client.messages.empty():
            msg = client.get()
            seen[msg.topic] = msg.payload.decode()
        return seen

    def settled() -> bool:
        latest(watcher, mine)
        return mine.get("$SYS/broker/clients/connected") == "2" and "$SYS/broker/subscriptions/count" in mine

    try:
        wait_for(settled, 15, "tenant a's $SYS figures")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {mine}") from None
    assert set(mine) == {f"$SYS/broker/{name}" for name in [*TENANT_SYS, "clients/total"]}  # none of the broker's
    assert mine["$SYS/broker/subscriptions/count"] == "1"  # its own watcher's only
    wait_for(lambda: latest(broad, theirs).get("$SYS/broker/clients/connected") == "5", 15, "the broker's 5 clients")
    # b has no $SYS subscriber: nothing is published into it (not even retained)
    url = metrics_url(b)
    assert scrape(url)[("plexmq_tenant_retained_messages", (("tenant", "b"),))] == 0
    for client in (watcher, broad, *others):
        client.disconnect()


def test_a_tenants_sys_figures_are_not_its_retained_messages(tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    """Tenant `small` may keep 2 retained messages. Its `$SYS/#` watcher gets the current figures at once,
    as retained messages, and each sys_interval live; they take none of its 2 (the broker's figures,
    made for each new subscriber, never kept), so its clients' 2 are kept, and a later watcher gets the
    figures at once too."""
    b = start_broker("--config", str(write(tmp_path, TENANTS + "\n[tenants.small]\nmax_retained_messages = 2\n")),
                     "--workers", "1")
    own = {f"$SYS/broker/{name}" for name in [*TENANT_SYS, "clients/total"]}
    pub = Client(b.port, "p", username="p@small")
    url = metrics_url(b)  # figures are made from the last second's: wait until they have the tenant
    wait_for(lambda: scrape(url).get(("plexmq_tenant_connections", (("tenant", "small"),))) == 1, 10, "small's figures")
    watcher = Client(b.port, "w", username="w@small")
    watcher.subscribe("$SYS/#")
    first = [watcher.get() for _ in own]  # at once: no sys_interval waited for
    assert {m.topic for m in first} == own and all(m.retain for m in first)
    wait_for(lambda: not watcher.get().retain, 10, "a round published live while watched")
    for topic in ("r/1", "r/2"):
        pub.publish(topic, b"kept", qos=1, retain=True)
    reader = Client(b.port, "r", username="r@small")
    reader.subscribe("r/#")
    assert sorted((m.topic, m.payload, m.retain) for m in (reader.get(), reader.get())) == [
        ("r/1", b"kept", True), ("r/2", b"kept", True)]
    watcher.disconnect()
    later = Client(b.port, "l", username="l@small")
    later.subscribe("$SYS/broker/clients/connected")
    m = later.get()
    assert (m.topic, m.retain) == ("$SYS/broker/clients/connected", True)
    for client in (pub, reader, later):
        client.disconnect()


def test_the_router_counts_each_tenants_messages_on_every_path() -> None:
    """Received and delivered per tenant (router/tenants.py) through the router: a raw QoS 0 run (per
    `Dest`), a QoS 1 PUB to plain subscribers, one with subscription options (`_deliver_special`) and a
    shared group (`_share`); the other tenant's counts stay as they were."""
    h = RouterHarness()
    w0, w1 = h.worker("w0"), h.worker("w1")
    connected(h, w0, 1, "plain", "a", subs=(("t", 1),))
    connected(h, w1, 2, "plain", "a", subs=(("t", 1),))
    connected(h, w1, 3, "shared", "a", subs=(("$share/g/t", 1),))
    connected(h, w0, 4, "options", "a", subs=(("t", 1 | 4),))  # no local: a subscription with options
    connected(h, w0, 5, "pub", "a")
    connected(h, w0, 6, "other", "b", subs=(("t", 1),))
    w0.pub0(5, "t", [b"x", b"y"])  # a raw run: per Dest, and each packet to the special and shared ones
    w0.pub(5, "t", b"z", qos=1, pid=1)
    h.turn()
    copies = sum(len(r.subs) * (2 if isinstance(r, DeliverRaw) else 1) for end in (w0, w1) for r in end.take()
                 if isinstance(r, (Deliver, DeliverRaw)))
    a, b = h.router.tenants["a"], h.router.tenants["b"]
    assert (a.received, a.delivered, b.received, b.delivered) == (3, copies, 0, 0)
    assert copies == h.router.delivered > 5  # every path counted (each path delivers to at least one)
    w1.pub(2, "t", b"not a's", qos=1, pid=1)  # a's plain subscriber on w1: to a's others
    connected(h, w1, 7, "pub", "b")
    w1.pub(7, "t", b"b's", qos=1, pid=1)  # b's: to b's one subscriber
    h.turn()
    assert (b.received, b.delivered) == (1, 1) and a.received == 4


def test_limit_hits_of_the_router_and_of_each_worker_are_summed_per_tenant() -> None:
    """`Counters.limit_hit` (workers) and `Tenant.limit_hits` (router) end in one series per (tenant, limit)."""
    h = RouterHarness()
    h.router.tenant("a").limit_hits["max_sessions"] += 2
    for label in ("0", "1"):
        counters = Counters()
        counters.limit_hit("a", "max_sessions")
        counters.limit_hit("a", "message_rate")
        report = wire.Stats(label, "", 1, 0, 0, 0, 0, 0, 0, 0, {}, 0, 0.0, 0, 0, 0, counters.by_tenant(), {}, [])._asdict()
        h.router.reports[label] = {**report, "protocols": dict.fromkeys(PROTOCOLS.values(), 0), "at": 0.0}
    stats = Stats(h.router, os.getpid(), declared=["b"])
    stats.refresh(0.0)
    hits = {tuple(s.labels.values()): s.value for family in stats.collect() if family.name == "plexmq_tenant_limit_hits"
            for s in family.samples}
    assert hits == {("a", "max_sessions"): 4, ("a", "message_rate"): 2}
    assert set(stats.snapshot["tenants"]) == {"", "a"}  # in use: the default, one the router holds
    shown = {s.labels["tenant"] for family in stats.collect() if family.name == "plexmq_tenant_connections"
             for s in family.samples}
    assert shown == {"", "a", "b"}  # with one declared that nothing used yet: its zeros, made at the scrape
