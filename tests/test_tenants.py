"""End to end: the tenant isolation matrix of issue 23 (`issues show 23`) on the real broker
with two workers. Tenants `a` and `b` are declared, `off` is declared disabled; clients join one by
their username (`x@a`, `x@b`; `x` is the default tenant). Each feature that carries a topic, an id or
a count is checked from every tenant towards both others (so a->b, b->a, a->default, default->a ...),
for MQTT 3.1.1 and 5.0 where it exists in both: plain messages at each QoS (QoS 0 is the raw run
path) through the router and through a worker's own local delivery, `#` and `$SYS`, retained
messages, wills (a 5.0 delayed one too), sessions and client ids, shared groups, topic aliases, and
the CONNACK refusals of a connection whose tenant is unknown, disabled or missing.

Absences are read with barriers (tests/tenants.py `Peer.sync`), never a sleep. One broker serves the
module: every test leaves it as it found it (no retained message, no session left behind).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from plexmq.mqtt import properties as P
from plexmq.mqtt import v5
from plexmq.mqtt.connect import Will
from plexmq.router.ops.stats import TENANT_SYS
from tests.cli import write
from tests.conftest import Broker
from tests.mqtt import RawClient
from tests.steps import disconnect_of, from_address, uid
from tests.tenants import DEFAULT, LEVELS, OPEN, SEPARATOR, Msg, Peer, close_all, connack, join, peer, peers, shown, worker

TENANTS = ["a", "b", DEFAULT]
PROTOCOL_ERROR, SESSION_TAKEN_OVER = 0x82, 0x8E

CONFIG = f"""\
tenant_separator = "{SEPARATOR}"
sys_interval = 0.2  # $SYS often, for the test that no tenant sees another's

[tenants.a]

[tenants.b]
listeners = ["mqtt://127.0.0.1:0"]  # its port is read from the log

[tenants.off]
enabled = false
"""

STRICT = f"""\
tenant_separator = "{SEPARATOR}"
tenant_required = true

[tenants.a]
"""

SOURCES = itertools.count(2)  # 127.0.0.N: each refusal from an address of its own (a refused login may be
# answered later with each refusal from one address: workers/auth/logins.py `failed`)


def others(tenant: str) -> list[str]:
    return [t for t in TENANTS if t != tenant]


def start(tmp_path: Path, config: str) -> Broker:
    return Broker(tmp_path / "broker.log", ["--workers", "2", "--config", str(write(tmp_path, config))])


@pytest.fixture(scope="module")
def tb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """The module's broker: tenants a, b and the disabled `off`."""
    b = start(tmp_path_factory.mktemp("tenants"), CONFIG)
    assert len(b.workers()) == 2
    yield b
    b.stop()


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A broker with tenant_required: a client must name tenant a."""
    b = start(tmp_path_factory.mktemp("strict"), STRICT)
    yield b
    b.stop()


@pytest.fixture(autouse=True)
def closed() -> Iterator[None]:
    """Every client a test made is closed after it, passed or failed."""
    yield
    close_all(*OPEN)
    OPEN.clear()


def listener_port(broker: Broker, tenant: str) -> int:
    found = re.search(rf"listening on [^ ]+:(\d+) \(mqtt, tenant {tenant}\)", broker.output())
    assert found, f"no listener of tenant {tenant} in the log:\n{broker.output()}"
    return int(found.group(1))


level_ids = pytest.mark.parametrize("level", [4, 5], ids=LEVELS.get)
each_tenant = pytest.mark.parametrize("src", TENANTS, ids=shown)


def worker_ids(broker: Broker) -> list[int]:
    return sorted(broker.workers())


def forget(broker: Broker, tenant: str, level: int, client_id: str) -> None:
    """End the session of `client_id` in `tenant` (a clean connection that leaves none behind)."""
    peer(broker, tenant, level, client_id=client_id).disconnect()


def retained(broker: Broker, tenant: str, level: int, topic_filter: str) -> list[tuple[str, bytes]]:
    """The retained messages a new subscriber of `tenant` is sent at its SUBSCRIBE to `topic_filter`."""
    c = peer(broker, tenant, level)
    assert c.subscribe([(topic_filter, 1)]) == [1]
    got = c.sync()
    c.disconnect()
    assert all(m.retain for m in got), got
    return sorted((m.topic, m.payload) for m in got)


# ------------------------------------------------------------------------------- plain messages


@pytest.mark.parametrize("placement", ["cross-worker", "same-worker"])
@pytest.mark.parametrize("qos", [0, 1, 2])
@level_ids
@each_tenant
def test_a_message_reaches_its_own_tenant_only(tb: Broker, src: str, level: int, qos: int, placement: str) -> None:
    """The same topic subscribed in every tenant, and `#` in the others: only the publisher's tenant
    gets it. Same-worker: every subscriber shares the publisher's worker, where QoS 0 and 1 go by the
    worker's own local routes (which must be per tenant too); cross-worker: all go through the router."""
    topic = f"a/b/{uid()}"
    home, away = worker_ids(tb)
    there = home if placement == "same-worker" else away
    pub = peer(tb, src, level, on=home)
    strangers = peers(tb, TENANTS, level, on=there)
    own = strangers.pop(src)
    assert own.subscribe([(topic, 2)]) == [2]
    for c in strangers.values():
        assert c.subscribe([(topic, 2), ("#", 2)]) == [2, 2]
    pub.publish(topic, b"own", qos)
    if qos == 0:
        pub.fence()
    assert own.sync() == [Msg(topic, b"own", qos, False)]
    assert {t: c.sync() for t, c in strangers.items()} == {t: [] for t in strangers}
    close_all(pub, own, *strangers.values())


@pytest.mark.parametrize("placement", ["cross-worker", "same-worker"])
@level_ids
@each_tenant
def test_an_unsubscribe_in_other_tenants_leaves_the_subscription_of_one(tb: Broker, src: str, level: int,
                                                                        placement: str) -> None:
    """The same filter subscribed in every tenant, then unsubscribed in all but `src`: a message of
    each tenant reaches `src`'s subscriber when it is `src`'s, and nobody else."""
    topic = f"unsub/{uid()}"
    home, away = worker_ids(tb)
    there = home if placement == "same-worker" else away
    subs = peers(tb, TENANTS, level, on=there)
    for c in subs.values():
        assert c.subscribe([(topic, 1)]) == [1]
    for t in others(src):
        subs[t].unsubscribe([topic])
    for t, c in peers(tb, TENANTS, level, on=home).items():
        c.publish(topic, f"of {shown(t)}".encode(), 1)
    assert {t: c.sync() for t, c in subs.items()} == {
        t: [Msg(topic, f"of {shown(src)}".encode(), 1, False)] if t == src else [] for t in TENANTS}


@level_ids
def test_a_hash_subscriber_sees_its_tenant_only_and_no_sys(tb: Broker, level: int) -> None:
    """`#` in each tenant gets exactly its tenant's message; `$SYS` (refreshed every 0.2 s) reaches no
    `#`; the broker's set reaches the default tenant's `$SYS/#`, each other tenant's `$SYS/#` gets only
    its own set (router/ops/stats.py `TENANT_SYS`), never the broker's."""
    hashes = {t: peer(tb, t, level) for t in TENANTS}
    watchers = {t: peer(tb, t, level) for t in TENANTS}
    for t in TENANTS:
        assert hashes[t].subscribe([("#", 1)]) == [1]
        assert watchers[t].subscribe([("$SYS/#", 0)]) == [0]
    # the default tenant's $SYS: what it had retained, then a fresh round (retain 0) after the
    # tenants subscribed; a barrier on the others afterwards shows they got none of it (their own only)
    while (m := watchers[DEFAULT].next()).retain:
        assert m.topic.startswith("$SYS/")
    assert m.topic.startswith("$SYS/")
    topics = {t: f"hash/{shown(t)}/{uid()}" for t in TENANTS}
    for t in TENANTS:
        c = peer(tb, t, level)
        c.publish(topics[t], shown(t).encode(), 1)
        c.close()
    got = {t: hashes[t].sync() for t in TENANTS}
    assert got == {t: [Msg(topics[t], shown(t).encode(), 1, False)] for t in TENANTS}
    own = {f"$SYS/broker/{name}" for name in [*TENANT_SYS, "clients/total"]}
    for t in ("a", "b"):
        sent = {m.topic for m in watchers[t].sync()}
        assert sent <= own, f"{shown(t)}'s $SYS/# was sent {sent - own}"
    close_all(*hashes.values(), *watchers.values())


# ------------------------------------------------------------------------------------- retained


@level_ids
@each_tenant
def test_a_retained_message_stays_in_its_tenant(tb: Broker, src: str, level: int) -> None:
    """Set in `src`: not sent at the others' SUBSCRIBE (to the topic or `#`); the others' own retained
    message on the same topic, and its clearing, leave `src`'s as it was."""
    topic = f"ret/{uid()}"
    setters = {t: peer(tb, t, level) for t in TENANTS}
    try:
        setters[src].publish(topic, b"kept", 1, retain=True)
        for t in others(src):
            assert retained(tb, t, level, topic) == [], f"{shown(t)} was sent {shown(src)}'s retained message"
            assert retained(tb, t, level, "#") == [], f"{shown(t)}'s # was sent {shown(src)}'s retained message"
        assert retained(tb, src, level, topic) == [(topic, b"kept")]
        for t in others(src):  # each other tenant retains its own on the same topic
            setters[t].publish(topic, f"of {shown(t)}".encode(), 1, retain=True)
        assert {t: retained(tb, t, level, topic) for t in TENANTS} == {
            t: [(topic, b"kept" if t == src else f"of {shown(t)}".encode())] for t in TENANTS}
        for t in others(src):  # and clears it
            setters[t].publish(topic, b"", 1, retain=True)
        assert {t: retained(tb, t, level, topic) for t in TENANTS} == {
            t: [(topic, b"kept")] if t == src else [] for t in TENANTS}
    finally:
        for t in TENANTS:
            setters[t].publish(topic, b"", 1, retain=True, packet_id=2)
        close_all(*setters.values())
    assert retained(tb, src, level, topic) == []


# ---------------------------------------------------------------------------------------- wills


@level_ids
@each_tenant
def test_a_will_reaches_its_own_tenant_only(tb: Broker, src: str, level: int) -> None:
    topic = f"will/{uid()}"
    home, away = worker_ids(tb)
    dying = peer(tb, src, level, on=home, will=Will(topic, b"gone", 1, False))
    strangers = peers(tb, TENANTS, level, on=away)
    own = strangers.pop(src)
    assert own.subscribe([(topic, 1)]) == [1]
    for c in strangers.values():
        assert c.subscribe([(topic, 1), ("#", 1)]) == [1, 1]
    dying.close()  # no DISCONNECT: the will goes
    assert own.next() == Msg(topic, b"gone", 1, False)
    assert {t: c.sync() for t, c in strangers.items()} == {t: [] for t in strangers}
    close_all(own, *strangers.values())


@level_ids
@each_tenant
def test_a_retained_will_is_retained_in_its_tenant_only(tb: Broker, src: str, level: int) -> None:
    topic = f"will/retained/{uid()}"
    dying = peer(tb, src, level, will=Will(topic, b"gone", 1, True))
    watcher = peer(tb, src, level)
    assert watcher.subscribe([(topic, 1)]) == [1]
    dying.close()
    assert watcher.next() == Msg(topic, b"gone", 1, False)
    try:
        assert {t: retained(tb, t, level, topic) for t in TENANTS} == {
            t: [(topic, b"gone")] if t == src else [] for t in TENANTS}
    finally:
        peer(tb, src, level).publish(topic, b"", 1, retain=True)


def test_delayed_wills_of_one_client_id_in_each_tenant_reach_their_own_tenant_only(tb: Broker) -> None:
    """5.0: the same client id with a delayed will (1 s) in each tenant, all connected at once (none
    takes another over), all dropped: each tenant's subscriber gets its own tenant's will, once."""
    cid, topic = f"dw-{uid()}", f"will/delayed/{uid()}"
    watchers = {t: peer(tb, t, 5) for t in TENANTS}
    for c in watchers.values():
        assert c.subscribe([(topic, 1)]) == [1]
    dying = {t: peer(tb, t, 5, client_id=cid, properties={P.SESSION_EXPIRY_INTERVAL: 5},
                     will=Will(topic, f"{shown(t)} gone".encode(), 1, False, {P.WILL_DELAY_INTERVAL: 1}))
             for t in TENANTS}
    for c in dying.values():
        c.ping()  # still connected: no DISCONNECT 0x8E came first
    for c in dying.values():
        c.close()
    assert {t: c.next() for t, c in watchers.items()} == {t: Msg(topic, f"{shown(t)} gone".encode(), 1, False)
                                                          for t in TENANTS}
    assert {t: c.sync() for t, c in watchers.items()} == {t: [] for t in TENANTS}
    close_all(*watchers.values())
    for t in TENANTS:
        forget(tb, t, 5, cid)


# ------------------------------------------------------------------------------------- sessions


def persistent(level: int) -> dict:
    """What makes a session outlive its connection: 3.1.1 clean session 0, 5.0 also a session expiry."""
    return {"clean": False, "properties": {P.SESSION_EXPIRY_INTERVAL: 600} if level == 5 else None}


@level_ids
@each_tenant
def test_the_same_client_id_in_another_tenant_is_another_session(tb: Broker, src: str, level: int) -> None:
    """A live persistent session in `src`; the same id connecting (persistent too, from the other
    worker) in each other tenant finds no session there and takes nothing over."""
    cid, topic = f"same-{uid()}", f"sess/{uid()}"
    home, away = worker_ids(tb)
    first = peer(tb, src, level, on=home, client_id=cid, **persistent(level))
    assert first.subscribe([(topic, 1)]) == [1]
    seconds = {t: peer(tb, t, level, on=away, client_id=cid, **persistent(level)) for t in others(src)}
    assert {t: c.present for t, c in seconds.items()} == {t: False for t in seconds}
    pub = peer(tb, src, level)
    pub.publish(topic, b"still here", 1)
    assert first.sync() == [Msg(topic, b"still here", 1, False)]  # open, subscribed, and no DISCONNECT
    assert {t: c.sync() for t, c in seconds.items()} == {t: [] for t in seconds}
    pub.close()
    for t, c in [(src, first), *seconds.items()]:
        c.disconnect()
        forget(tb, t, level, cid)


@level_ids
@each_tenant
def test_a_queued_session_outlives_its_client_id_connecting_clean_in_another_tenant(tb: Broker, src: str,
                                                                                    level: int) -> None:
    cid, topic = f"queue-{uid()}", f"sess/q/{uid()}"
    kept = peer(tb, src, level, client_id=cid, **persistent(level))
    assert kept.subscribe([(topic, 1)]) == [1]
    kept.disconnect()
    pub = peer(tb, src, level)
    pub.publish(topic, b"queued", 1)
    pub.close()
    for t in others(src):
        clean = peer(tb, t, level, client_id=cid)  # clean: would discard the session, were it the same
        assert not clean.present
        assert clean.sync() == []
        clean.disconnect()
    back = peer(tb, src, level, client_id=cid, **persistent(level))
    assert back.present
    assert back.sync() == [Msg(topic, b"queued", 1, False)]
    back.disconnect()
    forget(tb, src, level, cid)


@level_ids
@each_tenant
def test_offline_sessions_of_one_client_id_queue_their_own_tenants_messages_only(tb: Broker, src: str,
                                                                                 level: int) -> None:
    """The same client id has an offline persistent session in every tenant, subscribed to one topic
    (and `#` outside `src`); `src` publishes: only `src`'s session has it when each comes back."""
    cid, topic = f"offline-{uid()}", f"sess/off/{uid()}"
    for t in TENANTS:
        c = peer(tb, t, level, client_id=cid, **persistent(level))
        assert c.subscribe([(topic, 1), *([("#", 1)] if t != src else [])]) == [1] * (1 if t == src else 2)
        c.disconnect()
    peer(tb, src, level).publish(topic, b"while away", 1)
    back = {t: peer(tb, t, level, client_id=cid, **persistent(level)) for t in TENANTS}
    assert {t: c.present for t, c in back.items()} == {t: True for t in TENANTS}
    assert {t: c.sync() for t, c in back.items()} == {
        t: [Msg(topic, b"while away", 1, False)] if t == src else [] for t in TENANTS}
    for t, c in back.items():
        c.disconnect()
        forget(tb, t, level, cid)


@level_ids
@pytest.mark.parametrize("tenant", TENANTS, ids=shown)
def test_takeover_still_works_within_a_tenant(tb: Broker, tenant: str, level: int) -> None:
    cid, topic = f"take-{uid()}", f"sess/take/{uid()}"
    home, away = worker_ids(tb)
    old = peer(tb, tenant, level, on=home, client_id=cid, **persistent(level))
    assert old.subscribe([(topic, 1)]) == [1]
    new = peer(tb, tenant, level, on=away, client_id=cid, **persistent(level))
    assert new.present
    if level == 5:
        assert disconnect_of(old.raw)[0] == SESSION_TAKEN_OVER
    else:
        old.raw.read_until_closed()
    old.close()
    pub = peer(tb, tenant, level)
    pub.publish(topic, b"to new", 1)
    assert new.sync() == [Msg(topic, b"to new", 1, False)]  # the session, subscription and all
    pub.close()
    new.disconnect()
    forget(tb, tenant, level, cid)


# ---------------------------------------------------------------------------- shared subscriptions


@level_ids
@each_tenant
def test_shared_groups_are_per_tenant(tb: Broker, src: str, level: int) -> None:
    """One member of `$share/g/...` in each tenant, on both workers: were the groups one, `src`'s
    messages would be spread over all three members."""
    base = f"shared/{uid()}"
    share = f"$share/g/{base}"
    ids = worker_ids(tb)
    members = {t: peer(tb, t, level, on=ids[n % 2]) for n, t in enumerate(TENANTS)}
    for c in members.values():
        assert c.subscribe([(share, 1)]) == [1]
    pub = peer(tb, src, level)
    for n in range(4):
        pub.publish(base, f"m{n}".encode(), 1, packet_id=n + 1)
    assert members[src].sync() == [Msg(base, f"m{n}".encode(), 1, False) for n in range(4)]
    assert {t: members[t].sync() for t in others(src)} == {t: [] for t in others(src)}
    close_all(pub, *members.values())


# --------------------------------------------------------------------------------- topic aliases


def test_a_topic_alias_set_in_one_tenant_means_nothing_in_another(tb: Broker) -> None:
    """5.0: a's client sets alias 1; b's client on the same worker using alias 1 unset is a protocol
    error (aliases are per connection), and nothing reaches b or the default tenant."""
    topic = f"alias/{uid()}"
    subs = {t: peer(tb, t, 5) for t in TENANTS}
    for c in subs.values():
        assert c.subscribe([(topic, 1)]) == [1]
    setter = peer(tb, "a", 5)
    setter.publish(topic, b"named", 1, properties={P.TOPIC_ALIAS: 1})
    setter.publish("", b"by alias", 1, packet_id=2, properties={P.TOPIC_ALIAS: 1})
    assert subs["a"].sync() == [Msg(topic, b"named", 1, False), Msg(topic, b"by alias", 1, False)]
    other = peer(tb, "b", 5, on=worker(tb, setter))
    other.send(v5.encode_publish(b"", b"stolen", 1, packet_id=3, properties={P.TOPIC_ALIAS: 1}))
    assert disconnect_of(other.raw)[0] == PROTOCOL_ERROR
    assert {t: subs[t].sync() for t in ("b", DEFAULT)} == {"b": [], DEFAULT: []}
    close_all(setter, other, *subs.values())


# ------------------------------------------------------------------------------ finding the tenant


def test_the_last_separator_names_the_tenant(tb: Broker) -> None:
    """`d@zz@a` is in tenant a (the name before the last separator is the tenant-local username);
    `d@a@zz` names the undeclared zz and is refused."""
    topic = f"split/{uid()}"
    sub = peer(tb, "a", 4)
    assert sub.subscribe([(topic, 1)]) == [1]
    raw = RawClient(tb.port)
    present, code = connack(raw, 4, f"split-{uid()}", "d@zz@a")
    assert code == 0
    Peer(raw, 4, "a", "", present).publish(topic, b"from d@zz@a", 1)
    assert sub.sync() == [Msg(topic, b"from d@zz@a", 1, False)]
    refused = from_address(tb.port, f"127.0.0.{next(SOURCES)}")
    assert connack(refused, 4, f"split-{uid()}", "d@a@zz") == (False, 0x04)
    close_all(sub)
    raw.close()
    refused.close()


REFUSALS = {"unknown": ("x@zz", 0x04, 0x86), "disabled": ("x@off", 0x03, 0x88)}


@level_ids
@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_connection_to_an_unknown_or_disabled_tenant_is_refused(tb: Broker, case: str, level: int) -> None:
    username, code311, code5 = REFUSALS[case]
    raw = from_address(tb.port, f"127.0.0.{next(SOURCES)}")
    assert connack(raw, level, f"refused-{uid()}", username) == (False, code5 if level == 5 else code311)
    raw.read_until_closed()
    raw.close()


@level_ids
@pytest.mark.parametrize("username", ["x", None], ids=["no-suffix", "no-username"])
def test_tenant_required_refuses_a_client_that_names_none(strict: Broker, username: str | None, level: int) -> None:
    raw = from_address(strict.port, f"127.0.0.{next(SOURCES)}")
    assert connack(raw, level, f"required-{uid()}", username) == (False, 0x87 if level == 5 else 0x05)
    raw.read_until_closed()
    raw.close()
    accepted = join(RawClient(strict.port), "a", level)  # and one that names a tenant is let in
    accepted.disconnect()


def test_users_without_a_suffix_are_in_the_default_tenant(tb: Broker) -> None:
    """Without tenant_required, `x` and no username at all are both the default tenant."""
    topic = f"default/{uid()}"
    sub = peer(tb, DEFAULT, 4)
    assert sub.subscribe([(topic, 1)]) == [1]
    anonymous = RawClient(tb.port)
    assert connack(anonymous, 4, f"anon-{uid()}", None) == (False, 0)
    Peer(anonymous, 4, DEFAULT, "", False).publish(topic, b"anonymous", 1)
    assert sub.sync() == [Msg(topic, b"anonymous", 1, False)]
    close_all(sub)
    anonymous.close()



# ------------------------------------------------------------------------------ a tenant's listener


@level_ids
@pytest.mark.parametrize("username", [None, "x", "x@b"], ids=["no-username", "no-suffix", "own-suffix"])
def test_a_client_on_a_tenants_listener_is_in_that_tenant(tb: Broker, username: str | None, level: int) -> None:
    """Tenant b owns a listener: a client there is in b whatever (else) its username says; it meets
    b's clients of the broker's own port, and neither a's nor the default tenant's."""
    topic = f"listener/{uid()}"
    subs = {t: peer(tb, t, level) for t in TENANTS}
    for t, c in subs.items():
        assert c.subscribe([(topic, 1), *([("#", 1)] if t != "b" else [])]) == [1] * (1 if t == "b" else 2)
    raw = RawClient(listener_port(tb, "b"))
    cid = f"listener-{uid()}"
    present, code = connack(raw, level, cid, username)
    assert code == 0
    there = Peer(raw, level, "b", cid, present)
    there.publish(topic, b"via the listener", 1)
    assert subs["b"].sync() == [Msg(topic, b"via the listener", 1, False)]
    assert {t: subs[t].sync() for t in ("a", DEFAULT)} == {"a": [], DEFAULT: []}
    assert there.subscribe([(topic, 1)]) == [1]
    for t in TENANTS:
        peer(tb, t, level).publish(topic, f"from {shown(t)}".encode(), 1)
    assert there.sync() == [Msg(topic, b"from b", 1, False)]


@level_ids
def test_a_suffix_naming_another_tenant_on_a_tenants_listener_is_refused(tb: Broker, level: int) -> None:
    raw = from_address(listener_port(tb, "b"), f"127.0.0.{next(SOURCES)}")
    assert connack(raw, level, f"listener-{uid()}", "x@a") == (False, 0x86 if level == 5 else 0x04)
    raw.read_until_closed()
    raw.close()
