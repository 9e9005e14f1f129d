"""The console's Trace (router/trace.py, router/console_trace.py) against a real broker with two workers:
a trace sees the messages its filter matches, also those a worker would have delivered itself (the
publisher and the subscriber on one worker), and only those; the subscriber still gets each message
once and in order, during the trace and after it; a stopped trace gives the filter's router place back;
a fifth trace at once is refused; a tenant admin's trace sees only its tenant; a burst leaves at most a
ring's worth to read and counts the rest. Without a broker (a `Trace`, and a `Router` in
tests/router_harness.py): the ring and the rate's counts; a start answered only once every worker has
the filter's place; a trace nobody reads gives it back."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from plexmq.mqtt import v4
from plexmq.router import trace as limits
from plexmq.router.routes import ROUTER
from plexmq.router.tenants import Tenant
from plexmq.wire import Routes
from tests.conftest import Broker, wait_for
from tests.console import ask, console_broker, session
from tests.mqtt import Client
from tests.router_harness import Deliver, DeliverRaw, RouterHarness, Sub
from tests.steps import uid

Login = tuple[dict[str, str], str]  # the Cookie header, the CSRF token


def post(url: str, login: Login, path: str, body: dict) -> tuple[int, bytes]:
    cookie, csrf = login
    status, _, said = ask(url, "POST", path, {**cookie, "Content-Type": "application/json", "X-CSRF-Token": csrf},
                          orjson.dumps(body))
    return status, said


def start(url: str, login: Login, topic_filter: str, tenant: str = "") -> dict:
    """A started trace, which every worker applied (its messages all reach the router)."""
    status, said = post(url, login, "/api/trace/start", {"filter": topic_filter, "tenant": tenant})
    assert status == 200, said
    started = orjson.loads(said)
    assert started["applied"] and started["filter"] == topic_filter
    return started


def stop(url: str, login: Login, number: int) -> dict:
    status, said = post(url, login, "/api/trace/stop", {"id": number})
    assert status == 200, said
    return orjson.loads(said)


def read(url: str, login: Login, number: int) -> dict:
    status, _, said = ask(url, "GET", f"/api/trace/read?id={number}", login[0])
    assert status == 200, said
    return orjson.loads(said)


def listed(url: str, login: Login) -> list[dict]:
    status, _, said = ask(url, "GET", "/api/trace", login[0])
    assert status == 200
    return orjson.loads(said)["traces"]


def read_until(url: str, login: Login, number: int, count: int) -> list[dict]:
    """The trace's messages, read as the page does, until `count` have come."""
    seen: list[dict] = []

    def enough() -> bool:
        seen.extend(read(url, login, number)["messages"])
        return len(seen) >= count

    wait_for(enough, 10, f"{count} traced messages")
    return seen


def worker_of(url: str, login: Login, client_id: str) -> str:
    def found() -> str | None:
        rows = orjson.loads(ask(url, "GET", f"/api/clients?filter={client_id}", login[0])[2])["clients"]
        return rows[0][1] if rows else None

    return wait_for(found, 10, f"{client_id} listed")


def beside(b: Broker, url: str, login: Login, worker: str) -> tuple[Client, str]:
    """A client on `worker`, and its id (the acceptor places each new one on the least loaded worker: a
    few tries)."""
    others = []
    try:
        for _ in range(8):
            client_id = f"pub-{uid()}"
            client = Client(b.port, client_id)
            if worker_of(url, login, client_id) == worker:
                return client, client_id
            others.append(client)
        raise AssertionError(f"no client placed on {worker}")
    finally:
        for other in others:
            other.disconnect()


def test_a_trace_sees_what_its_filter_matches_and_every_message_is_still_delivered_once_in_order(
        start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path)
    login = session(url)
    sub_id = f"sub-{uid()}"
    subscriber = Client(b.port, sub_id)
    assert subscriber.subscribe("t/#", 1) == [1]
    publisher, pub_id = beside(b, url, login, worker_of(url, login, sub_id))  # its worker delivers itself, untraced
    got: list[bytes] = []

    def send(*payloads: bytes) -> None:
        for payload in payloads:
            publisher.publish("t/a", payload, qos=1)

    def received(count: int) -> bool:
        while len(got) < count:
            got.append(bytes(subscriber.get().payload))
        return True

    before, during, after = [b"before-0", b"before-1"], [f"during-{i}".encode() for i in range(5)], [b"after-0", b"after-1"]
    send(*before)
    received(2)
    started = start(url, login, "t/#")
    publisher.publish("u/a", b"not traced", qos=1)
    send(*during)
    seen = read_until(url, login, started["id"], len(during))
    assert [(m["topic"], m["payload"].encode(), m["qos"], m["client"]) for m in seen] == \
        [("t/a", payload, 1, pub_id) for payload in during]
    assert all(m["size"] == len(m["payload"]) and not m["cut"] and not m["retain"] for m in seen)
    counts = read(url, login, started["id"])
    assert (counts["matched"], counts["kept"], counts["skipped"], counts["lost"], counts["messages"]) == (5, 5, 0, 0, [])
    stopped = stop(url, login, started["id"])
    assert stopped["router_place"] is False  # the filter's messages go back to local delivery
    assert listed(url, login) == []
    assert ask(url, "GET", f"/api/trace/read?id={started['id']}", login[0])[0] == 404
    send(*after, b"last")
    received(len(before) + len(during) + len(after) + 1)
    assert got == [*before, *during, *after, b"last"]  # each once, in order, across both changes of path
    assert subscriber.nothing()
    out = b.output()
    assert f"console: 'ops' from 127.0.0.1 started trace {started['id']} of 't/#' in tenant ''" in out
    assert re.search(rf"trace {started['id']} of 't/#' in tenant '' \(started by 'ops'\) ended: stopped; "
                     r"5 messages matched, 5 kept, 0 skipped", out)
    publisher.disconnect()
    subscriber.disconnect()


def test_a_filter_with_a_subscription_the_router_serves_keeps_its_place_after_the_trace(
        start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path)
    login = session(url)
    persistent = Client(b.port, f"keep-{uid()}", clean=False)
    assert persistent.subscribe("k/#", 1) == [1]
    started = start(url, login, "k/#")
    assert stop(url, login, started["id"])["router_place"] is True
    persistent.disconnect()


def test_a_fifth_trace_at_once_is_refused(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path)
    login = session(url)
    numbers = [start(url, login, f"f/{i}")["id"] for i in range(limits.MOST)]
    status, said = post(url, login, "/api/trace/start", {"filter": "f/more"})
    assert (status, said) == (429, f"{limits.MOST} traces are live, the most at once: stop one first\n".encode())
    assert post(url, login, "/api/trace/start", {"filter": "$share/g/f"})[0] == 400
    assert post(url, login, "/api/trace/start", {"filter": "f/#/x"})[0] == 400
    stop(url, login, numbers.pop(0))
    numbers.append(start(url, login, "f/more")["id"])
    assert sorted(t["id"] for t in listed(url, login)) == numbers
    for number in numbers:
        stop(url, login, number)
    assert ask(url, "POST", "/api/trace/start", login[0], b"")[0] == 403  # no CSRF token


def test_a_tenant_admin_traces_only_their_tenant(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path, tenants=("acme",))
    broker_admin = session(url)
    acme = session(url, "acme")
    theirs = start(url, acme, "x/#", tenant="")  # whatever it names: its own tenant
    assert theirs["tenant"] == "acme"
    ours = start(url, broker_admin, "x/#")
    assert ours["tenant"] == ""
    assert post(url, broker_admin, "/api/trace/start", {"filter": "x/#", "tenant": "nobody"})[0] == 404
    in_acme = Client(b.port, f"a-{uid()}", username="dev@acme")
    in_default = Client(b.port, f"d-{uid()}", username="dev")
    in_acme.publish("x/1", b"acme's", qos=1)
    in_default.publish("x/1", b"the default's", qos=1)
    assert [m["payload"] for m in read_until(url, acme, theirs["id"], 1)] == ["acme's"]
    assert [m["payload"] for m in read_until(url, broker_admin, ours["id"], 1)] == ["the default's"]
    in_acme.publish("x/2", b"acme's last", qos=1)
    assert [m["payload"] for m in read_until(url, acme, theirs["id"], 1)] == ["acme's last"]
    assert [t["id"] for t in listed(url, acme)] == [theirs["id"]]
    assert sorted(t["id"] for t in listed(url, broker_admin)) == sorted([theirs["id"], ours["id"]])
    assert ask(url, "GET", f"/api/trace/read?id={ours['id']}", acme[0])[0] == 404
    assert post(url, acme, "/api/trace/stop", {"id": ours["id"]})[0] == 404
    assert read(url, broker_admin, ours["id"])["matched"] == 1  # still live, and saw none of acme's
    stop(url, acme, theirs["id"])
    stop(url, broker_admin, ours["id"])
    in_acme.disconnect()
    in_default.disconnect()


def test_a_burst_leaves_at_most_a_ring_to_read_and_counts_the_rest(start_broker: Callable[..., Broker],
                                                                     tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path)
    login = session(url)
    started = start(url, login, "b/#")
    publisher = Client(b.port, f"burst-{uid()}")
    big = bytes(range(256)) * 12  # not text: shown as hex, cut to trace.PAYLOAD bytes
    publisher.publish("b/big", big, qos=1)
    burst = 2 * limits.RING + 200
    for i in range(burst):
        publisher.publish("b/x", str(i).encode())  # QoS 0: runs of raw packets, as fast as paho sends
    publisher.publish("b/end", b"end", qos=1)
    published = burst + 2

    def counted() -> dict | None:
        found = [t for t in listed(url, login) if t["id"] == started["id"]]
        return found[0] if found and found[0]["matched"] == published else None

    wait_for(counted, 20, "every message of the burst counted")
    answer = read(url, login, started["id"])  # the first read: the ring is all there is
    messages = answer["messages"]
    assert len(messages) <= limits.RING
    assert answer["matched"] == answer["kept"] + answer["skipped"] == published
    assert answer["kept"] == answer["lost"] + len(messages)
    assert answer["skipped"] + answer["lost"] >= published - limits.RING
    seqs = [m["seq"] for m in messages]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # the newest the ring held, in order
    if seqs[0] == 1:  # the big one kept (it came first, within the rate)
        first = messages[0]
        assert (first["topic"], first["size"], first["form"], first["cut"]) == ("b/big", len(big), "hex", True)
        assert first["payload"] == big[:limits.PAYLOAD].hex(" ")
    stop(url, login, started["id"])
    publisher.disconnect()


def test_the_ring_keeps_the_newest_and_counts_what_it_let_go_and_what_the_rate_skipped() -> None:
    traced = limits.Trace(1, Tenant(""), "r/#", "ops")  # no broker: the loop's and the reader's parts, in turn
    assert traced.allow(limits.RATE + 50) == limits.RATE and traced.skipped == 50
    for i in range(limits.RING + 20):
        traced.keep(b"r/1", str(i).encode(), 0, False, "c")
    taken = traced.take()
    assert [entry[0] for entry in taken] == list(range(21, limits.RING + 21)) and traced.lost == 20
    traced.keep(b"r/1", b"next", 1, True, "c")
    assert [entry[6] for entry in traced.take()] == [b"next"] and traced.lost == 20 and traced.take() == []


def test_a_start_waits_for_every_worker_and_an_unread_trace_gives_its_place_back() -> None:
    h = RouterHarness()  # no broker: the router's loop played by the test
    w0, w1 = h.worker("w0"), h.worker("w1")
    h.turn()
    w0.connect(1, "sub", connack_sent=1)
    w0.subscribe(1, 1, [("t/#", 1)])
    w1.connect(2, "pub", connack_sent=1)
    h.turn()
    w0.take(), w1.take()
    question = limits.TraceStart("t/#", "", "ops")
    question.start(h.router)  # as the loop starts an ask
    assert question.trace is not None and not question.done.is_set()
    w1.answers_routes = False
    h.turn()
    assert [r.entries for r in w1.take(everything=True) if isinstance(r, Routes)] == [[["", "t/#", ["w0", ""]]]]
    assert not question.done.is_set()  # w0 has applied it, w1 not yet
    w1.routes_ack(h.router.routes.gen)
    assert question.done.is_set()
    w1.pub0(2, "t/a", [b"one", b"two"])
    w1.pub(2, "t/b", b"three", qos=1, pid=7)
    h.turn()
    delivered = w0.take()  # to the subscriber once each, as without the trace
    assert [(r.packets, r.subs) for r in delivered if isinstance(r, DeliverRaw)] == \
        [(v4.encode_publish(b"t/a", b"one") + v4.encode_publish(b"t/a", b"two"), (Sub(1, 1, 0),))]
    assert [(r.topic, r.payload, r.subs) for r in delivered if isinstance(r, Deliver)] == [(b"t/b", b"three", (Sub(1, 1, 0),))]
    assert [(e[2], e[3], e[6], e[7]) for e in question.trace.take()] == \
        [(b"t/a", 0, b"one", "pub"), (b"t/a", 0, b"two", "pub"), (b"t/b", 1, b"three", "pub")]
    h.router.traces.sweep(h.router, time.monotonic() + limits.IDLE + 1)  # nobody read it for IDLE
    assert h.router.traces.live == {} and not h.router.routes.serves("", "t/#", ROUTER)
    h.turn()
    assert [r.entries for r in w1.take(everything=True) if isinstance(r, Routes)] == [[["", "t/#", ["w0"]]]]
