"""Authentication and authorization end to end: password file, ACL, SIGHUP reload, the safe default.

Real brokers with real files; RawClient where the CONNACK code or the order of acknowledgements
matters, mosquitto_pub/sub where a standard tool's options are the point.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from plexmq.mqtt import v4 as p
from tests.conftest import ROOT, Broker, wait_for
from tests.logins import config, login, users
from tests.mqtt import RawClient
from tests.steps import publish, subscribe, sync, uid

CHEAP = 2 ** 10  # scrypt cost for test users: the file says it, the broker honours it


@pytest.fixture
def secured(tmp_path: Path, start_broker: Callable[..., Broker]) -> Broker:
    """Users alice and bob; an ACL: alice reads and writes under alice/ and reads public/,
    bob writes public/, everyone reads and writes their own devices/%u/# and nobody touches secret/."""
    pw = users(tmp_path / "passwd", alice="wonderland", bob="builder")
    acl = tmp_path / "acl"
    acl.write_text("user alice\ntopic readwrite alice/#\ntopic read public/#\n"
                   "user bob\ntopic write public/#\n"
                   "pattern readwrite devices/%u/#\npattern deny secret/#\n")
    return start_broker("--workers", "2", "--config", config(tmp_path, f'password_file = "{pw}"\nacl_file = "{acl}"\n'))


def test_passwords_decide_the_connack(secured: Broker) -> None:
    c, code = login(secured.port, "alice", b"wonderland")
    assert code == 0
    c.close()
    for username, password, expected in [("alice", b"wrong", 4), ("mallory", b"wonderland", 4), ("alice", None, 4),
                                         (None, None, 5)]:
        c, code = login(secured.port, username, password)
        assert code == expected, (username, password)
        c.read_until_closed()


def test_anonymous_clients_when_allowed(tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    pw = users(tmp_path / "passwd", alice="wonderland")
    b = start_broker("--config", config(tmp_path, f'password_file = "{pw}"\nallow_anonymous = true\n'))
    c, code = login(b.port, None, None)
    assert code == 0
    c.close()
    c, code = login(b.port, "alice", b"nope")  # a username given must still be right
    assert code == 4


def test_repeated_failures_from_one_address_are_slowed_down(secured: Broker) -> None:
    """Each worker counts the failures of the addresses it serves: 0.1, 0.2, 0.4 s ... per failure.
    Six attempts over the broker's two workers give one of them at least three."""
    took = []
    for _ in range(6):
        start = time.monotonic()
        c = RawClient(secured.port)
        c.send(p.encode_connect(f"auth-{uid()}", username="alice", password=b"guess"))
        first, body = c.recv(timeout=15)  # six on one worker: the last waits 3.2 s, more on a busy machine
        took.append(time.monotonic() - start)
        assert first == 0x20 and p.decode_connack(0, body)[1] == 4
        c.close()
    assert max(took) >= 0.4, took
    c, code = login(secured.port, "alice", b"wonderland")  # the right password still works at once
    assert code == 0
    c.close()


def test_packets_sent_before_the_connack_wait_for_the_login(secured: Broker) -> None:
    """A client may pipeline SUBSCRIBE and PUBLISH behind CONNECT; they are handled once it is in."""
    c = RawClient(secured.port)
    topic = f"alice/pipelined/{uid()}"
    c.send(p.encode_connect(f"auth-{uid()}", username="alice", password=b"wonderland")
           + p.encode_subscribe(1, [(topic, 1)]) + p.encode_publish(topic.encode(), b"early", 1, packet_id=2))
    assert c.recv() == (0x20, b"\x00\x00")
    got = [c.recv() for _ in range(3)]
    assert (0x90, b"\x00\x01\x01") in got and (0x40, b"\x00\x02") in got
    first, body = next(g for g in got if g[0] & 0xF0 == 0x30)
    assert p.decode_publish(first & 15, body)[2] == b"early"
    c.close()


def test_acl_answers_subscribe_with_0x80_and_drops_denied_publishes(secured: Broker) -> None:
    alice, _ = login(secured.port, "alice", b"wonderland")
    assert subscribe(alice, 1, [("alice/inbox", 1), ("public/#", 1), ("bob/#", 1), ("secret/x", 0),
                                ("devices/alice/+", 1), ("devices/bob/+", 1)]) == [1, 1, 0x80, 0x80, 1, 0x80]
    bob, _ = login(secured.port, "bob", b"builder")
    publish(bob, "public/news", b"allowed", 1)
    publish(bob, "alice/inbox", b"denied q1", 1)  # still acknowledged (3.1.1), never delivered
    publish(bob, "alice/inbox", b"denied q2", 2, packet_id=2)
    publish(bob, "alice/inbox", b"denied q0", 0)
    publish(bob, "devices/bob/x", b"own device", 1)
    publish(alice, "devices/alice/t", b"own device", 0)  # %u: her own device; she hears herself
    assert [m.payload for m in sync(alice)] == [b"allowed", b"own device"]
    alice.close()
    bob.close()


def test_acknowledgements_keep_their_order_around_a_denied_publish(secured: Broker) -> None:
    bob, _ = login(secured.port, "bob", b"builder")
    bob.send(b"".join(p.encode_publish(topic.encode(), b"x", 1, packet_id=pid)
                      for pid, topic in enumerate(["public/a", "alice/no", "public/b", "secret/no", "public/c"], 1)))
    assert [bob.recv() for _ in range(5)] == [(0x40, pid.to_bytes(2, "big")) for pid in range(1, 6)]
    bob.close()


def test_a_will_on_a_denied_topic_refuses_the_connection(secured: Broker) -> None:
    c, code = login(secured.port, "bob", b"builder", will=p.Will("alice/will", b"bye", 0, False))
    assert code == 5
    c.read_until_closed()


def test_sighup_reloads_the_password_file(tmp_path: Path, secured: Broker) -> None:
    c, code = login(secured.port, "carol", b"singer")
    assert code == 4
    c.close()
    users(tmp_path / "passwd", carol="singer")
    secured.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: secured.output().count("reloaded its settings") >= 3, 10, "both workers to reload")
    c, code = login(secured.port, "carol", b"singer")
    assert code == 0
    c.close()


@pytest.mark.skipif(shutil.which("mosquitto_pub") is None, reason="mosquitto-clients not installed")
def test_mosquitto_clients_log_in(secured: Broker) -> None:
    topic = f"alice/tools/{uid()}"
    sub = subprocess.Popen(["mosquitto_sub", "-p", str(secured.port), "-u", "alice", "-P", "wonderland",
                            "-t", topic, "-C", "1", "-W", "10"], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while sub.poll() is None and time.monotonic() < deadline:  # the subscriber may not be in yet
            subprocess.run(["mosquitto_pub", "-p", str(secured.port), "-u", "alice", "-P", "wonderland",
                            "-t", topic, "-m", "hello", "-q", "1"], check=True, timeout=10)
            try:
                sub.wait(0.2)
            except subprocess.TimeoutExpired:
                pass
        assert sub.stdout is not None and sub.stdout.read().strip() == "hello"
    finally:
        sub.kill()
    denied = subprocess.run(["mosquitto_pub", "-p", str(secured.port), "-u", "alice", "-P", "nope", "-t", "x",
                             "-m", "x"], capture_output=True, text=True, timeout=10)
    assert denied.returncode != 0


def test_without_authentication_the_broker_stays_on_loopback(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "plexmq.acceptor", "serve", "--host", "0.0.0.0", "--port", "0",
                             "--data-dir", str(tmp_path / "data")], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "listening beyond loopback needs authentication" in result.stderr
