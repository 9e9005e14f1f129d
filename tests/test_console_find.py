"""Finding things in the console (issue 37) over HTTP on a real broker: the subscriptions browser (by a
part of the filter, by a part of the client id, paged, by filter or by client; a tenant admin sees the
tenant's only), and a trace of one username whose messages download as a JSON-lines file (a tenant
admin traces and downloads its tenant's only); a download asked by another site's page is refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlencode

import orjson

from tests.conftest import Broker
from tests.console import ask, console_broker, joined, session
from tests.mqtt import RawClient
from tests.steps import publish, subscribe, uid
from tests.test_console_trace import Login, post, read_until

Cookie = dict[str, str]


def subscriptions(url: str, cookie: Cookie, **asked: object) -> dict:
    status, _, body = ask(url, "GET", f"/api/subscriptions?{urlencode(asked)}", cookie)
    assert status == 200, body
    return orjson.loads(body)


def test_the_subscriptions_browser_finds_by_filter_and_by_client_and_pages(start_broker: Callable[..., Broker],
                                                                           tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path, "--workers", "2", tenants=("acme",))
    cookie, _ = session(url)
    acme, _ = session(url, "acme")
    tag = uid()
    clients = []
    for i in range(3):
        c = RawClient(b.port)
        assert c.connect(f"{tag}-{i}", clean=i != 2)[1] == 0  # the last one's session persistent
        assert subscribe(c, 1, [(f"{tag}/{n}/#", 1) for n in range(i + 1)] + [("other/+", 0)]) == [1] * (i + 1) + [0]
        clients.append(c)
    theirs = RawClient(b.port)
    assert theirs.connect(f"{tag}-acme", username="dev@acme")[1] == 0
    assert subscribe(theirs, 1, [(f"{tag}/acme", 2)]) == [2]

    by_filter = subscriptions(url, cookie, filter=tag, tenant="")
    assert by_filter["total"] == 6 and by_filter["complete"]
    assert [row[1:4] for row in by_filter["rows"]] == [
        [f"{tag}-0", f"{tag}/0/#", 1], [f"{tag}-1", f"{tag}/0/#", 1], [f"{tag}-2", f"{tag}/0/#", 1],
        [f"{tag}-1", f"{tag}/1/#", 1], [f"{tag}-2", f"{tag}/1/#", 1], [f"{tag}-2", f"{tag}/2/#", 1]]
    assert by_filter["rows"][2][4:] == [True, True]  # online, persistent
    pages = [subscriptions(url, cookie, client=f"{tag}-", order="client", limit=2, offset=n)["rows"] for n in range(0, 10, 2)]
    assert [row[1:3] for page in pages for row in page] == [
        [f"{tag}-0", f"{tag}/0/#"], [f"{tag}-0", "other/+"], [f"{tag}-1", f"{tag}/0/#"], [f"{tag}-1", f"{tag}/1/#"],
        [f"{tag}-1", "other/+"], [f"{tag}-2", f"{tag}/0/#"], [f"{tag}-2", f"{tag}/1/#"], [f"{tag}-2", f"{tag}/2/#"],
        [f"{tag}-2", "other/+"], [f"{tag}-acme", f"{tag}/acme"]]
    assert pages[-1][-1][0] == "acme"  # every tenant's, the broker admin's
    mine = subscriptions(url, acme, filter=tag, tenant="")
    assert [row[:4] for row in mine["rows"]] == [["acme", f"{tag}-acme", f"{tag}/acme", 2]]  # its own, whatever asked
    status, _, said = ask(url, "GET", "/api/subscriptions?order=size", cookie)
    assert (status, said) == (400, b"offset and limit are numbers; order is filter or client\n")
    for c in (*clients, theirs):
        c.close()


def test_a_trace_of_a_username_downloads_as_a_file_and_a_tenant_admin_traces_its_own(
        start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path, "--workers", "2", tenants=("acme",))
    broker_admin = session(url)
    joined(url, broker_admin[0])
    acme: Login = session(url, "acme")
    tag = uid()
    status, said = post(url, acme, "/api/trace/start", {"filter": "#", "tenant": "", "by": "username", "value": "dev"})
    assert status == 200, said
    started = orjson.loads(said)
    assert (started["tenant"], started["by"], started["value"]) == ("acme", "username", "dev")
    assert post(url, acme, "/api/trace/start", {"filter": "#", "by": "password", "value": "x"})[0] == 400
    assert post(url, acme, "/api/trace/start", {"filter": "#", "by": "client_id"})[0] == 400  # of whom?
    senders = []
    for client_id, username in ((f"{tag}-a", "dev@acme"), (f"{tag}-b", "ops@acme"), (f"{tag}-d", "dev")):
        c = RawClient(b.port)
        assert c.connect(client_id, username=username)[1] == 0
        publish(c, f"t/{client_id}", f"from {client_id}".encode(), qos=1)
        senders.append(c)
    seen = read_until(url, acme, started["id"], 1)
    assert [(m["client"], m["payload"]) for m in seen] == [(f"{tag}-a", f"from {tag}-a")]  # not ops, not the default's dev

    path = f"/api/trace/download?id={started['id']}"
    status, headers, body = ask(url, "GET", path, acme[0])
    assert status == 200 and headers["content-type"] == "application/x-ndjson"
    assert headers["content-disposition"] == f'attachment; filename="plexmq-trace-{started["id"]}.jsonl"'
    assert [orjson.loads(line) for line in body.splitlines()] == seen
    assert ask(url, "GET", path, broker_admin[0])[0] == 200  # a broker admin's too
    other = orjson.loads(post(url, broker_admin, "/api/trace/start", {"filter": "#"})[1])
    assert ask(url, "GET", f"/api/trace/download?id={other['id']}", acme[0])[0] == 404  # another tenant's
    assert ask(url, "GET", "/api/trace/download?id=x", acme[0])[0] == 400
    foreign = {**acme[0], "Origin": "http://127.0.0.1:1"}  # another site's page asking with the operator's cookie
    assert ask(url, "GET", path, foreign)[0] == 403
    assert ask(url, "GET", "/api/subscriptions", {**broker_admin[0], "Origin": "http://evil.example"})[0] == 403
    forged = ask(url, "POST", "/api/trace/start", {**acme[0], "Content-Type": "application/json"},
                 orjson.dumps({"filter": "#", "by": "client_id", "value": f"{tag}-a"}))  # no CSRF token
    assert forged[0] == 403
    for c in senders:
        c.close()
