"""Who did what (router/ops/audit.py): every action through the console or the admin API is in the audit
log with the admin, the address, the time, the tenant, the target and the outcome; the Audit page
shows a tenant admin its tenant's entries only; the log is kept across a router restart; a read-only
admin (` role=read-only` in the admins file) may look at every page but every action is refused; an
alarm is acknowledged (who and when shown; audited)."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable
from pathlib import Path

import orjson

from plexmq.mqtt import v4 as p
from plexmq.router.console.app import FEATURES  # every route there is, the actions among them
from plexmq.router.ops import audit
from plexmq.router.ops.alarms import DROPPED
from plexmq.workers.auth.passwords import set_password
from tests.cli import CHEAP, metrics_url
from tests.conftest import Broker, wait_for
from tests.console import ADMIN, PASSWORD, ask, console_broker, event_until, session
from tests.steps import connect, publish, subscribe, uid
from tests.test_admin import token_file

Cookie = dict[str, str]


def post(url: str, cookie: Cookie, csrf: str, path: str, body: dict) -> tuple[int, bytes]:
    status, _, said = ask(url, "POST", path, {**cookie, "X-CSRF-Token": csrf, "Content-Type": "application/json"},
                         orjson.dumps(body))
    return status, said


def entries(url: str, cookie: Cookie, query: str = "") -> list[dict]:
    status, _, body = ask(url, "GET", "/api/audit" + query, cookie)
    assert status == 200
    return orjson.loads(body)["rows"]


def test_every_action_is_audited_with_who_where_and_what(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path, tenants=("acme",),
                            config="max_inflight = 1\nmax_queued_messages = 2\n")
    cookie, csrf = session(url)
    event_until(url, cookie, lambda e: len(e["workers"]) == 2, what="both workers reporting")
    victim = f"<b>au-{uid()}</b>"  # HTML in a client id: the page shows it as text (the browser test)
    client = connect(b.port, victim)
    assert post(url, cookie, csrf, "/api/clients/disconnect", {"client_id": victim})[0] == 200
    client.read_until_closed()
    again = connect(b.port, victim)
    token = Path(token_file(b)).read_text().strip()
    status, _, _ = ask(metrics_url(b), "POST", "/clients/disconnect",
                       {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
                       orjson.dumps({"client_id": victim}))
    assert status == 200
    again.read_until_closed()
    offline = f"off-{uid()}"
    gone = connect(b.port, offline, clean=False)
    gone.send(p.DISCONNECT_PACKET)
    gone.read_until_closed()
    # a refused action is audited too: each is taken once what it acts on is there, seen by looking (not audited)
    wait_for(lambda: orjson.loads(ask(url, "GET", f"/api/sessions?prefix={offline}", cookie)[2])["rows"], 10,
             "the session offline")
    assert post(url, cookie, csrf, "/api/sessions/remove", {"client_id": offline})[0] == 200
    topic = f"audit/{uid()}"
    pub = connect(b.port)
    publish(pub, topic, b"kept", 0, retain=True)
    wait_for(lambda: ask(url, "GET", f"/api/retained/message?topic={topic}", cookie)[0] == 200, 10, "the retained one")
    assert post(url, cookie, csrf, "/api/retained/delete", {"topic": topic})[0] == 200
    status, said = post(url, cookie, csrf, "/api/trace/start", {"filter": topic + "/#"})
    assert status == 200
    assert post(url, cookie, csrf, "/api/trace/stop", {"id": orjson.loads(said)["id"]})[0] == 200
    sub = connect(b.port)
    assert subscribe(sub, 1, [(topic, 1)]) == [1]  # never acknowledges: its queue overflows
    for i in range(10):
        publish(pub, topic, b"m%d" % i, 1, packet_id=i + 1)
    event = event_until(url, cookie, lambda e: any(a["name"] == DROPPED for a in e["alarms"]), what="the drop alarm")
    alarm = next(a for a in event["alarms"] if a["name"] == DROPPED)
    assert alarm["acknowledged"] is None
    assert post(url, cookie, csrf, "/api/alarms/acknowledge", {**alarm, "raised": alarm["raised"] + 1})[0] == 404
    assert post(url, cookie, csrf, "/api/alarms/acknowledge", alarm)[0] == 200
    seen = event_until(url, cookie, lambda e: any(a["acknowledged_by"] == ADMIN for a in e["alarms"]),
                       what="the acknowledgement shown")
    shown = next(a for a in seen["alarms"] if a["name"] == DROPPED)
    assert shown["cleared"] is None and shown["acknowledged"] >= alarm["raised"]  # still listed, raised
    acme_cookie, acme_csrf = session(url, tenant="acme")
    assert post(url, acme_cookie, acme_csrf, "/api/retained/delete", {"topic": "nothing/here", "tenant": ""})[0] == 404

    wait_for(lambda: len(entries(url, cookie)) == 9, 10, "nine entries")
    done = entries(url, cookie)
    assert [(e["admin"], e["action"], e["tenant"], e["target"], e["outcome"]) for e in reversed(done)] == [
        (ADMIN, audit.DISCONNECT, "", victim, "disconnected"),
        (audit.ADMIN_API, audit.DISCONNECT, "", victim, "disconnected"),
        (ADMIN, audit.SESSION_REMOVE, "", offline, "removed"),
        (ADMIN, audit.RETAINED_DELETE, "", topic, "deleted"),
        (ADMIN, audit.TRACE_START, "", topic + "/#", f"started trace {orjson.loads(said)['id']}"),
        (ADMIN, audit.TRACE_STOP, "", topic + "/#", f"stopped trace {orjson.loads(said)['id']}"),
        (ADMIN, audit.ALARM_ACK, "", f"{DROPPED}", "not raised"),
        (ADMIN, audit.ALARM_ACK, "", f"{DROPPED}", "acknowledged"),
        (ADMIN, audit.RETAINED_DELETE, "acme", "nothing/here", "none there")]  # a tenant admin's: its own tenant
    assert {e["address"] for e in done} == {"127.0.0.1"} and done[0]["at"] >= done[-1]["at"]
    assert [e["action"] for e in entries(url, acme_cookie)] == [audit.RETAINED_DELETE]  # its tenant's only
    assert entries(url, acme_cookie, "?tenant=") == entries(url, acme_cookie)  # whatever it names
    assert [e["tenant"] for e in entries(url, cookie, "?tenant=acme")] == ["acme"]
    sub.close()
    pub.close()


def test_a_read_only_admin_sees_every_page_and_is_refused_every_action(start_broker: Callable[..., Broker],
                                                                        tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path)
    set_password(str(tmp_path / "admins"), "viewer", PASSWORD, n=CHEAP, role="read-only")
    assert (tmp_path / "admins").read_text().splitlines()[-1].endswith(" role=read-only")
    os.kill(b.proc.pid, signal.SIGHUP)  # the admins file again
    wait_for(lambda: "console: admins reloaded" in b.output(), 10, "the reload")
    cookie, csrf = session(url, user="viewer")
    pages = [path for feature in FEATURES for path, _name, _asset in feature.PAGES]
    for path in ["/", *pages]:
        status, _, page = ask(url, "GET", path, cookie)
        assert status == 200 and b"<nav class=read-only>" in page and b"viewer (read-only)" in page, path
    actions = [path for feature in FEATURES for method, path in feature.ROUTES if method == "POST"]
    assert len(actions) >= 7  # disconnect, session removal, retained delete, trace start/read/stop, ack
    for path in actions:
        assert post(url, cookie, csrf, path, {"client_id": "x", "topic": "x", "filter": "x", "id": 1, "name": "x",
                                              "subject": "", "raised": 1.0}) == \
            (403, b"viewer is read-only: looking only\n"), path
    assert entries(url, cookie) == []  # looking is allowed; nothing was done
    assert ask(url, "GET", "/api/audit", cookie)[0] == 200
    assert ask(url, "POST", "/logout", {**cookie, "X-CSRF-Token": csrf})[0] == 303  # logging out is no action
    admin_cookie, admin_csrf = session(url)
    assert post(url, admin_cookie, admin_csrf, "/api/retained/delete", {"topic": "x"})[0] == 404  # an admin acts


def test_the_audit_is_kept_across_a_router_restart(start_broker: Callable[..., Broker], tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path)
    cookie, csrf = session(url)
    topic = f"<script>alert(1)</script>/{uid()}"
    assert post(url, cookie, csrf, "/api/retained/delete", {"topic": topic})[0] == 404
    wait_for(lambda: entries(url, cookie), 10, "the entry")
    router = b.router()
    assert router is not None
    os.kill(router.pid, signal.SIGTERM)  # the acceptor starts it again, on the same store
    wait_for(lambda: (r := b.router()) is not None and r.pid != router.pid, 10, "a new router")
    found = wait_for(lambda: re.findall(r"console on (http://\S+)/", b.output())[1:], 10, "the new router's console")
    url = found[0]  # on a port of its own (console_port 0)
    cookie, csrf = session(url)
    kept = entries(url, cookie)
    assert [(e["seq"], e["admin"], e["action"], e["target"], e["outcome"]) for e in kept] == \
        [(1, ADMIN, audit.RETAINED_DELETE, topic, "none there")]
    assert post(url, cookie, csrf, "/api/retained/delete", {"topic": "again"})[0] == 404
    wait_for(lambda: [e["seq"] for e in entries(url, cookie)] == [2, 1], 10, "the next entry after the kept one")
