"""Interoperability: the mosquitto command-line clients (libmosquitto) against the shared broker.

mosquitto_sub runs with `-d` (its packet log tells when SUBACK came) and `-F` (one parseable line per
message); every wait is bounded by `-C N -W 10` and by subprocess timeouts.
"""

from __future__ import annotations

import queue
import shutil
import signal
import subprocess
import threading
import uuid
from collections.abc import Iterator

import pytest

from tests.conftest import Broker

pytestmark = pytest.mark.skipif(shutil.which("mosquitto_sub") is None or shutil.which("mosquitto_pub") is None,
                                reason="mosquitto-clients not installed")

WAIT = 10  # seconds: -W for mosquitto_sub, and the bound of every wait here
FORMAT = "MSG %t|%q|%r|%p"  # topic, QoS, retain flag, payload


def unique(name: str) -> str:
    return f"interop/{name}/{uuid.uuid4().hex[:8]}"


class Sub:
    """A running mosquitto_sub whose output lines land in a queue the test can wait on."""

    def __init__(self, broker: Broker, *args: str) -> None:
        # stdbuf: mosquitto_sub's stdout is a pipe here, so without it the lines come only at exit
        self.proc = subprocess.Popen(
            ["stdbuf", "-oL", "mosquitto_sub", "-h", "127.0.0.1", "-p", str(broker.port), "-d",
             "-W", str(WAIT), "-F", FORMAT, *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_line(self, needle: str, timeout: float = WAIT) -> str:
        """The next output line containing `needle` (lines before it are kept in `seen`)."""
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"mosquitto_sub printed no line with {needle!r}; it printed:\n"
                                     + "\n".join(self.seen)) from None
            self.seen.append(line)
            if needle in line:
                return line

    def subscribed(self) -> None:
        self.wait_line("received SUBACK")

    def messages(self) -> list[tuple[str, int, bool, str]]:
        """Wait for mosquitto_sub to exit 0 (after its -C count) and return (topic, qos, retain, payload)."""
        try:
            code = self.proc.wait(WAIT + 5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("mosquitto_sub did not exit") from None
        self.reader.join(5)
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        assert code == 0, f"mosquitto_sub exited with {code} (27: timed out); it printed:\n" + "\n".join(self.seen)
        found = []
        for line in self.seen:
            if line.startswith("MSG "):
                topic, qos, retain, payload = line[4:].split("|", 3)
                found.append((topic, int(qos), retain == "1", payload))
        return found

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(5)


@pytest.fixture
def subs() -> Iterator[list[Sub]]:
    """Every Sub a test starts, killed at the end if it still runs."""
    started: list[Sub] = []
    yield started
    for s in started:
        s.kill()


def sub(broker: Broker, started: list[Sub], *args: str) -> Sub:
    s = Sub(broker, *args)
    started.append(s)
    return s


def pub(broker: Broker, *args: str) -> str:
    """Run mosquitto_pub to completion (it exits 0 once its QoS flow is complete); its -d output."""
    result = subprocess.run(
        ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.port), "-d", *args],
        capture_output=True, text=True, timeout=WAIT)
    assert result.returncode == 0, f"mosquitto_pub exited with {result.returncode}:\n{result.stdout}{result.stderr}"
    return result.stdout


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_round_trip_at_each_qos(broker: Broker, subs: list[Sub], qos: int) -> None:
    topic = unique(f"qos{qos}")
    s = sub(broker, subs, "-t", topic, "-q", str(qos), "-C", "1")
    s.subscribed()
    out = pub(broker, "-t", topic, "-q", str(qos), "-m", f"hello at {qos}")
    expected_acks = {0: [], 1: ["received PUBACK"], 2: ["received PUBREC", "received PUBCOMP"]}[qos]
    for ack in expected_acks:
        assert ack in out, out
    assert s.messages() == [(topic, qos, False, f"hello at {qos}")]
    if qos == 2:
        assert any("received PUBREL" in line for line in s.seen), "\n".join(s.seen)


def test_qos_is_downgraded_to_the_subscription(broker: Broker, subs: list[Sub]) -> None:
    topic = unique("downgrade")
    s = sub(broker, subs, "-t", topic, "-q", "1", "-C", "1")
    s.subscribed()
    pub(broker, "-t", topic, "-q", "2", "-m", "two becomes one")
    assert s.messages() == [(topic, 1, False, "two becomes one")]


def test_retained_message_is_kept_replaced_and_cleared(broker: Broker, subs: list[Sub]) -> None:
    base = unique("retain")
    pub(broker, "-t", f"{base}/a", "-q", "1", "-r", "-m", "first")
    pub(broker, "-t", f"{base}/a", "-q", "1", "-r", "-m", "second")
    s = sub(broker, subs, "-t", f"{base}/#", "-q", "1", "-C", "1")
    assert s.messages() == [(f"{base}/a", 1, True, "second")]

    # a live subscriber gets the retained publish with retain=0
    s = sub(broker, subs, "-t", f"{base}/a", "-C", "2")
    s.subscribed()
    pub(broker, "-t", f"{base}/a", "-r", "-m", "third")
    assert s.messages() == [(f"{base}/a", 0, True, "second"), (f"{base}/a", 0, False, "third")]

    # an empty retained payload clears it: a new subscriber's first message is a later live one
    pub(broker, "-t", f"{base}/a", "-r", "-n")
    s = sub(broker, subs, "-t", f"{base}/#", "-C", "1")
    s.subscribed()
    pub(broker, "-t", f"{base}/marker", "-m", "marker")
    assert s.messages() == [(f"{base}/marker", 0, False, "marker")]


def test_persistent_session_keeps_subscription_and_queues_while_offline(broker: Broker, subs: list[Sub]) -> None:
    topic = unique("session")
    client_id = f"interop-{uuid.uuid4().hex[:8]}"
    s = sub(broker, subs, "-c", "-i", client_id, "-t", topic, "-q", "1", "-E")  # -E: exit after SUBACK
    assert s.messages() == []
    for n in range(3):
        pub(broker, "-t", topic, "-q", "1", "-m", f"offline {n}")
    s = sub(broker, subs, "-c", "-i", client_id, "-q", "1", "-C", "3", "-t", topic)
    assert s.messages() == [(topic, 1, False, f"offline {n}") for n in range(3)]
    # clean session 1 with the same id discards the session: nothing is queued for it any more
    s = sub(broker, subs, "-i", client_id, "-t", f"{topic}/unused", "-E")
    s.messages()
    pub(broker, "-t", topic, "-q", "1", "-m", "after the discard")
    s = sub(broker, subs, "-c", "-i", client_id, "-q", "1", "-C", "1", "-t", f"{topic}/marker")
    s.subscribed()
    pub(broker, "-t", f"{topic}/marker", "-q", "1", "-m", "marker")
    assert s.messages() == [(f"{topic}/marker", 1, False, "marker")]
    sub(broker, subs, "-i", client_id, "-t", f"{topic}/unused", "-E").messages()  # leave no session behind


def test_will_is_published_on_an_unclean_close_only(broker: Broker, subs: list[Sub]) -> None:
    base = unique("will")
    watcher = sub(broker, subs, "-t", f"{base}/#", "-q", "1", "-C", "2")
    watcher.subscribed()
    # a clean DISCONNECT: its will must not be published
    pub(broker, "-t", f"{base}/marker", "-q", "1", "-m", "marker",
        "--will-topic", f"{base}/will", "--will-payload", "clean exit", "--will-qos", "1")
    # a client that dies without DISCONNECT: its will is published
    doomed = sub(broker, subs, "-t", f"{base}/doomed/nothing", "--will-topic", f"{base}/will",
                 "--will-payload", "died", "--will-qos", "1", "--will-retain")
    doomed.subscribed()
    doomed.proc.send_signal(signal.SIGKILL)
    doomed.proc.wait(5)
    assert watcher.messages() == [(f"{base}/marker", 1, False, "marker"), (f"{base}/will", 1, False, "died")]
    # it was retained (--will-retain): a later subscriber gets it with retain=1
    late = sub(broker, subs, "-t", f"{base}/will", "-C", "1")
    assert late.messages() == [(f"{base}/will", 0, True, "died")]
    pub(broker, "-t", f"{base}/will", "-r", "-n")


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_mqtt_3_1_clients(broker: Broker, subs: list[Sub], qos: int) -> None:
    """`-V mqttv31`: protocol name MQIsdp, level 3, on both ends and mixed with 3.1.1."""
    topic = unique(f"v31/{qos}")
    old = sub(broker, subs, "-V", "mqttv31", "-t", topic, "-q", str(qos), "-C", "2")
    new = sub(broker, subs, "-V", "mqttv311", "-t", topic, "-q", str(qos), "-C", "2")
    old.subscribed()
    new.subscribed()
    pub(broker, "-V", "mqttv31", "-t", topic, "-q", str(qos), "-m", "from 3.1")
    pub(broker, "-V", "mqttv311", "-t", topic, "-q", str(qos), "-m", "from 3.1.1")
    expected = [(topic, qos, False, "from 3.1"), (topic, qos, False, "from 3.1.1")]
    assert old.messages() == expected
    assert new.messages() == expected


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_mqtt_5_clients(broker: Broker, subs: list[Sub], qos: int) -> None:
    """`-V 5` on both ends and mixed with 3.1.1; the 5.0 publisher's QoS flow completes."""
    topic = unique(f"v5/{qos}")
    five = sub(broker, subs, "-V", "5", "-t", topic, "-q", str(qos), "-C", "2")
    old = sub(broker, subs, "-V", "mqttv311", "-t", topic, "-q", str(qos), "-C", "2")
    five.subscribed()
    old.subscribed()
    out = pub(broker, "-V", "5", "-t", topic, "-q", str(qos), "-m", "from 5.0")
    if qos:
        assert ("received PUBACK" if qos == 1 else "received PUBCOMP") in out, out
    pub(broker, "-V", "mqttv311", "-t", topic, "-q", str(qos), "-m", "from 3.1.1")
    expected = [(topic, qos, False, "from 5.0"), (topic, qos, False, "from 3.1.1")]
    assert five.messages() == expected
    assert old.messages() == expected


def test_mqtt_5_session_expiry_keeps_the_session(broker: Broker, subs: list[Sub]) -> None:
    """mosquitto_sub -V 5 -c asks for a session that never expires; -x 0 ends it at disconnect."""
    topic = unique("v5session")
    client_id = f"interop5-{uuid.uuid4().hex[:8]}"
    assert sub(broker, subs, "-V", "5", "-c", "-i", client_id, "-t", topic, "-q", "1", "-E").messages() == []
    pub(broker, "-V", "5", "-t", topic, "-q", "1", "-m", "kept for you")
    s = sub(broker, subs, "-V", "5", "-c", "-i", client_id, "-t", topic, "-q", "1", "-C", "1")
    assert s.messages() == [(topic, 1, False, "kept for you")]
    sub(broker, subs, "-V", "5", "-i", client_id, "-t", f"{topic}/unused", "-E").messages()  # clean start: gone


def test_mqtt_5_and_311_members_of_a_shared_subscription_take_turns(broker: Broker, subs: list[Sub]) -> None:
    """mosquitto_sub -V 5 and -V mqttv311 in one `$share` group: four messages, two each (round robin)."""
    topic = unique("shared")
    members = []
    for version in ("5", "mqttv311"):  # one after the other: the round starts with the first to join
        members.append(sub(broker, subs, "-V", version, "-t", f"$share/interop/{topic}", "-q", "1", "-C", "2"))
        members[-1].subscribed()
    for n in range(4):
        pub(broker, "-V", "5", "-t", topic, "-q", "1", "-m", f"job {n}")
    first, second = (member.messages() for member in members)
    assert first == [(topic, 1, False, "job 0"), (topic, 1, False, "job 2")]
    assert second == [(topic, 1, False, "job 1"), (topic, 1, False, "job 3")]
