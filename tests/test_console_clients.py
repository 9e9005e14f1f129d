"""The clients' own figures in the console's listing (issue 37) over HTTP on a real broker of two
workers: each client's username, the time of its CONNACK, the messages and bytes it sent and was sent
(counted by its worker), sorted by any column by the router (ties by client id) and paged through, the
pages of one order following each other without a client twice or left out; a client's page shows the
same figures."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlencode

import orjson

from plexmq.mqtt import v4 as p
from tests.conftest import Broker
from tests.console import ask, console_broker, session
from tests.mqtt import RawClient
from tests.steps import publish, receive, subscribe, uid

Cookie = dict[str, str]


def listing(url: str, cookie: Cookie, **asked: object) -> tuple[int, dict | bytes]:
    status, _, body = ask(url, "GET", f"/api/clients?{urlencode(asked)}", cookie)
    return status, orjson.loads(body) if status == 200 else body


def rows(url: str, cookie: Cookie, per_page: int, **asked: object) -> list[dict]:
    """Every page of a listing in one order, each row as a dict."""
    found: list[dict] = []
    while True:
        status, page = listing(url, cookie, offset=len(found), limit=per_page, **asked)
        assert status == 200 and isinstance(page, dict) and page["complete"], page
        found += [dict(zip(page["fields"], row, strict=True)) for row in page["clients"]]
        if len(found) >= page["total"]:
            return found


def test_the_listing_counts_each_clients_messages_and_bytes_and_sorts_and_pages(
        start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path, "--workers", "2")
    cookie, _csrf = session(url)
    tag = uid()
    began = time.time()
    subscriber = RawClient(b.port)
    assert subscriber.connect(f"{tag}-sub")[1] == 0
    assert subscribe(subscriber, 1, [(f"{tag}/#", 0)]) == [0]
    publishers, sent = [], {}
    for i in range(4):  # publisher i sends i + 1 QoS 1 messages, each acknowledged: counted by then
        c = RawClient(b.port)
        connect = p.encode_connect(f"{tag}-p{i}", True, 60, username=f"user-{i}")
        c.send(connect)
        assert c.recv()[0] == 0x20
        packets = [p.encode_publish(f"{tag}/{i}".encode(), b"x" * 10 * (i + 1), 1, packet_id=n) for n in range(1, i + 2)]
        for n in range(1, i + 2):
            publish(c, f"{tag}/{i}", b"x" * 10 * (i + 1), qos=1, packet_id=n)
        sent[f"{tag}-p{i}"] = (i + 1, len(connect) + sum(map(len, packets)), 4 + 4 * (i + 1))  # CONNACK, PUBACKs
        publishers.append(c)
    got = receive(subscriber, count=10)
    ended = time.time()

    by_messages_in = rows(url, cookie, 2, filter=tag, sort="messages_in", order="desc")
    assert [r["client_id"] for r in by_messages_in] == [f"{tag}-p3", f"{tag}-p2", f"{tag}-p1", f"{tag}-p0", f"{tag}-sub"]
    for r in by_messages_in[:4]:
        assert (r["messages_in"], r["bytes_in"], r["bytes_out"], r["messages_out"]) == (*sent[r["client_id"]], 0)
        assert r["username"] == f"user-{r['client_id'][-1]}"
    sub = by_messages_in[4]
    assert (sub["messages_in"], sub["messages_out"], sub["username"]) == (0, 10, "")
    assert sub["bytes_out"] == 4 + 5 + sum(len(p.encode_publish(m.topic.encode(), m.payload)) for m in got)  # CONNACK, SUBACK
    assert all(began <= r["connected_at"] <= ended for r in by_messages_in)
    assert {r["worker"] for r in by_messages_in} == {"0", "1"}  # rows of both workers, merged in one order

    assert [r["client_id"] for r in rows(url, cookie, 3, filter=tag, sort="username")] == \
        [f"{tag}-sub", f"{tag}-p0", f"{tag}-p1", f"{tag}-p2", f"{tag}-p3"]  # "" first
    by_worker = rows(url, cookie, 1, filter=tag, sort="worker", order="desc")  # ties by client id, reversed
    assert [(r["worker"], r["client_id"]) for r in by_worker] == \
        sorted(((r["worker"], r["client_id"]) for r in by_messages_in), reverse=True)
    assert listing(url, cookie, sort="password") == (400, b"sort is one of " + ", ".join(
        by_messages_in[0]).encode() + b"; order asc or desc\n")
    assert listing(url, cookie, order="up")[0] == 400

    runner = RawClient(b.port)  # plain QoS 0 in one read: a run, written to the subscriber as it is
    assert runner.connect(f"{tag}-run")[1] == 0
    runner.send(b"".join(p.encode_publish(f"{tag}/run".encode(), b"r") for _ in range(3)))
    assert len(receive(subscriber, count=3)) == 3
    (sub,) = rows(url, cookie, 10, filter=f"{tag}-sub")
    assert sub["messages_out"] == 13
    status, _, body = ask(url, "GET", f"/api/client?{urlencode({'id': f'{tag}-p2'})}", cookie)
    connection = orjson.loads(body)["connection"]
    assert status == 200 and (connection["username"], connection["messages_in"], connection["bytes_in"]) == \
        ("user-2", *sent[f"{tag}-p2"][:2])
    for c in (subscriber, runner, *publishers):
        c.close()
