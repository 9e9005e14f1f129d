"""The reconnect storm (bench/reconnect.py) against a real plexmq, small: every client comes back, the
numbers add up; no timing is asserted."""

from __future__ import annotations

import json
import socket

import pytest

from plexmq.bench import reconnect


def _run(capsys, *args: str) -> dict:
    status = reconnect.main(["--brokers", "plexmq", "--procs", "2", "--workers", "1", "--json", "--quiet", *args])
    out = json.loads(capsys.readouterr().out)
    result = out["results"]["plexmq"]
    assert status == 0 and result["ok"], result
    return result


@pytest.mark.parametrize("args", [("-n", "300", "-V", "5", "--persistent"), ("-n", "200", "--kill", "--jitter", "0.3")],
                         ids=["persistent-5.0-sigterm", "clean-3.1.1-sigkill"])
def test_every_client_comes_back_after_a_restart(capsys, args: tuple[str, ...]) -> None:
    r = _run(capsys, *args)
    n = int(args[1])
    assert r["clients"] == r["connected_before"] == r["back"] == r["dropped"] == n
    assert r["procs"] == 2 and r["redropped"] == 0 and r["protocol_errors"] == 0
    assert r["attempts"] == n + r["failed"] and r["failed"] >= r["failed_before_start"] >= 0
    assert set(r["errors"]) <= {"ECONNREFUSED", "ECONNRESET", "closed_by_broker", "connect_timeout", "handshake_timeout"}
    if "--persistent" in args:  # every session was resumed
        assert r["session_present"] == n and r["session_absent"] == 0
    else:
        assert r["session_present"] == 0 and r["session_absent"] == n
    assert 0 <= r["listening_s"] <= r["first_connack_s"] <= r["all_back_s"]
    assert r["all_back_from_listening_s"] <= r["all_back_s"] and r["reconnect_rate"] > 0
    assert r["broker_cpu_s"] >= r["broker_start_cpu_s"] >= 0 and r["broker_cpu_s"] > 0
    # CPU time counts in 10 ms ticks: a few hundred reconnects after the first CONNACK may take less than one
    assert r["broker_us_per_reconnect"] >= 0 and r["generator_cpu_s"] > 0
    assert r["stop_s"] >= 0 and r["connect_rate"] > 0
    assert r["last_failed_s"] is None or r["last_failed_s"] <= r["all_back_s"]


def test_listens_asks_the_kernel_for_a_listening_port() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert not reconnect.listens(port)  # bound, not listening
        s.listen()
        assert reconnect.listens(port)
    assert not reconnect.listens(port)
