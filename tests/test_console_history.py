"""The overview's history (router/ops/history.py): the router keeps the last hour at 1 s and the last
day at 1 min in rings of fixed size, and serves them at the overview's load (`GET /api/history`, a
broker admin's only), with the totals of subscriptions, topics and retained messages in the events."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson

from plexmq.router.ops.history import MINUTES, SECONDS, History
from tests.conftest import Broker, wait_for
from tests.console import ask, console_broker, event_until, session
from tests.steps import connect, publish, subscribe, uid


def _count(received: int) -> dict[str, float | None]:
    return {"received": received, "sent": 0, "dropped": 0, "bytes_in": None, "bytes_out": None}


def test_the_rings_keep_an_hour_of_seconds_and_a_day_of_minutes_and_no_more() -> None:
    history = History()
    start = 1_000_000_020.0  # 20 s into a minute
    for second in range(SECONDS + MINUTES * 60 + 100):  # more than a day: both rings wrap
        history.add(start + second, second % 7, _count(10 * second), {"0": {"cpu": 50.0, "rss": 1 << 20}})
    kept = history.copy()
    seconds, minutes = kept["broker"]["seconds"], kept["broker"]["minutes"]
    assert len(seconds["at"]) == SECONDS and len(minutes["at"]) == MINUTES  # bounded
    assert seconds["at"] == sorted(seconds["at"]) and seconds["at"][-1] == start + SECONDS + MINUTES * 60 + 99
    assert set(seconds["received"]) == {10.0} and set(seconds["bytes_in"]) == {None}  # unknown: null
    assert minutes["at"] == sorted(minutes["at"]) and minutes["at"][-1] % 60 == 30  # each minute's middle
    assert minutes["connections"][-1] == 3.0  # the mean of 0..6 over a whole minute's seconds
    assert kept["workers"]["0"]["minutes"]["rss"][-1] == 1 << 20 and len(kept["workers"]["0"]["seconds"]["cpu"]) == SECONDS


def test_the_history_is_served_at_the_overviews_load_after_traffic(start_broker: Callable[..., Broker],
                                                                   tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path)
    cookie, _csrf = session(url)
    event_until(url, cookie, lambda e: e["rates"]["received"] is not None, what="a rate: the history has begun")
    topic = f"history/{uid()}"
    sub = connect(b.port)
    assert subscribe(sub, 1, [(topic, 0), (topic + "/more", 0)]) == [0, 0]
    pub = connect(b.port)
    publish(pub, topic + "/kept", b"r", 0, retain=True)
    for i in range(50):
        publish(pub, topic, b"m%d" % i)
    event = event_until(url, cookie, lambda e: e["totals"]["received"] >= 51 and e["held"]["retained"] >= 1,
                        what="the messages counted")
    assert event["held"]["subscriptions"] >= 2 and event["held"]["topics"] >= 2

    def kept() -> dict:
        status, headers, body = ask(url, "GET", "/api/history", cookie)
        assert status == 200 and headers["content-type"] == "application/json"
        return orjson.loads(body)

    history = wait_for(lambda: (found := kept()) and max(found["broker"]["seconds"]["received"]) > 0 and found,
                       10, "the messages in the history")
    seconds = history["broker"]["seconds"]
    assert max(seconds["bytes_in"]) > 0 and max(seconds["sent"]) > 0 and max(seconds["connections"]) >= 2
    assert len(history["workers"]) == 2 and all(max(w["seconds"]["rss"]) > 0 for w in history["workers"].values())
    assert ask(url, "GET", "/api/history")[0] == 401  # behind the login
    wait_for(lambda: len(kept()["broker"]["seconds"]["at"]) > len(seconds["at"]), 10, "the history going on")
    sub.close()
    pub.close()


def test_a_tenant_admin_gets_no_history_of_the_broker(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    _b, url = console_broker(start_broker, tmp_path, tenants=("acme",))
    cookie, _csrf = session(url, tenant="acme")
    event = event_until(url, cookie, lambda e: e["tenant"] == "acme")
    assert event["held"] == {"subscriptions": 0, "retained": 0, "topics": None}
    assert ask(url, "GET", "/api/history", cookie)[2] == b"{}"
