"""End to end: keepalive. PINGREQ gets PINGRESP; silence beyond 1.5 x keepalive closes; 0 means none."""

from __future__ import annotations

import selectors
import time

from plexmq.mqtt import v4 as p
from tests.conftest import Broker
from tests.mqtt import RawClient


def closed_after(raw: RawClient, timeout: float) -> float | None:
    """Seconds until the broker closes the socket (anything it sends first is ignored), None if it stays open."""
    started = time.monotonic()
    deadline = started + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        raw.sock.settimeout(left)
        try:
            if not raw.sock.recv(65536):
                return time.monotonic() - started
        except ConnectionResetError:
            return time.monotonic() - started
        except TimeoutError:
            return None


def test_pingreq_gets_pingresp_byte_exact(broker: Broker) -> None:
    raw = RawClient(broker.port)
    assert raw.connect("keepalive-ping", keepalive=30) == (False, 0)
    for _ in range(3):
        raw.send(b"\xc0\x00")
        raw.sock.settimeout(5)
        data = b""
        while len(data) < 2:
            chunk = raw.sock.recv(2 - len(data))
            assert chunk, "connection closed instead of PINGRESP"
            data += chunk
        assert data == b"\xd0\x00"
    raw.close()


def test_silent_clients_are_closed_within_half_a_second_after_one_and_a_half_keepalives(broker: Broker) -> None:
    """[MQTT-3.1.2-24] Keepalive 1, connections opened at moments spread over a second (so the
    worker's sweeps meet each at another phase): each is closed 1.5 s after its CONNECT was read, and
    within 0.5 s more (it was up to 1 s more when the sweep ran each whole second)."""
    with selectors.DefaultSelector() as selector:
        for i in range(5):
            raw = RawClient(broker.port)
            sent_at = time.monotonic()
            assert raw.connect(f"keepalive-silent-{i}", keepalive=1) == (False, 0)
            selector.register(raw.sock, selectors.EVENT_READ, (raw, sent_at, time.monotonic()))
            time.sleep(0.2)  # the moments under test, spread over the worker's second
        give_up = time.monotonic() + 6.0
        while selector.get_map():
            ready = selector.select(give_up - time.monotonic())
            assert ready, f"{len(selector.get_map())} clients silent for 6 s with keepalive 1 were not closed"
            closed_at = time.monotonic()
            for key, _events in ready:
                raw, sent_at, acked_at = key.data
                try:
                    if raw.sock.recv(65536):
                        continue
                except ConnectionResetError:
                    pass
                selector.unregister(raw.sock)
                raw.close()
                assert closed_at - acked_at >= 1.4, f"closed {closed_at - acked_at:.2f} s after its CONNACK"
                assert closed_at - sent_at <= 1.5 + 0.5, f"closed {closed_at - sent_at:.2f} s after its CONNECT"


def test_keepalive_two_closes_after_three_seconds(broker: Broker) -> None:
    raw = RawClient(broker.port)
    sent_at = time.monotonic()
    assert raw.connect("keepalive-two", keepalive=2) == (False, 0)
    elapsed = closed_after(raw, 7.0)
    assert elapsed is not None, "a client silent for 7 s with keepalive 2 was not closed"
    assert elapsed >= 2.9 and time.monotonic() - sent_at <= 3 + 0.5, f"closed after {elapsed:.2f} s"
    raw.close()


def test_keepalive_zero_means_no_timeout(broker: Broker) -> None:
    raw = RawClient(broker.port)
    assert raw.connect("keepalive-zero", keepalive=0) == (False, 0)
    assert closed_after(raw, 3.0) is None, "a client with keepalive 0 was closed"
    raw.send(p.PINGREQ_PACKET)
    assert raw.recv() == (0xD0, b"")
    raw.close()


def test_activity_resets_the_keepalive_timer(broker: Broker) -> None:
    raw = RawClient(broker.port)
    assert raw.connect("keepalive-active", keepalive=1) == (False, 0)
    started = time.monotonic()
    while time.monotonic() - started < 3.0:
        raw.send(p.PINGREQ_PACKET)
        assert raw.recv(timeout=2) == (0xD0, b""), "closed although it sent PINGREQ every 0.5 s"
        time.sleep(0.5)  # the activity pattern under test: one PINGREQ every half second
    raw.send(p.PINGREQ_PACKET)
    assert raw.recv() == (0xD0, b"")
    raw.close()


def test_any_packet_counts_as_activity(broker: Broker) -> None:
    """Not only PINGREQ: PUBLISH traffic keeps a keepalive-1 client open too, silence then closes it."""
    raw = RawClient(broker.port)
    assert raw.connect("keepalive-publish", keepalive=1) == (False, 0)
    started = time.monotonic()
    pid = 1
    while time.monotonic() - started < 3.0:
        sent_at = time.monotonic()
        raw.send(p.encode_publish(b"keepalive/publish", b"x", 1, packet_id=pid))
        assert raw.recv(timeout=2) == (0x40, pid.to_bytes(2, "big")), "closed although it published every 0.5 s"
        acked_at = time.monotonic()
        pid += 1
        time.sleep(0.5)  # the activity pattern under test
    elapsed = closed_after(raw, 6.0)
    assert elapsed is not None, "silent for 6 s with keepalive 1, and not closed"
    closed_at = time.monotonic()
    assert closed_at - acked_at >= 1.4 and closed_at - sent_at <= 1.5 + 0.5, \
        f"then silent: closed {closed_at - sent_at:.2f} s after its last PUBLISH"
    raw.close()
