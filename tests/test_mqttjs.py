"""Interoperability: mqtt.js (the Node.js client, protocolVersion 4 and 5) against the shared broker.

Each test runs one scenario of `tests/mqttjs/check.js` at one protocol version (the scenarios both
versions share run at each; the 5.0 ones, and 3.1.1 beside 5.0, at 5), which prints one JSON line of
what its clients saw; the assertions are here. The 5.0 features, end to end with a real v5 client:
CONNACK properties, assigned client ids, topic aliases, message properties passed through
(and left out for 3.1.1 subscribers), subscription options (no local, retain as published, retain
handling) and identifiers, shared subscriptions over 5.0 and 3.1.1 members, delayed wills with
properties, session expiry set at DISCONNECT. Where a test shows that something was not delivered, a
marker message that had to come next stands in for a wait. Every wait in the script is bounded (10 s
each, 40 s in all), and the subprocess by TIMEOUT. Install the client with `npm ci --prefix tests/mqttjs` (`.ci/run`
does, where npm is available).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pytest

from tests.conftest import ROOT, Broker

MQTTJS = ROOT / "tests" / "mqttjs"
NODE = shutil.which("node")
TIMEOUT = 60  # seconds: above check.js's own 40 s deadline

pytestmark = [
    pytest.mark.skipif(NODE is None, reason="node (Node.js) not installed"),
    pytest.mark.skipif(not (MQTTJS / "node_modules" / "mqtt").is_dir(),
                       reason="mqtt.js not installed: run `npm ci --prefix tests/mqttjs`"),
]


def check(broker: Broker, version: int, scenario: str, *args: str) -> dict[str, Any]:
    """Run one scenario with mqtt.js clients of `version` (4 or 5) to its end; its `result` (what they saw)."""
    assert NODE is not None
    try:
        run = subprocess.run([NODE, str(MQTTJS / "check.js"), "127.0.0.1", str(broker.port), str(version), scenario,
                              *args],
                             check=False, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"check.js {version} {scenario} ran past {TIMEOUT} s:\n{e.stdout!r}\n{e.stderr!r}") from None
    lines = run.stdout.splitlines()
    assert lines, f"check.js {version} {scenario} printed nothing (exit {run.returncode}):\n{run.stderr}"
    report = json.loads(lines[-1])
    assert run.returncode == 0 and report["ok"], \
        f"check.js {version} {scenario} failed (exit {run.returncode}): {report}\n{run.stderr}"
    return report["result"]


def messages(received: list[dict[str, Any]]) -> list[tuple[str, str, int, bool]]:
    """(topic suffix after the run's base, payload, qos, retain) of each message, in arrival order."""
    return [(m["topic"].split("/", 2)[2], m["payload"], m["qos"], m["retain"]) for m in received]


VERSIONS = pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])


@VERSIONS
@pytest.mark.parametrize("sub_qos", [0, 1, 2])
def test_round_trip_through_wildcards_at_each_qos(broker: Broker, version: int, sub_qos: int) -> None:
    """QoS 0, 1 and 2 publishes through two overlapping wildcard filters: each once, at min(pub, sub)."""
    result = check(broker, version, "roundtrip", str(sub_qos))
    assert result["granted"] == [sub_qos, sub_qos]
    assert sorted(messages(result["received"])) == [
        (f"q{qos}/x", f"hello at {qos}", min(qos, sub_qos), False) for qos in (0, 1, 2)]
    # the publisher's flows: PUBACK for QoS 1, PUBREC then PUBCOMP for QoS 2
    assert [p for p in result["publisher_packets"] if p.startswith("pub")] == ["puback", "pubrec", "pubcomp"]
    if sub_qos == 2:
        assert "pubrel" in result["subscriber_packets"]
    assert "disconnect" not in result["publisher_packets"] + result["subscriber_packets"]


@VERSIONS
def test_retained_message_is_set_delivered_and_cleared(broker: Broker, version: int) -> None:
    result = check(broker, version, "retained")
    assert result["granted"] == [1]
    assert messages(result["early"]) == [
        ("ret/a", "kept", 1, True),    # the retained one (it replaced "first"), with the retain flag
        ("ret/a", "live", 1, False),   # a retained publish to a subscriber already there: retain=0
        ("ret/a", "", 1, False),       # the clearing publish reaches it too
    ]
    # after the clear a new subscriber gets no retained message: its first one is the live marker
    assert messages(result["late"]) == [("ret/marker", "marker", 1, False)]


@VERSIONS
def test_will_after_a_destroyed_socket_and_not_after_a_clean_end(broker: Broker, version: int) -> None:
    result = check(broker, version, "will")
    # the clean end() came first: its will, had it been published, would have come by now
    expected = [("will/doomed", "died", 1, False), ("will/marker", "marker", 1, False)]
    if version == 5:  # a DISCONNECT with reason code 0x04 asks for the will
        expected.append(("will/farewell", "asked for", 1, False))
    assert sorted(messages(result["received"])) == sorted(expected)


@VERSIONS
def test_persistent_session_gets_what_was_queued_while_offline(broker: Broker, version: int) -> None:
    result = check(broker, version, "session")
    assert result["first_session_present"] is False
    assert result["granted"] == [1]
    assert result["session_present"] is True
    assert messages(result["received"]) == [
        *[("session/x", f"offline {n}", 1, False) for n in range(5)],
        ("session/x", "online", 1, False),
    ]
    if version == 5:  # session expiry 0 at DISCONNECT ended it: nothing to resume
        assert result["ended_session_present"] is False
    assert result["discard_session_present"] is False  # clean: true: always 0 [MQTT-3.2.2-1]


@VERSIONS
def test_unsubscribe_stops_delivery(broker: Broker, version: int) -> None:
    result = check(broker, version, "unsubscribe")
    assert result["granted"] == [1, 1]
    assert result["unsuback"] is True
    if version == 5:  # success for the filter it had, 0x11 (no subscription existed) for the other
        assert result["unsuback_codes"] == [0x00, 0x11]
    assert messages(result["received"]) == [("unsub/a", "before", 1, False), ("marker", "marker", 1, False)]


# -- MQTT 5.0 only ------------------------------------------------------------------------------------


def test_v5_connack_tells_the_limits_and_what_is_not_offered(broker: Broker) -> None:
    result = check(broker, 5, "connack")
    assert result["reason_code"] == 0
    assert result["session_present"] is False
    assert result["properties"] == {  # what is available is said explicitly
        "receiveMaximum": 1024,
        "maximumPacketSize": 1048576,
        "topicAliasMaximum": 10,
        "retainAvailable": True,
        "wildcardSubscriptionAvailable": True,
        "subscriptionIdentifiersAvailable": True,
        "sharedSubscriptionAvailable": True,
    }


def test_v5_empty_client_id_is_assigned_one(broker: Broker) -> None:
    result = check(broker, 5, "assigned")
    first, second = result["assigned"]
    assert isinstance(first, str) and first and isinstance(second, str) and second
    assert first != second
    assert result["granted"] == [1]
    assert messages(result["received"]) == [("assigned", "to the assigned", 1, False)]


def test_v5_topic_aliases_from_the_client_are_resolved_per_connection(broker: Broker) -> None:
    result = check(broker, 5, "alias")
    assert result["granted"] == [2]
    # mqtt.js sent the alias alone (an empty topic) where the scenario asked it to
    assert [(p["topic"].rsplit("/", 1)[-1] if p["topic"] else "", p.get("alias")) for p in result["sent"]] == [
        ("a", 1), ("", 1), ("b", 10), ("", 10), ("", 1), ("c", 1), ("", 1), ("a", None)]
    # every message reaches the subscriber under its full topic name (no alias towards clients yet)
    assert sorted(messages(result["received"])) == sorted([
        ("alias/a", "a set 1", 1, False),
        ("alias/a", "a by 1", 1, False),
        ("alias/b", "b set 10", 0, False),
        ("alias/b", "b by 10", 2, False),
        ("alias/d", "d set 1 elsewhere", 1, False),
        ("alias/a", "a by 1 again", 0, False),  # another connection's alias 1 changed nothing here
        ("alias/c", "c set 1", 1, False),
        ("alias/c", "c by 1", 1, False),
        ("alias/a", "a plain", 2, False),
        ("alias/d", "d by 1", 1, False),
    ])
    assert not any("topicAlias" in m.get("properties", {}) for m in result["received"])
    # (an alias never set, 0x82: mqtt.js will not send one; tests/test_mqtt5.py sends it as raw bytes)


def test_v311_and_v5_clients_exchange_messages_both_ways(broker: Broker) -> None:
    result = check(broker, 5, "mixed")
    assert result["granted"] == {"4": [2], "5": [2]}
    expected = sorted((f"mixed/from{v}", payload, qos, False)
                      for v in (4, 5)
                      for payload, qos in [*((f"burst {n} from {v}", 0) for n in range(10)),
                                           (f"at 1 from {v}", 1), (f"at 2 from {v}", 2)])
    for v in ("4", "5"):
        assert sorted(messages(result["received"][v])) == expected, f"at the {v} client"


def test_v5_message_properties_reach_v5_subscribers_as_sent_and_v311_ones_without(broker: Broker) -> None:
    result = check(broker, 5, "props")
    assert result["granted"] == {"4": [1], "5": [1]}
    sent = result["sent"]
    assert sent["userProperties"] == {"dup": ["first", "second", "first"], "unit": "°C", "empty": ""}
    expected = [("props/at0", '{"qos": 0, "t": "21.5 °C"}', 0, False),
                ("props/at1", '{"qos": 1, "t": "21.5 °C"}', 1, False),
                ("props/legacy", "from 3.1.1", 1, False)]
    for v in ("4", "5"):
        assert sorted(messages(result["received"][v])) == expected, f"at the {v} subscriber"
    by_topic = {m["topic"].rsplit("/", 1)[-1]: m for m in result["received"]["5"]}
    for name in ("at0", "at1"):  # each property as sent: the repeated key's values in order, bytes exact
        properties = dict(by_topic[name]["properties"])
        expiry = properties.pop("messageExpiryInterval")
        assert 3590 <= expiry <= sent["messageExpiryInterval"]  # what is left of it
        assert properties == {key: value for key, value in sent.items() if key != "messageExpiryInterval"}, name
    assert "properties" not in by_topic["legacy"]  # a 3.1.1 publisher's message carries none
    assert not any("properties" in m for m in result["received"]["4"])  # 3.1.1: never any


def test_v5_subscription_options_and_identifiers(broker: Broker) -> None:
    result = check(broker, 5, "subopts")
    # no local: the own "own" never came back (the marker after it came first), another client's did;
    # with a plain subscription matching too, the own message came back once
    assert result["no_local_granted"] == [1, 1]
    assert messages(result["no_local"]) == [
        ("mark/local", "after own", 1, False),
        ("nl/t", "from another", 1, False),
        ("nl/t", "own again", 1, False),
        ("mark/local", "after own again", 1, False),
    ]
    assert [m["payload"] for m in result["no_local_other"]] == ["own", "from another", "own again"]
    # retain as published: the live retained publish (and the clearing one) keeps its flag only with rap
    assert result["rap_granted"] == {"kept": [1], "cleared": [1], "legacy": [1]}
    for name, flag in (("kept", True), ("cleared", False), ("legacy", False)):
        assert messages(result["retain_as_published"][name]) == [
            ("rap/r", "retained", 1, flag), ("rap/r", "", 1, flag)], name
    # retain handling: the retained message (retain flag set) at each SUBSCRIBE with 0, for a new
    # subscription only with 1, never with 2
    retained = [("rh/r", "kept", 1, True)]
    assert [(step["rh"], step["what"], step["granted"], messages(step["received"]))
            for step in result["retain_handling"]] == [
        (0, "new", [1], retained),
        (0, "again", [1], retained),
        (1, "new", [1], retained),
        (1, "again", [1], []),
        (2, "new", [1], []),
        (2, "again", [1], []),
    ]
    # subscription identifiers: one delivery carrying both matching ones (at the higher QoS), one where
    # only the identified subscription of two matching ones has one, none on the marker
    assert result["ids_granted"] == [0, 1, 1]
    assert messages(result["identifiers"]) == [
        ("id/a", "two ids", 1, False), ("id/plain/x", "one id", 1, False), ("mark/ids", "after ids", 1, False)]
    ids = [m.get("properties", {}).get("subscriptionIdentifier") for m in result["identifiers"]]
    assert sorted(ids[0]) == [5, 268435455]  # mqtt.js: a list when the PUBLISH has several
    assert ids[1:] == [268435455, None]


def test_v5_shared_subscription_round_robin_over_v5_and_v311_members(broker: Broker) -> None:
    result = check(broker, 5, "shared")
    assert result["granted"] == [[1], [1], [1]]
    # member n (5.0, 3.1.1, 5.0 in the order they joined) got messages n and n + 3, in order, and
    # nothing more before its marker
    for n, got in enumerate(result["members"]):
        assert messages(got) == [("shared/x", f"m{n}", 1, False), ("shared/x", f"m{n + 3}", 1, False)], n
    assert messages(result["plain"]) == [("shared/x", f"m{n}", 1, False) for n in range(6)]


def test_v5_delayed_will_carries_its_properties_and_none_for_a_client_back_in_time(broker: Broker) -> None:
    result = check(broker, 5, "willdelay")
    assert result["back_session_present"] is True
    # the will of "back" never came, not even when its session ended: the late will, then the marker
    assert messages(result["received"]) == [("wd/late", "gone", 1, False), ("wd/marker", "marker", 1, False)]
    assert result["received"][0]["properties"] == result["sent"] == {
        "userProperties": {"why": ["lost", "again"], "who": "plexmq"}, "contentType": "text/plain"}
    assert result["will_after_ms"] >= 900  # not before its 1 s delay (counted from the socket's close)


def test_v5_session_expiry_set_to_zero_at_disconnect_ends_the_session(broker: Broker) -> None:
    result = check(broker, 5, "expiry")
    # the session that kept its 60 s is resumed with what was queued; the one ended at DISCONNECT is not
    assert result["session_present"] == {"ended": False, "kept": True}
    assert result["received"]["ended"] == []
    assert messages(result["received"]["kept"]) == [("expiry/x", "while away", 1, False)]
