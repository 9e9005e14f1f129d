"""Read access judged at every delivery: a resumed session under another user name, rights
taken away by a reload, and "everything except X" ACLs, with 3.1.1 and 5.0 subscribers.

Nothing waits for an absence: a withheld message is followed by one the receiver may read, from the
same publisher and for the same session, so the first message that arrives shows whether the
earlier one was withheld.
"""

from __future__ import annotations

import re
import signal
import urllib.request
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as paho
import pytest

from plexmq.workers.auth.passwords import set_password
from tests.conftest import Broker, wait_for
from tests.mqtt import Client
from tests.steps import uid

CHEAP = 2 ** 10  # scrypt cost for test users
VERSIONS = [pytest.param(paho.MQTTv311, id="3.1.1"), pytest.param(paho.MQTTv5, id="5.0")]


def secured(tmp_path: Path, start_broker: Callable[..., Broker], acl: str, anonymous: bool = False) -> Broker:
    """Two workers (deliveries cross the router), users ops, guest and writer (password = name)."""
    for name in ("ops", "guest", "writer"):
        set_password(str(tmp_path / "passwd"), name, name, n=CHEAP)
    (tmp_path / "acl").write_text(acl)
    conf = tmp_path / "plexmq.toml"
    conf.write_text(f'password_file = "{tmp_path / "passwd"}"\nacl_file = "{tmp_path / "acl"}"\n'
                    f"allow_anonymous = {'true' if anonymous else 'false'}\n")
    return start_broker("--workers", "2", "--config", str(conf))


def persistent(port: int, client_id: str, user: str, protocol: int) -> Client:
    """A client of a session that outlives its connection, resumed if it exists."""
    return Client(port, client_id, clean=False, protocol=protocol, username=user, password=user, session_expiry=3600)


def withheld(b: Broker) -> float:
    found = wait_for(lambda: re.search(r"metrics on (http://\S+)/metrics", b.output()), 10, "the metrics line")
    with urllib.request.urlopen(f"{found.group(1)}/metrics", timeout=5) as response:
        text = response.read().decode()
    total = re.search(r"^plexmq_messages_withheld_total (\S+)$", text, re.M)  # none before the first snapshot
    return float(total.group(1)) if total else 0.0


@pytest.mark.parametrize("protocol", VERSIONS)
def test_a_session_resumed_by_another_user_gets_only_what_that_user_may_read(
        tmp_path: Path, start_broker: Callable[..., Broker], protocol: int) -> None:
    """ops may read secret/#, guest may not: guest resuming ops's session (its own valid password,
    the same client id) gets neither the queued nor the live secret messages, as with mosquitto;
    each withheld QoS 1 message is finished for the session, so ops does not get it later either."""
    b = secured(tmp_path, start_broker, "user ops\ntopic read secret/#\ntopic readwrite allowed/#\n"
                                        "user guest\ntopic readwrite allowed/#\nuser writer\ntopic write #\n")
    cid = f"device-{uid()}"
    ops = persistent(b.port, cid, "ops", protocol)
    assert ops.subscribe("secret/#", 1) == [1] and ops.subscribe("allowed/#", 1) == [1]
    ops.disconnect()
    writer = Client(b.port, f"w-{uid()}", username="writer", password="writer")
    writer.publish("secret/queued", b"for ops only", 1)
    writer.publish("allowed/queued", b"for anyone", 1)
    guest = persistent(b.port, cid, "guest", protocol)
    assert guest.session_present
    first = guest.get()
    assert (first.topic, first.payload) == ("allowed/queued", b"for anyone")
    writer.publish("secret/live", b"for ops only", 1)
    writer.publish("allowed/live", b"for anyone", 1)
    assert guest.get().topic == "allowed/live"
    guest.disconnect()
    ops = persistent(b.port, cid, "ops", protocol)
    writer.publish("allowed/after", b"marker", 1)
    assert ops.get().topic == "allowed/after"  # the withheld ones were finished, not kept for ops
    writer.publish("secret/again", b"ops reads it", 1)
    assert ops.get().topic == "secret/again"  # ops's own rights are judged anew too
    ops.disconnect()
    writer.disconnect()
    wait_for(lambda: withheld(b) == 2, 10, "/metrics to count both withheld messages")


@pytest.mark.parametrize("protocol", VERSIONS)
def test_everything_except_one_topic(tmp_path: Path, start_broker: Callable[..., Broker], protocol: int) -> None:
    """`topic readwrite #` and `topic deny test/nosubscribe`: `#`, `+/+` and a shared group are
    granted, and the denied topic never arrives: live, retained at subscribe, or as a will."""
    b = secured(tmp_path, start_broker, "topic readwrite #\ntopic deny test/nosubscribe\n"
                                        "user writer\ntopic write #\n", anonymous=True)
    reader, levels, member = (Client(b.port, f"r-{uid()}", protocol=protocol) for _ in range(3))
    granted = [reader.subscribe("#", 1)[0], levels.subscribe("+/+", 0)[0], member.subscribe("$share/g/test/+", 1)[0]]
    assert granted == [1, 0, 1]
    writer = Client(b.port, f"w-{uid()}", username="writer", password="writer")
    for qos in (0, 1, 2):
        writer.publish("test/nosubscribe", f"denied {qos}".encode(), qos)
    writer.publish("test/nosubscribe", b"denied retained", 1, retain=True)
    writer.publish("test/other", b"allowed retained", 1, retain=True)
    for c in (reader, levels, member):
        assert c.get().topic == "test/other"
    dying_id = f"d-{uid()}"
    dying = Client(b.port, dying_id, username="writer", password="writer", will=("test/nosubscribe", b"will", 1, False))
    dying.drop()
    wait_for(lambda: f"client {dying_id} (" in b.output(), 10, "the will's client to be gone")
    writer.publish("test/after-will", b"marker", 1)
    for c in (reader, levels, member):
        assert c.get().topic == "test/after-will"
    late = Client(b.port, f"l-{uid()}", protocol=protocol)
    assert late.subscribe("test/#", 1) == [1]
    retained = late.get()
    assert (retained.topic, retained.retain) == ("test/other", True)
    writer.publish("test/marker", b"after the retained ones", 1)
    assert late.get().topic == "test/marker"
    for c in (reader, levels, member, writer, late):
        c.disconnect()


def test_rights_taken_away_by_a_reload_stop_deliveries(tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    """A subscription granted under the old rules delivers only what the new rules allow, at once,
    to a clean session and a persistent one alike."""
    acl = "user ops\ntopic read news/#\nuser writer\ntopic write #\n"
    b = secured(tmp_path, start_broker, acl)
    clean = Client(b.port, f"c-{uid()}", username="ops", password="ops")
    kept = persistent(b.port, f"p-{uid()}", "ops", paho.MQTTv311)
    assert clean.subscribe("news/#", 1) == [1] and kept.subscribe("news/#", 1) == [1]
    writer = Client(b.port, f"w-{uid()}", username="writer", password="writer")
    writer.publish("news/private", b"before", 1)
    assert clean.get().payload == b"before" and kept.get().payload == b"before"
    (tmp_path / "acl").write_text(acl.replace("topic read news/#", "topic read news/public/#"))
    b.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: b.output().count("reloaded its settings") >= 2, 10, "both workers to reload")
    writer.publish("news/private", b"after", 1)
    writer.publish("news/public/x", b"still allowed", 1)
    for c in (clean, kept):
        got = c.get()
        assert (got.topic, got.payload) == ("news/public/x", b"still allowed")
        c.disconnect()
    writer.disconnect()
