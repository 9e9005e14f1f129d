"""A standby router takes over (issue 24): two routers share a PostgreSQL store in a namespace of its
own, nodes list both, clients stay on their nodes (tests/standby_hosts.py).

Faults, on one set of hosts for the module (starting them costs seconds): kill -9 of the active
router's host during QoS 1 streams and with an offline session queued; its link cut (it steps down
before the standby takes the lease) and healed (it comes back as a standby, never a second active);
the database down for a while; both routers started at once (exactly one is active). Before each
test the fixture brings back what the one before killed, cut or stopped (StandbyNet.restore), and
each test uses client ids and topics of its own; the database's faults come last (a PostgreSQL
killed recovers its files for a while after it is back). Queued messages and retained
messages carry over; carried wills are tested in-process (tests/test_carried_wills.py). The only timing assertion is
the issue's failover bound, with a margin for this 2-core machine.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from plexmq.mqtt import v4 as p
from tests.conftest import wait_for
from tests.standby_hosts import LEASE, ROUTERS, StandbyNet, open_standby_net, when
from tests.steps import ping, publish, receive, subscribe, sync, uid
from tests.test_nodes import across, bye, check_all_acked_came, stream

TAKEOVER_LIMIT = LEASE + 6.0  # the goal is 5 s with a 2 s lease; bench/failover.py measures it
ACTIVE, STEPPED_DOWN = "is active", "stepping down"  # the routers' log lines


@pytest.fixture(scope="module")
def shared_net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandbyNet]:
    yield from open_standby_net(tmp_path_factory.mktemp("failover"))


@pytest.fixture
def net(shared_net: StandbyNet) -> StandbyNet:
    """The module's hosts as they were started: each test kills, cuts or restarts something, and the
    next one finds it running again."""
    shared_net.restore()
    return shared_net


def other(net: StandbyNet, name: str) -> str:
    return next(r for r in ROUTERS if r != name)


def test_exactly_one_of_two_routers_started_at_once_is_active(net: StandbyNet) -> None:
    if any(net.hosts[name].starts != 1 for name in ROUTERS):  # not the net's first routers: at once again
        net.restart_routers()
    holder, epoch = net.lease() or ("", 0)
    active, standby = net.hosts[holder], net.hosts[other(net, holder)]
    assert ACTIVE in active.since_start()
    assert ACTIVE not in standby.since_start(), standby.since_start()[-2000:]
    assert epoch >= 1
    c, d = net.host("n1").client(), net.host("n2").client()
    assert subscribe(d, 1, [("fo/one", 1)]) == [1]
    publish(c, "fo/one", b"x", 1)
    assert [m.payload for m in receive(d, count=1)] == [b"x"]
    bye(c, d)


def test_sigkill_of_the_active_routers_host_loses_no_acknowledged_message(net: StandbyNet) -> None:
    """QoS 1 streams from n1 to a persistent subscriber on n2, and an offline persistent session has
    messages queued, when the active router's whole host dies: the standby takes the lease within
    the bound, both nodes join it, the clients stay connected, every acknowledged message arrives,
    the offline session finds its queue, and the killed host comes back as a standby."""
    n = 3000
    first = net.active()
    queued_id, queued_t = f"fo-off-{uid()}", f"fo/off/{uid()}"
    off = net.host("n1").client(queued_id, clean=False)
    assert subscribe(off, 1, [(queued_t, 1)]) == [1]
    bye(off)
    queued = [b"q%d" % i for i in range(5)]
    feeder = net.host("n2").client()
    for i, payload in enumerate(queued, 1):
        publish(feeder, queued_t, payload, 1, packet_id=i)
    retained_t = f"fo/ret/{uid()}"
    publish(feeder, retained_t, b"kept", 1, retain=True, packet_id=len(queued) + 1)
    _cid, topic, reader, pub = across(net, "fo")
    epoch = (net.lease() or ("", 0))[1]
    killed_at: list[float] = []

    def kill() -> None:
        killed_at.append(time.monotonic())
        first.kill()

    acked = stream(pub, topic, n, kill_at=n // 3, kill=kill)
    holder: tuple[str, int] = wait_for(lambda: (h := net.lease()) is not None and h[1] > epoch and h or None,
                                       TAKEOVER_LIMIT, "the standby to take the lease")
    assert holder[0] == other(net, first.name)
    took = time.monotonic() - killed_at[0]
    assert took <= TAKEOVER_LIMIT, f"the takeover took {took:.1f} s"
    net.active()
    for node in ("n1", "n2"):
        net.wait_joined(node)
    assert not reader.closed, "the subscriber's connection closed"
    ping(pub)
    missing = sorted(set(range(n)) - acked)
    assert not missing, f"never acknowledged after the failover: {missing[:10]} ({len(missing)})"
    wait_for(lambda: {int(m.payload) for m in reader.pubs} >= acked, 15,
             "every acknowledged message to reach the subscriber")
    check_all_acked_came(acked, reader.stop(), sync(reader.c))
    back = net.host("n2").client(queued_id, clean=False)
    assert [m.payload for m in receive(back, payloads=queued, timeout=10)] == queued
    late = net.host("n1").client()
    assert subscribe(late, 1, [(retained_t, 1)]) == [1]
    assert [(m.payload, m.retain) for m in receive(late, count=1)] == [(b"kept", True)], "the retained message"
    bye(late)
    net.start_router_named(first.name)
    wait_for(lambda: "standby" in first.since_start(), 10, f"{first.name} to come back as a standby")
    assert (net.lease() or ("", 0))[0] == holder[0], "the restarted router took the lease back"
    bye(back, reader.c, pub, feeder)


def test_a_cut_active_router_steps_down_before_the_standby_takes_over_and_comes_back_as_standby(net: StandbyNet) -> None:
    first = net.active()
    second = net.hosts[other(net, first.name)]
    epoch = (net.lease() or ("", 0))[1]
    first_mark, second_mark = len(first.output()), len(second.output())  # what this test's hosts log from here
    c, d = net.host("n1").client(), net.host("n2").client(f"fo-cut-{uid()}", clean=False)
    assert subscribe(d, 1, [("fo/cut", 1)]) == [1]

    first.cut()
    wait_for(lambda: (h := net.lease()) is not None and h[1] > epoch, TAKEOVER_LIMIT, "the standby to take the lease")
    net.active()
    wait_for(lambda: STEPPED_DOWN in first.output()[first_mark:], 10, f"{first.name} to step down")
    # the cut router stopped acting before the other started: by the log clocks of one machine
    assert when(first, STEPPED_DOWN, first_mark) <= when(second, ACTIVE, second_mark), \
        "the cut router acted after the standby took over"
    for node in ("n1", "n2"):
        net.wait_joined(node)
    publish(c, "fo/cut", b"after the cut", 1)
    assert [m.payload for m in receive(d, count=1, timeout=10)] == [b"after the cut"]

    first.heal()
    wait_for(lambda: "standby" in (log := first.output())[log.find(STEPPED_DOWN, first_mark):], 15,
             f"{first.name} to come back as a standby")
    assert (net.lease() or ("", 0))[0] == second.name, "two active routers"
    publish(c, "fo/cut", b"healed", 1, packet_id=2)
    assert [m.payload for m in receive(d, count=1, timeout=10)] == [b"healed"]
    bye(c, d)


def test_the_will_of_a_client_whose_node_died_with_the_router_is_published_once(net: StandbyNet) -> None:
    """n1 and the active router's host die together: the new active router has the will of n1's
    client from the store (a shared store carries the wills of live connections) and, n1 never
    joining it, publishes it once after link_timeout."""
    first = net.active()
    will_t = f"fo/will/{uid()}"
    watcher = net.host("n2").client()
    assert subscribe(watcher, 1, [(will_t, 1)]) == [1]
    dying = net.host("n1").client(f"fo-will-{uid()}", will=p.Will(will_t, b"gone", 1, False))
    # its worker wrote that CONNACK itself; a SUBACK comes from the router after the commit that follows its
    # CONNECT (a PINGREQ is answered by the worker, and the watcher's records do not order n1's)
    assert subscribe(dying, 1, [(f"fo/else/{uid()}", 0)]) == [0]
    net.host("n1").kill()
    first.kill()
    net.active(timeout=TAKEOVER_LIMIT + 10)
    net.wait_joined("n2")  # before the barrier below: a join renewed under a SUBSCRIBE closes its client
    got = receive(watcher, count=1, timeout=20)
    assert [(m.topic, m.payload) for m in got] == [(will_t, b"gone")]
    assert sync(watcher) == [], "the will was published more than once"
    bye(watcher)


@pytest.mark.parametrize("fault", ["killed", "cut off"])
def test_the_database_down_for_a_while_loses_nothing_acknowledged(net: StandbyNet, fault: str) -> None:
    """PostgreSQL killed (then started again) or cut off from the routers (then healed) mid-stream: the
    active router cannot commit and steps down, the clients stay connected and get no PUBACK meanwhile;
    once the database is back one router takes the lease and every acknowledged message arrives."""
    assert net.pg is not None
    n = 2000
    first = net.active()
    mark = len(first.output())  # what it logs from here
    _cid, topic, reader, pub = across(net, "db")
    pg_host = net.host("pg")
    down: list[float] = []

    def fail() -> None:
        assert net.pg is not None
        if fault == "killed":
            net.pg.kill()
        else:
            pg_host.cut()
        down.append(time.monotonic())

    back: list[float] = []

    def recover() -> None:
        wait_for(lambda: down, 60, "the fault")
        wait_for(lambda: STEPPED_DOWN in first.output()[mark:], 15, "the active router to step down")
        assert net.pg is not None
        if fault == "killed":
            net.pg.start()
        else:
            pg_host.heal()
        back.append(time.monotonic())

    helper = threading.Thread(target=recover, daemon=True)
    helper.start()
    acked = stream(pub, topic, n, kill_at=n // 3, kill=fail, stall=40.0)
    helper.join(30)
    assert back, "the database did not come back"
    net.active(timeout=30)
    for node in ("n1", "n2"):
        net.wait_joined(node, timeout=30)
    assert not reader.closed, "the subscriber's connection closed"
    missing = sorted(set(range(n)) - acked)
    assert not missing, f"never acknowledged: {missing[:10]} ({len(missing)})"
    wait_for(lambda: {int(m.payload) for m in reader.pubs} >= acked, 20,
             "every acknowledged message to reach the subscriber")
    check_all_acked_came(acked, reader.stop(), sync(reader.c))
    bye(reader.c, pub)
