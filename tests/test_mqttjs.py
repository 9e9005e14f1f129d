"""Interoperability: mqtt.js (the Node.js client, protocolVersion 4) against the shared broker.

Each test runs one scenario of `tests/mqttjs/check.js`, which prints one JSON line of what its
clients saw; the assertions are here. Every wait in the script is bounded (10 s each, 40 s in all),
and the subprocess by TIMEOUT. Install the client with `npm ci --prefix tests/mqttjs` (`.ci/run`
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


def check(broker: Broker, scenario: str, *args: str) -> dict[str, Any]:
    """Run one scenario to its end; its `result` (what the mqtt.js clients saw)."""
    assert NODE is not None
    try:
        run = subprocess.run([NODE, str(MQTTJS / "check.js"), "127.0.0.1", str(broker.port), scenario, *args],
                             check=False, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"check.js {scenario} ran past {TIMEOUT} s:\n{e.stdout!r}\n{e.stderr!r}") from None
    lines = run.stdout.splitlines()
    assert lines, f"check.js {scenario} printed nothing (exit {run.returncode}):\n{run.stderr}"
    report = json.loads(lines[-1])
    assert run.returncode == 0 and report["ok"], \
        f"check.js {scenario} failed (exit {run.returncode}): {report}\n{run.stderr}"
    return report["result"]


def messages(received: list[dict[str, Any]]) -> list[tuple[str, str, int, bool]]:
    """(topic suffix after the run's base, payload, qos, retain) of each message, in arrival order."""
    return [(m["topic"].split("/", 2)[2], m["payload"], m["qos"], m["retain"]) for m in received]


@pytest.mark.parametrize("sub_qos", [0, 1, 2])
def test_round_trip_through_wildcards_at_each_qos(broker: Broker, sub_qos: int) -> None:
    """QoS 0, 1 and 2 publishes through two overlapping wildcard filters: each once, at min(pub, sub)."""
    result = check(broker, "roundtrip", str(sub_qos))
    assert result["granted"] == [sub_qos, sub_qos]
    assert sorted(messages(result["received"])) == [
        (f"q{qos}/x", f"hello at {qos}", min(qos, sub_qos), False) for qos in (0, 1, 2)]
    # the publisher's flows: PUBACK for QoS 1, PUBREC then PUBCOMP for QoS 2
    assert [p for p in result["publisher_packets"] if p.startswith("pub")] == ["puback", "pubrec", "pubcomp"]
    if sub_qos == 2:
        assert "pubrel" in result["subscriber_packets"]


def test_retained_message_is_set_delivered_and_cleared(broker: Broker) -> None:
    result = check(broker, "retained")
    assert result["granted"] == [1]
    assert messages(result["early"]) == [
        ("ret/a", "kept", 1, True),    # the retained one (it replaced "first"), with the retain flag
        ("ret/a", "live", 1, False),   # a retained publish to a subscriber already there: retain=0
        ("ret/a", "", 1, False),       # the clearing publish reaches it too
    ]
    # after the clear a new subscriber gets no retained message: its first one is the live marker
    assert messages(result["late"]) == [("ret/marker", "marker", 1, False)]


def test_will_after_a_destroyed_socket_and_not_after_a_clean_end(broker: Broker) -> None:
    result = check(broker, "will")
    # the clean end() came first: its will, had it been published, would have come by now
    assert sorted(messages(result["received"])) == [("will/doomed", "died", 1, False),
                                                    ("will/marker", "marker", 1, False)]


def test_persistent_session_gets_what_was_queued_while_offline(broker: Broker) -> None:
    result = check(broker, "session")
    assert result["first_session_present"] is False
    assert result["granted"] == [1]
    assert result["session_present"] is True
    assert messages(result["received"]) == [
        *[("session/x", f"offline {n}", 1, False) for n in range(5)],
        ("session/x", "online", 1, False),
    ]
    assert result["discard_session_present"] is False  # clean: true: always 0 [MQTT-3.2.2-1]


def test_unsubscribe_stops_delivery(broker: Broker) -> None:
    result = check(broker, "unsubscribe")
    assert result["granted"] == [1, 1]
    assert result["unsuback"] is True
    assert messages(result["received"]) == [("unsub/a", "before", 1, False), ("marker", "marker", 1, False)]
