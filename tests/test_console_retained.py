"""The console's retained messages (issue 25) over HTTP on the real broker: browsed by topic filter,
viewed as text, JSON and hex (with their MQTT 5 properties, a large payload cut), deleted as an empty
retained PUBLISH would clear them (from the store too: a restart does not bring one back) but with
nothing delivered to anyone; a delete without the CSRF token refused; a tenant admin sees and deletes
only the tenant's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlencode

import orjson
import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.conftest import Broker
from tests.console import ask, console_broker, session
from tests.mqtt import Client
from tests.steps import connect, subscribe, sync, uid

Cookie = dict[str, str]


def listed(url: str, cookie: Cookie, topic_filter: str | None = None, **more: str) -> dict:
    fields = {**({} if topic_filter is None else {"filter": topic_filter}), **more}
    status, _, body = ask(url, "GET", f"/api/retained?{urlencode(fields)}", cookie)
    assert status == 200, body
    return orjson.loads(body)


def viewed(url: str, cookie: Cookie, topic: str, tenant: str = "") -> tuple[int, dict | None]:
    status, _, body = ask(url, "GET", f"/api/retained/message?{urlencode({'topic': topic, 'tenant': tenant})}", cookie)
    return status, orjson.loads(body) if status == 200 else None


def delete(url: str, cookie: Cookie, csrf: str | None, topic: str, tenant: str = "") -> tuple[int, bytes]:
    headers = {**cookie, "Content-Type": "application/json", **({} if csrf is None else {"X-CSRF-Token": csrf})}
    status, _, said = ask(url, "POST", "/api/retained/delete", headers, orjson.dumps({"topic": topic, "tenant": tenant}))
    return status, said


def test_retained_messages_are_browsed_viewed_and_deleted_for_good(start_broker: Callable[..., Broker],
                                                                    tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    b, url = console_broker(start_broker, tmp_path, "--data-dir", data)
    cookie, csrf = session(url)
    base = f"retained/{uid()}"
    document, binary, words, big = f"{base}/a/json", f"{base}/a/bin", f"{base}/b/text", f"{base}/big"
    publisher = Client(b.port, protocol=paho.MQTTv5)
    props = Properties(PacketTypes.PUBLISH)
    props.ContentType = "application/json"
    props.PayloadFormatIndicator = 1
    props.UserProperty = [("site", "north")]
    publisher.publish(document, b'{"t":21.5,"ok":true}', qos=1, retain=True, properties=props)
    publisher.publish(binary, bytes(range(256)), qos=1, retain=True)
    publisher.publish(words, "héllo".encode(), qos=1, retain=True)
    publisher.publish(big, b"x" * 100_000, qos=1, retain=True)

    page = listed(url, cookie, f"{base}/a/#")
    assert page["fields"] == ["topic", "qos", "size", "expires_at", "tenant"]
    assert (page["total"], page["whole"]) == (2, True)
    assert sorted(page["messages"]) == [[binary, 1, 256, 0, ""], [document, 1, 20, 0, ""]]
    assert listed(url, cookie)["total"] == 4  # the default filter: "#"
    assert sorted(row[0] for row in listed(url, cookie, f"{base}/+/text")["messages"]) == [words]
    assert ask(url, "GET", "/api/retained?filter=a/%23/b", cookie)[0] == 400

    status, shown = viewed(url, cookie, document)
    assert status == 200 and shown is not None
    assert shown["text"] == '{"t":21.5,"ok":true}' and shown["json"] == '{\n  "t": 21.5,\n  "ok": true\n}'
    assert shown["hex"] == b'{"t":21.5,"ok":true}'.hex() and not shown["cut"]
    assert shown["properties"]["content_type"] == "application/json"
    assert shown["properties"]["payload_format_indicator"] == 1
    assert shown["properties"]["user_properties"] == [["site", "north"]]
    status, shown = viewed(url, cookie, binary)
    assert status == 200 and shown is not None
    assert (shown["text"], shown["json"], shown["hex"], shown["size"]) == (None, None, bytes(range(256)).hex(), 256)
    status, shown = viewed(url, cookie, words)
    assert status == 200 and shown is not None and (shown["text"], shown["json"]) == ("héllo", None)
    status, shown = viewed(url, cookie, big)
    assert status == 200 and shown is not None
    assert (shown["cut"], shown["size"], len(shown["hex"]), shown["json"]) == (True, 100_000, 2 * 65_536, None)
    assert shown["text"] == "x" * 65_536

    live = connect(b.port)  # subscribed while the message is deleted
    subscribe(live, 1, [(f"{base}/#", 1)])
    assert len(sync(live)) == 4  # the retained messages a new subscription gets
    assert delete(url, cookie, None, document)[0] == 403
    assert delete(url, cookie, "guessed", document)[0] == 403
    assert viewed(url, cookie, document)[0] == 200  # the refused ones did nothing
    assert delete(url, cookie, csrf, document) == (200, f"deleted the retained message on {document!r}\n".encode())
    assert "console: 'ops' from 127.0.0.1: deleted the retained message on" in b.output()
    assert delete(url, cookie, csrf, document)[0] == 404
    assert viewed(url, cookie, document)[0] == 404
    assert sorted(row[0] for row in listed(url, cookie, f"{base}/a/#")["messages"]) == [binary]
    assert sync(live) == []  # nothing delivered: not even the empty retained PUBLISH a client would send
    late = connect(b.port)
    subscribe(late, 1, [(document, 1)])
    assert sync(late) == []
    live.close()
    late.close()
    publisher.disconnect()

    b.stop()
    b, url = console_broker(start_broker, tmp_path, "--data-dir", data)
    again = connect(b.port)
    subscribe(again, 1, [(f"{base}/#", 1)])
    assert sorted(pub.topic for pub in sync(again)) == sorted([binary, words, big])  # the store kept the delete
    cookie, _csrf = session(url)
    assert listed(url, cookie)["total"] == 3
    again.close()


def test_a_tenant_admin_sees_and_deletes_only_the_tenants_retained_messages(start_broker: Callable[..., Broker],
                                                                             tmp_path: Path) -> None:
    b, url = console_broker(start_broker, tmp_path, tenants=("acme", "beta"))
    topic = f"shared/{uid()}"  # the same topic in both tenants: two messages
    for tenant in ("acme", "beta"):
        publisher = Client(b.port, username=f"dev@{tenant}")
        publisher.publish(topic, tenant.encode(), qos=1, retain=True)
        publisher.disconnect()
    acme, acme_csrf = session(url, "acme")
    admin, _csrf = session(url)

    assert listed(url, acme)["messages"] == [[topic, 1, 4, 0, "acme"]]
    assert listed(url, acme, tenant="beta")["messages"] == [[topic, 1, 4, 0, "acme"]]  # its own, whatever it asks
    status, shown = viewed(url, acme, topic, "beta")
    assert status == 200 and shown is not None and (shown["tenant"], shown["text"]) == ("acme", "acme")
    assert sorted(row[4] for row in listed(url, admin)["messages"]) == ["acme", "beta"]  # every tenant's
    assert listed(url, admin, tenant="beta")["messages"] == [[topic, 1, 4, 0, "beta"]]

    status, _ = delete(url, acme, acme_csrf, topic, "beta")  # deletes acme's, the one it may
    assert status == 200
    assert viewed(url, admin, topic, "beta")[0] == 200  # beta's is still there
    assert viewed(url, admin, topic, "acme")[0] == 404
    assert delete(url, acme, acme_csrf, topic, "beta")[0] == 404  # and beta's cannot be reached
    assert viewed(url, acme, topic, "beta")[0] == 404
    assert viewed(url, admin, topic, "beta")[0] == 200
