"""The operators' alarms (issue 25, router/ops/alarms.py): in process, the rules over hand-made snapshots of
`Stats` (drops raised with their sources and cleared after a quiet spell, counters a restarted worker
starts again, a burst of failed logins, a node lost and back, a restart held a while, the tenants'
own, the last cleared kept, the /metrics gauge); end to end, each alarm in the overview's event stream
of a real broker: a subscriber that does not acknowledge overflows its queue, six wrong passwords, a
worker killed with SIGKILL."""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from plexmq.acceptor.status import scrape
from plexmq.mqtt.v4 import encode_connect
from plexmq.router.ops.alarms import (
    BURST,
    DROPPED,
    HOLD,
    KEEP,
    LOGINS,
    NAMED,
    NODE_LOST,
    QUIET,
    RESTARTED,
    WINDOW,
    Alarms,
    metric,
)
from plexmq.workers.auth.passwords import set_password
from tests.cli import CHEAP, metrics_url
from tests.conftest import Broker, wait_for
from tests.console import console_broker, event_until, log_in_from, session
from tests.mqtt import RawClient
from tests.steps import connect, publish, subscribe, uid

T0 = 1_700_000_000.0


def worker(pid: int, dropped: int = 0, auth_failures: int = 0) -> dict:
    return {"pid": pid, "node": "", "clients": 0, "dropped": dropped, "auth_failures": auth_failures}


def snap(at: float, workers: dict[str, dict] | None = None, routed: int = 0, tenants: dict[str, dict] | None = None,
         nodes: dict[str, dict] | None = None) -> dict:
    """The part of a `Stats` snapshot the alarms read."""
    return {"at": at, "workers": workers or {"0": worker(100)}, "routed_dropped": routed, "tenants": tenants or {},
            "nodes": nodes or {}}


def tenant(dropped: int = 0, bad_logins: int = 0) -> dict:
    return {"dropped": dropped, "refused": Counter({"bad_user_name_or_password": bad_logins})}


def raised(shown: dict, whose: str | None = None) -> list[dict]:
    return [alarm for alarm in shown.get(whose, []) if alarm["cleared"] is None]


def test_drops_raise_an_alarm_that_names_where_and_clears_after_a_quiet_spell() -> None:
    alarms = Alarms()
    assert alarms.check(snap(T0, {"0": worker(100, dropped=7), "1": worker(101)})) == {}  # first seen: no rise
    shown = alarms.check(snap(T0 + 1, {"0": worker(100, dropped=10), "1": worker(101)}, routed=2))
    [alarm] = raised(shown)
    assert (alarm["name"], alarm["raised"], alarm["tenant"]) == (DROPPED, T0 + 1, None)
    assert "5 since raised: worker 0: 3, the router's session queues: 2" in alarm["details"]
    shown = alarms.check(snap(T0 + 2, {"0": worker(100, dropped=10), "1": worker(101, dropped=4)}, routed=2))
    assert "9 since raised: worker 0: 3, the router's session queues: 2, worker 1: 4" in raised(shown)[0]["details"]
    quiet = {"0": worker(100, dropped=10), "1": worker(101, dropped=4)}
    assert len(raised(alarms.check(snap(T0 + 2 + QUIET, quiet, routed=2)))) == 1  # not yet: QUIET has to pass
    [cleared] = alarms.check(snap(T0 + 3 + QUIET, quiet, routed=2))[None]
    assert (cleared["name"], cleared["raised"], cleared["cleared"]) == (DROPPED, T0 + 1, T0 + 3 + QUIET)


def test_a_restarted_worker_counts_from_zero_and_raises_its_own_alarm_for_a_while() -> None:
    alarms = Alarms()
    alarms.check(snap(T0, {"0": worker(100, dropped=50, auth_failures=9)}))
    shown = alarms.check(snap(T0 + 1, {"0": worker(200, dropped=2)}))  # a new process: its counters start again
    [restart, drops] = sorted(raised(shown), key=lambda a: a["name"] != RESTARTED)
    assert restart["name"] == RESTARTED and restart["subject"] == "0" and "process 100 ended; 200" in restart["details"]
    assert drops["name"] == DROPPED and drops["details"].startswith("2 since raised: worker 0: 2")
    alarms.check(snap(T0 + 1 + HOLD, {"0": worker(200, dropped=2)}))
    assert [a["name"] for a in raised(alarms.check(snap(T0 + 1 + HOLD, {"0": worker(200, dropped=2)})))] == [RESTARTED]
    shown = alarms.check(snap(T0 + 2 + HOLD, {"0": worker(200, dropped=2)}))
    assert raised(shown) == [] and {a["name"] for a in shown[None]} == {RESTARTED, DROPPED}


def test_more_than_a_burst_of_failed_logins_within_the_window_raises_and_clears_as_the_window_moves_on() -> None:
    alarms = Alarms()
    alarms.check(snap(T0, {"0": worker(100), "1": worker(101)}))
    assert alarms.check(snap(T0 + 1, {"0": worker(100, auth_failures=BURST), "1": worker(101)})) == {}
    shown = alarms.check(snap(T0 + 2, {"0": worker(100, auth_failures=BURST), "1": worker(101, auth_failures=1)}))
    [alarm] = raised(shown)
    assert alarm["name"] == LOGINS and alarm["details"] == f"{BURST + 1} in the last {WINDOW:g} s: worker 0: {BURST}, worker 1: 1"
    same = {"0": worker(100, auth_failures=BURST), "1": worker(101, auth_failures=1)}
    assert raised(alarms.check(snap(T0 + 1 + WINDOW, same)))  # the first ones are WINDOW old: still counted
    assert raised(alarms.check(snap(T0 + 1.5 + WINDOW, same))) == []


def test_failed_console_logins_count_with_the_mqtt_ones_by_address_and_in_their_tenants_own() -> None:
    alarms = Alarms()
    alarms.check(snap(T0, {"0": worker(100)}, tenants={"acme": tenant()}))
    for _ in range(3):
        alarms.console_login_failed(None, "10.0.0.1")  # any thread: counted at the next check
        alarms.console_login_failed("acme", "10.0.0.2")
        alarms.console_login_failed("acme", "10.0.0.2")
    shown = alarms.check(snap(T0 + 1, {"0": worker(100, auth_failures=1)}, tenants={"acme": tenant(bad_logins=1)}))
    [broker] = raised(shown)
    assert broker["details"] == f"10 in the last {WINDOW:g} s: the console from 10.0.0.2: 6, the console from " \
                                "10.0.0.1: 3, worker 0: 1"  # the most first
    [theirs] = raised(shown, "acme")  # acme's own: its console admins' 6 and its MQTT clients' 1
    assert (theirs["name"], theirs["details"]) == (LOGINS, f"7 in the last {WINDOW:g} s")
    for i in range(NAMED + 3):
        alarms.console_login_failed(None, f"10.0.1.{i}")
    shown = alarms.check(snap(T0 + 2, {"0": worker(100, auth_failures=1)}, tenants={"acme": tenant(bad_logins=1)}))
    sources = 3 + NAMED + 3  # the two addresses and the worker, and the new addresses: NAMED of them named
    assert raised(shown)[0]["details"].endswith(f"the console from 10.0.1.0: 1, the console from 10.0.1.1: 1 and "
                                                f"{sources - NAMED} more")


def test_a_node_lost_is_raised_until_it_is_back() -> None:
    alarms = Alarms()
    lost = {"edge-1": {"address": "10.0.0.7", "workers": 0, "clients": 0, "state": "lost"}}
    [alarm] = raised(alarms.check(snap(T0, nodes=lost)))
    assert (alarm["name"], alarm["subject"], alarm["what"]) == (NODE_LOST, "edge-1", "node edge-1 lost")
    assert "10.0.0.7" in alarm["details"]
    assert raised(alarms.check(snap(T0 + 1, nodes=lost)))
    back = {"edge-1": {**lost["edge-1"], "workers": 2, "state": "up"}}
    shown = alarms.check(snap(T0 + 2, nodes=back))
    assert raised(shown) == [] and shown[None][0]["cleared"] == T0 + 2


def test_a_tenants_drops_and_failed_logins_are_its_own_alarms_and_named_in_the_brokers() -> None:
    alarms = Alarms()
    alarms.check(snap(T0, tenants={"acme": tenant(), "other": tenant(), "": tenant()}))
    shown = alarms.check(snap(T0 + 1, {"0": worker(100, dropped=4, auth_failures=6)},
                              tenants={"acme": tenant(dropped=4, bad_logins=6), "other": tenant(), "": tenant(dropped=9)}))
    assert set(shown) == {None, "acme"}  # nothing for "other"; the default tenant's are the broker's
    assert {a["name"] for a in raised(shown, "acme")} == {DROPPED, LOGINS}
    assert all(a["tenant"] == "acme" and "acme" in a["what"] for a in shown["acme"])
    broker_drops = next(a for a in raised(shown) if a["name"] == DROPPED)
    assert broker_drops["details"].startswith("4 since raised: worker 0: 4; tenants 'acme': 4")


def test_the_last_cleared_alarms_are_kept_and_the_gauge_counts_the_brokers_raised_ones() -> None:
    alarms = Alarms()
    lost = {"n": {"address": "a", "workers": 0, "clients": 0, "state": "lost"}}
    up = {"n": {**lost["n"], "state": "up"}}
    for i in range(KEEP + 5):
        alarms.check(snap(T0 + 2 * i, nodes=lost))
        alarms.check(snap(T0 + 2 * i + 1, nodes=up))
    shown = alarms.check(snap(T0 + 1000, nodes=lost))
    assert len(shown[None]) == KEEP + 1 and shown[None][1]["cleared"] == T0 + 2 * (KEEP + 4) + 1  # newest first
    samples = {s.labels["name"]: s.value for s in metric(shown).samples}
    assert samples == {DROPPED: 0, LOGINS: 0, NODE_LOST: 1, RESTARTED: 0}


# -- end to end -------------------------------------------------------------------------------------------


def test_a_subscriber_that_does_not_acknowledge_makes_drops_and_the_alarm_is_streamed(
        start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path, config="max_inflight = 1\nmax_queued_messages = 2\n")
    cookie, _csrf = session(url)
    event_until(url, cookie, lambda e: len(e["workers"]) == 2, what="both workers reporting")
    topic = f"alarms/drop/{uid()}"
    sub = connect(b.port)
    assert subscribe(sub, 1, [(topic, 1)]) == [1]  # and never acknowledges what comes
    pub = connect(b.port)
    for i in range(10):
        publish(pub, topic, b"m%d" % i, 1, packet_id=i + 1)
    event = event_until(url, cookie, lambda e: any(a["name"] == DROPPED for a in e["alarms"]), what="the drop alarm")
    alarm = next(a for a in event["alarms"] if a["name"] == DROPPED)
    assert alarm["what"] == "messages dropped" and "max_queued_messages" in alarm["details"]
    assert event["totals"]["dropped"] >= 1
    url = metrics_url(b)
    wait_for(lambda: alarm_gauge(url).get(DROPPED) == 1.0, 10, "plexmq_alarm{name=dropped} 1")
    sub.close()
    pub.close()


def test_six_wrong_passwords_raise_the_login_failures_alarm(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    passwords = tmp_path / "passwords"
    set_password(str(passwords), "device", "right", n=CHEAP)
    b, url = console_broker(start_broker, tmp_path, config=f'password_file = "{passwords}"\n')
    cookie, _csrf = session(url)
    # counted from each worker's first report on (what came before is taken as older than this router)
    event_until(url, cookie, lambda e: len(e["workers"]) == 2, what="both workers reporting")
    guesses = []
    for _ in range(BURST + 1):  # not waiting for each refusal: each comes later than the one before (auth.failed)
        client = RawClient(b.port)
        client.send(encode_connect(f"guess-{uid()}", True, 60, username="device", password=b"wrong"))
        guesses.append(client)
    event = event_until(url, cookie, lambda e: any(a["name"] == LOGINS for a in e["alarms"]), what="the login alarm")
    assert guesses[0].recv(10) == (0x20, b"\x00\x04")  # the refusal itself
    for client in guesses:
        client.close()
    alarm = next(a for a in event["alarms"] if a["name"] == LOGINS)
    assert alarm["what"] == "a burst of failed logins" and " in the last " in alarm["details"]
    assert int(alarm["details"].split()[0]) > BURST  # ours, and the broker's start may have added its probe's


def test_wrong_console_logins_raise_the_login_failures_alarm_for_the_broker_and_the_tenant_named(
        start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    _b, url = console_broker(start_broker, tmp_path, tenants=("acme",))
    broker_admin, acme = session(url)[0], session(url, "acme")[0]
    for address in ("127.0.0.2", "127.0.0.3"):  # more than a burst, each address within its own bound
        for _ in range(BURST // 2 + 1):
            assert log_in_from(url, address, "guess", "acme")[0] == 401
    event = event_until(url, broker_admin, lambda e: any(a["name"] == LOGINS for a in e["alarms"]),
                        what="the broker's login alarm")
    alarm = next(a for a in event["alarms"] if a["name"] == LOGINS)
    assert "the console from 127.0.0.2: " in alarm["details"] and "the console from 127.0.0.3: " in alarm["details"]
    event = event_until(url, acme, lambda e: any(a["name"] == LOGINS for a in e["alarms"]), what="acme's login alarm")
    alarm = next(a for a in event["alarms"] if a["name"] == LOGINS)
    assert alarm["what"] == "a burst of failed logins in tenant 'acme'"


def test_a_worker_killed_with_sigkill_raises_the_restart_alarm(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path)
    cookie, _csrf = session(url)
    event_until(url, cookie, lambda e: len(e["workers"]) == 2, what="both workers reporting")
    old = b.workers()[0].pid
    os.kill(old, signal.SIGKILL)
    event = event_until(url, cookie, lambda e: any(a["name"] == RESTARTED for a in e["alarms"]), 30,
                        "the restart alarm")
    alarm = next(a for a in event["alarms"] if a["name"] == RESTARTED)
    new = wait_for(lambda: (w := b.workers().get(0)) is not None and w.pid != old and w.pid, 10, "the new worker 0")
    assert alarm["what"] == "worker 0 restarted" and alarm["cleared"] is None
    assert alarm["details"].startswith(f"process {old} ended; {new} took its place")


def alarm_gauge(url: str) -> dict[str, float]:
    """The `plexmq_alarm` series by name."""
    return {dict(labels)["name"]: value for (name, labels), value in scrape(url).items() if name == "plexmq_alarm"}
