"""The console's Trace (router/trace.py, router/console/trace.py, workers/trace_watch.py) against a real
broker with two workers: a trace sees the messages its filter matches, also those a worker delivers
itself (the publisher and the subscriber on one worker), and only those; the subscriber still gets each
message once and in order, during the trace and after it; a fifth trace at once is refused, and one
tenant's admins hold a share of them; a tenant admin's trace sees only its tenant; a read needs the
session's token; a burst leaves at most a ring's worth to read and counts the rest.
Without a broker: the ring and the rate's counts (a `Trace`); the router (tests/router_harness.py): a
start answered only once every worker has acknowledged the set of traces, which never changes the route
table, the copies kept within the router's rate, the workers' skipped counts added, a joining worker
told the set; the worker (tests/connection_harness.py): it copies what its clients publish to the
traces of their tenant, within its bucket, while the messages keep their own path (local delivery)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from plexmq import tenants, wire
from plexmq.mqtt import v4
from plexmq.router import trace as limits
from plexmq.router.tenants import Tenant
from plexmq.wire import Routes, Traces
from plexmq.workers import trace_watch
from tests.conftest import Broker, wait_for
from tests.connection_harness import ConnectionHarness, Packet, Record, routes, suback, traces
from tests.console import ask, console_broker, joined, session
from tests.mqtt import Client
from tests.router_harness import RouterHarness, WorkerEnd
from tests.steps import uid

Login = tuple[dict[str, str], str]  # the Cookie header, the CSRF token


def post(url: str, login: Login, path: str, body: dict) -> tuple[int, bytes]:
    cookie, csrf = login
    status, _, said = ask(url, "POST", path, {**cookie, "Content-Type": "application/json", "X-CSRF-Token": csrf},
                          orjson.dumps(body))
    return status, said


def start(url: str, login: Login, topic_filter: str, tenant: str = "") -> dict:
    """A started trace, which every joined worker watches (the tests wait for both to join: a worker that
    joins later watches from the router's answer to its HELLO on)."""
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
    status, said = post(url, login, "/api/trace/read", {"id": number})
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
    joined(url, login[0])
    sub_id = f"sub-{uid()}"
    subscriber = Client(b.port, sub_id)
    assert subscriber.subscribe("t/#", 1) == [1]
    publisher, pub_id = beside(b, url, login, worker_of(url, login, sub_id))  # its worker delivers itself
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
    assert stop(url, login, started["id"])["matched"] == 5
    assert listed(url, login) == []
    assert post(url, login, "/api/trace/read", {"id": started["id"]})[0] == 404
    send(*after, b"last")
    received(len(before) + len(during) + len(after) + 1)
    assert got == [*before, *during, *after, b"last"]  # each once, in order: the trace never changed its path
    assert subscriber.nothing()
    out = b.output()
    assert f"console: 'ops' from 127.0.0.1 started trace {started['id']} of 't/#' in tenant ''" in out
    assert re.search(rf"trace {started['id']} of 't/#' in tenant '' \(started by 'ops'\) ended: stopped; "
                     r"5 messages matched, 5 kept, 0 skipped", out)
    publisher.disconnect()
    subscriber.disconnect()


def test_a_fifth_trace_at_once_is_refused(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path)
    login = session(url)
    joined(url, login[0])
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


def test_one_tenants_admins_hold_their_share_of_the_traces_and_a_broker_admin_stops_any(
        start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    _b, url = console_broker(start_broker, tmp_path, tenants=("acme", "beta"))
    broker_admin = session(url)
    joined(url, broker_admin[0])
    acme, beta = session(url, "acme"), session(url, "beta")
    theirs = [start(url, acme, f"a/{i}")["id"] for i in range(limits.TENANT_MOST)]
    status, said = post(url, acme, "/api/trace/start", {"filter": "a/more"})
    assert (status, said) == (429, f"tenant 'acme' has {limits.TENANT_MOST} traces live, the most of one tenant's "
                                   "admins: stop one first\n".encode())
    others = [start(url, beta, "b/#")["id"], start(url, broker_admin, "o/#")["id"]]  # the other slots are still free
    assert len(theirs + others) == limits.MOST
    assert post(url, beta, "/api/trace/stop", {"id": theirs[0]})[0] == 404  # another tenant's admin: not theirs
    assert stop(url, broker_admin, theirs[0])["tenant"] == "acme"  # the broker's admin stops any
    theirs[0] = start(url, acme, "a/more")["id"]
    for number in theirs + others:
        stop(url, broker_admin, number)


def test_a_tenant_admin_traces_only_their_tenant(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path, tenants=("acme",))
    broker_admin = session(url)
    joined(url, broker_admin[0])
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
    assert post(url, acme, "/api/trace/read", {"id": ours["id"]})[0] == 404
    assert post(url, acme, "/api/trace/stop", {"id": ours["id"]})[0] == 404
    assert read(url, broker_admin, ours["id"])["matched"] == 1  # still live, and saw none of acme's
    stop(url, acme, theirs["id"])
    stop(url, broker_admin, ours["id"])
    in_acme.disconnect()
    in_default.disconnect()


def test_only_the_page_with_the_sessions_token_reads_a_trace(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path)
    login = session(url)
    joined(url, login[0])
    started = start(url, login, "r/#")
    publisher = Client(b.port, f"pub-{uid()}")
    publisher.publish("r/1", b"for the operator", qos=1)
    wait_for(lambda: [t for t in listed(url, login) if t["kept"] == 1], 10, "the message kept")
    cookie = login[0]  # what a browser sends along with another page's request (same site: another port)
    assert ask(url, "GET", f"/api/trace/read?id={started['id']}", cookie)[0] == 404  # an <img src>: no route
    json = {"Content-Type": "application/json"}
    assert ask(url, "POST", "/api/trace/read", {**cookie, **json}, orjson.dumps({"id": started["id"]}))[0] == 403
    foreign = {**cookie, **json, "X-CSRF-Token": login[1], "Origin": "http://127.0.0.1:1"}
    assert ask(url, "POST", "/api/trace/read", foreign, orjson.dumps({"id": started["id"]}))[0] == 403
    assert post(url, login, "/api/trace/read", {"id": "1"})[0] == 400
    assert [m["payload"] for m in read(url, login, started["id"])["messages"]] == ["for the operator"]  # all still there
    stop(url, login, started["id"])
    publisher.disconnect()


def test_a_burst_leaves_at_most_a_ring_to_read_and_counts_the_rest(start_broker: Callable[..., Broker],
                                                                     tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path)
    login = session(url)
    joined(url, login[0])
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
        traced.keep(b"r/1", str(i).encode(), 0, False, 1, "c", 0.0)
    taken = traced.take()
    assert [entry[0] for entry in taken] == list(range(21, limits.RING + 21)) and traced.lost == 20
    traced.keep(b"r/1", b"next", 1, True, 4, "c", 0.0)
    assert [entry[6] for entry in traced.take()] == [b"next"] and traced.lost == 20 and traced.take() == []


def told(end: WorkerEnd) -> list:
    """The route table's changes and the sets of traces the worker got since the last take."""
    return [r for r in end.take(everything=True) if isinstance(r, (Routes, Traces))]


def report_skipped(end: WorkerEnd, counts: list[list]) -> None:
    """A worker's STATS saying what it matched and only counted, per trace."""
    end.link.stats(wire.Stats("1", "", 1, 0, 0, 0, 0, 0, 0, 0, {}, 0, 0.0, 0, 0, 0, {}, {}, counts))
    end.send()


def test_a_start_waits_for_every_worker_and_the_trace_never_changes_the_route_table() -> None:
    h = RouterHarness()  # no broker: the router's loop played by the test
    w0, w1 = h.worker("w0"), h.worker("w1")
    h.turn()
    w0.connect(1, "sub", connack_sent=1)
    w0.subscribe(1, 1, [("t/#", 1)])  # served by w0 itself
    w1.connect(2, "pub", connack_sent=1)
    h.turn()
    w0.take(), w1.take()
    places = dict(h.router.routes.places)
    question = limits.TraceStart("t/#", "", "ops")
    question.start(h.router)  # as the loop starts an ask
    trace = question.trace
    assert trace is not None and not question.done.is_set()
    h.turn()
    gen = h.router.traces.gen
    assert told(w0) == told(w1) == [Traces(gen, [[trace.id, "", "t/#", "", ""]])]  # and no ROUTES: no place for it
    assert h.router.routes.places == places and h.router.tenant("").trie.match("t/a").keys() == {
        h.router.tenant("").sessions["sub"]}
    w0.traces_ack(gen)
    assert not question.done.is_set()  # w0 watches it, w1 not yet
    w1.traces_ack(gen)
    assert question.done.is_set()

    w1.pub(2, "t/b", b"routed", qos=1, pid=7)  # a message the router routes is not copied by it
    w1.traced(trace.id, "t/a", b"one", client="pub", at=5.0)
    w1.traced(trace.id, "t/b", b"two", qos=1, retain=True, client="pub", at=6.0)
    w1.traced(trace.id + 1, "t/c", b"no such trace")
    report_skipped(w1, [[trace.id, 7], [trace.id + 1, 3]])
    assert [(e[1], e[2], e[3], e[4], e[6], e[7]) for e in trace.take()] == \
        [(5.0, b"t/a", 0, False, b"one", "pub"), (6.0, b"t/b", 1, True, b"two", "pub")]
    assert (trace.matched, trace.kept, trace.skipped) == (9, 2, 7)

    w2 = h.worker("w2")  # a worker that joins while a trace is live is told the set
    h.turn()
    assert told(w2)[-1] == Traces(gen, [[trace.id, "", "t/#", "", ""]])
    h.router.traces.sweep(h.router, time.monotonic() + limits.IDLE + 1)  # nobody read it for IDLE
    assert h.router.traces.live == {}
    h.turn()
    assert told(w0) == told(w1) == told(w2) == [Traces(gen + 1, [])]
    assert h.router.routes.places == places


def test_the_router_keeps_at_most_its_rate_of_the_workers_copies() -> None:
    h = RouterHarness()
    w0 = h.worker("w0")
    h.turn()
    question = limits.TraceStart("#", "", "ops")
    question.start(h.router)
    trace = question.trace
    assert trace is not None
    trace.second = int(time.monotonic()) + 1 << 20  # a second that lasts the test: no new room comes
    for i in range(limits.RATE + 30):
        w0.traced(trace.id, "t", str(i).encode())
    assert len(trace.take()) == limits.RATE and (trace.matched, trace.skipped) == (limits.RATE + 30, 30)


TENANTS = tenants.Tenants({"acme": tenants.Tenant("acme")}, "@")


def test_a_worker_copies_its_clients_messages_to_their_tenants_traces_within_its_bucket_and_delivers_them_as_before() -> None:
    h = ConnectionHarness(tenants=TENANTS)
    h.from_router(routes(1, True, []))
    sub = h.client("sub")
    sub.send(v4.encode_subscribe(1, [("t/#", 0)]))
    h.from_router(suback(sub.conn_id, 1, [0], [["t/#", 0]]))  # served here
    sub.packets()
    pub = h.client("pub")
    acme = h.client("pub-a", username="p@acme")
    h.records()
    assert not h.worker.watching  # no trace: nothing watched
    h.from_router(traces(1, [[7, "", "t/#", "", ""], [8, "acme", "#", "", ""]]))
    assert h.records() == [Record("TRACES_ACK", (1,))]

    local = h.worker.counters.tally("")  # what STATS says as local_received (the default tenant's share)
    before = local.received
    pub.send(v4.encode_publish(b"t/a", b"zero"))  # QoS 0: a raw run
    pub.send(v4.encode_publish(b"t/b", b"one", 1, False, False, 5))
    pub.send(v4.encode_publish(b"u/x", b"not traced"))
    acme.send(v4.encode_publish(b"t/a", b"acme's"))
    copies = h.records()
    assert [(r.kind, r.fields[:6], r.payload) for r in copies] == [
        ("TRACED", (7, "t/a", 0, False, 4, "pub"), b"zero"), ("TRACED", (7, "t/b", 1, False, 3, "pub"), b"one"),
        ("TRACED", (8, "t/a", 0, False, 6, "pub-a"), b"acme's")]  # no PUB, no PUB0: the router routes none of them
    assert sub.packets() == [Packet(v4.PUBLISH, 0, 0, "t/a", b"zero"), Packet(v4.PUBLISH, 0, 0, "t/b", b"one")]
    assert pub.packets() == [Packet(v4.PUBACK, 0, 5)]  # at once: delivered here
    assert local.received == before + 3  # all three took the local path

    burst = v4.encode_publish(b"t/c", b"x" * 2000) * 150  # one read: one run, parsed only for the copies
    pub.send(burst)
    copied = h.records()
    assert len(copied) == trace_watch.BURST - 2 and all(r.kind == "TRACED" for r in copied)
    assert copied[0].fields[4] == 2000 and copied[0].payload == b"x" * wire.TRACED_PAYLOAD
    assert len(sub.packets()) == 150  # every one delivered
    assert trace_watch.skipped(h.worker.watching) == [[7, 150 - len(copied)]]
    assert trace_watch.skipped(h.worker.watching) == []  # counted once
    h.loop.advance(0.5)  # the bucket fills again at RATE
    pub.send(v4.encode_publish(b"t/d", b"y") * 80)
    assert len(h.records()) == int(0.5 * trace_watch.RATE) and len(sub.packets()) == 80

    h.from_router(traces(2, []))  # the trace ended
    assert h.records() == [Record("TRACES_ACK", (2,))] and not h.worker.watching
    pub.send(v4.encode_publish(b"t/e", b"z"))
    assert h.records() == [] and len(sub.packets()) == 1


def test_a_trace_of_one_client_id_username_or_address_copies_only_its_publishers_messages() -> None:
    """Issue 37: a trace may be of one publisher: by client id, by username, by address (its host, or
    host:port); the others' messages on the same topics are not copied for it."""
    h = ConnectionHarness()
    h.from_router(routes(1, True, []))
    one = h.client("one", username="alice")
    two = h.client("two", username="bob")
    h.records()
    two_at = two.conn.peer
    h.from_router(traces(1, [[7, "", "#", "client_id", "one"], [8, "", "#", "username", "bob"],
                             [9, "", "t/#", "address", two_at], [10, "", "#", "address", "127.0.0.1"]]))
    assert h.records() == [Record("TRACES_ACK", (1,))]
    one.send(v4.encode_publish(b"t/a", b"of one"))  # a raw run
    two.send(v4.encode_publish(b"t/b", b"of two", 1, False, False, 5))
    two.send(v4.encode_publish(b"u/c", b"not t/#"))
    assert sorted((r.fields[0], r.fields[5]) for r in h.records() if r.kind == "TRACED") == [
        (7, "one"), (8, "two"), (8, "two"), (9, "two"), (10, "one"), (10, "two"), (10, "two")]
