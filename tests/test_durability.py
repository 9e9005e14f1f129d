"""Durability end to end: whatever process dies, nothing acknowledged is lost.

Real broker processes, real clients, raw sockets where bytes matter (DUP flags, packet ids). A broker
that a test SIGKILLs whole runs in a session of its own, so that one `killpg` reaches the acceptor, the
router and the workers at the same instant. Every wait is bounded and awaits an event; the only timing
assertion is "traffic resumes within 5 s" after the router's death.

Publishers stream in a pipelined way (many PUBLISH in flight, PUBACKs read as they come) so that a kill
lands mid-stream; payloads carry their sequence number. A message counts as acknowledged when the
publisher read its PUBACK (QoS 2: its PUBREC), before the kill or from what the socket still held after.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import psutil
import pytest

from plexmq.mqtt import properties as P
from plexmq.mqtt import v4 as p
from plexmq.mqtt import v5
from plexmq.router.store import SCHEMA_VERSION
from tests.conftest import ROOT, wait_for
from tests.mqtt import RawClient
from tests.processes import OwnBroker, alive, config_of, descendants
from tests.steps import (
    Pub,
    as_pub,
    connect,
    ping,
    publish,
    raw_on,
    receive,
    subscribe,
    sync,
    uid,
    worker_of,
)

RESUME_LIMIT = 5.0  # seconds traffic may take to resume after the router's death
QUEUE = 20_000  # max_queued_messages for these tests: the streams must not overflow an offline queue
SQLITE_MAGIC = b"SQLite format 3\x00"
GARBAGE = b"this is not a plexmq database, whatever it was before\n"


# -- brokers -----------------------------------------------------------------------------------------


class Brokers:
    """Dedicated brokers, each in its own session (killable whole), sharing one config file."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[OwnBroker] = []
        self.config = tmp_path / "plexmq.toml"
        self.config.write_text(f"max_queued_messages = {QUEUE}\n")

    def start(self, data_dir: Path, *args: str, workers: int = 2) -> OwnBroker:
        b = OwnBroker(self.tmp_path / f"broker{len(self.started)}.log",
                      ["--workers", str(workers), "--config", str(self.config), "--data-dir", str(data_dir), *args],
                      session=True)
        self.started.append(b)
        return b

    def killer(self, b: OwnBroker) -> Callable[[], None]:
        """A call that SIGKILLs the acceptor and every child at once and returns when all of them are
        gone (what it needs is looked up now, so that the kill itself is immediate)."""
        procs = [psutil.Process(b.proc.pid), *descendants(b)]
        run_dir = _run_dir(b)

        def kill() -> None:
            os.killpg(b.proc.pid, signal.SIGKILL)
            b.proc.wait(5)
            wait_for(lambda: not any(alive(proc) for proc in procs), 5, "every process of the killed broker to be gone")
            if run_dir:  # the acceptor's temporary directory for router.ipc, which only a clean stop removes
                shutil.rmtree(run_dir, ignore_errors=True)
        return kill

    def kill_whole(self, b: OwnBroker) -> None:
        self.killer(b)()

    def terminate(self, b: OwnBroker) -> None:
        """SIGTERM: the exit status must be 0 and every process must be gone."""
        procs = descendants(b)
        assert len(procs) >= 2, f"expected a router and workers: {procs}"
        b.proc.send_signal(signal.SIGTERM)
        try:
            code = b.proc.wait(10)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the broker still runs 10 s after SIGTERM:\n{b.output()[-3000:]}") from None
        assert code == 0, f"exit status {code} after SIGTERM:\n{b.output()[-3000:]}"
        wait_for(lambda: not any(alive(proc) for proc in procs), 5, "the children to be gone after SIGTERM")
        assert "Traceback" not in b.output(), b.output()[-3000:]

    def close(self) -> None:
        for b in self.started:
            leftovers = descendants(b)
            b.stop()
            for proc in leftovers:
                if alive(proc):
                    proc.kill()


def _run_dir(b: OwnBroker) -> str | None:
    router = b.router()
    try:
        endpoint = config_of(router)["router_endpoint"] if router else ""
    except (psutil.Error, KeyError, OSError, orjson.JSONDecodeError):
        return None
    path = os.path.dirname(endpoint.removeprefix("ipc://"))
    return path if os.path.basename(path).startswith("plexmq-") else None


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[Brokers]:
    found = Brokers(tmp_path)
    yield found
    found.close()


# -- clients -----------------------------------------------------------------------------------------


def seq_payload(i: int) -> bytes:
    return b"%06d" % i


def disconnect(c: RawClient) -> None:
    c.send(p.DISCONNECT_PACKET)
    c.read_until_closed()


def reconnect(port: int, client_id: str, clean: bool = False) -> tuple[RawClient, bool]:
    """A new connection for `client_id` and its CONNACK's session present flag."""
    c = RawClient(port)
    present, code = c.connect(client_id, clean)
    assert code == 0, f"CONNACK {code}"
    return c, present


def stream(c: RawClient, topic: str, n: int, qos: int, kill_at: int, kill: Callable[[], None],
           events: dict[int, Callable[[], None]] | None = None) -> set[int]:
    """Publish messages 0..n-1 (payload: the sequence number, packet id: sequence + 1) with at most
    a window of flows open (never so many that all n are sent before the kill); once `kill_at` are
    acknowledged call `kill` (which kills the broker), then read what the socket still holds until it
    closes. `events` maps an acknowledged count to a call made then.

    The sequence numbers acknowledged (PUBACK; for QoS 2 PUBREC, answered with PUBREL).
    """
    window = min(400, (n - kill_at) // 2)
    chunk = max(window // 4, 1)
    assert 0 < kill_at < n < 65535 and window > 0
    events = dict(events or {})
    tb = topic.encode()
    acked: set[int] = set()
    sent = completed = 0

    def take(first: int, body: bytes) -> None:
        nonlocal completed
        if first in (0x40, 0x50, 0x70):
            seq = int.from_bytes(body[:2], "big") - 1
            assert 0 <= seq < sent, f"an ack for packet id {seq + 1}, which was never sent"
            if first == 0x70:
                completed += 1
            else:
                assert (first == 0x40) == (qos == 1), f"ack {first:#x} for a QoS {qos} PUBLISH"
                acked.add(seq)
                completed += first == 0x40
        else:
            raise AssertionError(f"unexpected packet {first:#x} {body!r} on the publisher")

    while len(acked) < kill_at:
        if sent < n and sent - completed <= window - chunk:
            batch = range(sent, min(sent + chunk, n))
            c.send(b"".join(p.encode_publish(tb, seq_payload(i), qos, packet_id=i + 1) for i in batch))
            sent = batch.stop
            continue
        first, body = c.recv()
        before = len(acked)
        take(first, body)
        if first == 0x50:
            c.send(p.encode_pubrel(int.from_bytes(body[:2], "big")))
        if len(acked) != before and len(acked) in events:
            events.pop(len(acked))()
    assert not events, f"events never reached: {sorted(events)}"
    kill()
    rest = c.read_until_closed()  # acks the broker wrote before it died count as acknowledged too
    pos = 0
    while found := p.frame(rest, pos, 1 << 28):
        first, start, end = found
        take(first, rest[start:end])
        pos = end
    c.close()
    assert len(acked) < n, "every message was acknowledged before the kill: not a kill mid-stream"
    return acked


def check_delivered(got: list[Pub], acked: set[int], exactly_once: bool) -> None:
    """Every acknowledged sequence number arrived, first arrivals in order, and (QoS 2) none twice."""
    seqs = [int(m.payload) for m in got]
    missing = sorted(acked - set(seqs))
    assert not missing, (f"{len(missing)} of {len(acked)} acknowledged messages were lost: "
                         f"{missing[:10]}{' ...' if len(missing) > 10 else ''}")
    firsts = list(dict.fromkeys(seqs))
    wrong = next((i for i in range(1, len(firsts)) if firsts[i] < firsts[i - 1]), None)
    assert wrong is None, f"out of order: {firsts[max(wrong - 2, 0):wrong + 3]} (arrival {wrong})"
    if exactly_once:
        twice = sorted(s for s, k in Counter(seqs).items() if k > 1)
        assert not twice, f"QoS 2 messages delivered more than once: {twice[:10]}"


# -- 1. the whole broker is SIGKILLed: an offline persistent session keeps what was acknowledged -------


@pytest.mark.parametrize(("qos", "n", "sync_mode"), [(1, 5000, "normal"), (2, 500, "full")], ids=["qos1", "qos2"])
def test_sigkill_of_the_whole_broker_loses_no_acknowledged_message_of_an_offline_session(
        brokers: Brokers, tmp_path: Path, qos: int, n: int, sync_mode: str) -> None:
    data = tmp_path / "data"
    b = brokers.start(data, "--sync", sync_mode)
    cid, topic = f"off-{uid()}", f"dur/off/{uid()}"
    sub = connect(b.port, cid, clean=False)
    assert subscribe(sub, 1, [(topic, qos)]) == [qos]
    pub = raw_on(b, want=worker_of(b, sub))  # one worker's records reach the router in order: GONE first
    assert pub.connect(f"off-pub-{uid()}") == (False, 0)
    disconnect(sub)

    acked = stream(pub, topic, n, qos, kill_at=n // 2, kill=brokers.killer(b))

    b = brokers.start(data, "--sync", sync_mode)
    sub, present = reconnect(b.port, cid)
    assert present, "the persistent session was lost"
    got = receive(sub, payloads=[seq_payload(s) for s in acked])
    got += sync(sub)  # and whatever else was stored (published, acknowledged only as the broker died)
    assert {m.qos for m in got} == {qos}
    check_delivered(got, acked, exactly_once=qos == 2)
    disconnect(sub)

    sub, present = reconnect(b.port, cid)  # all acknowledged now: nothing comes again
    assert present
    assert sync(sub) == []
    disconnect(sub)


# -- 2. the same with the subscriber online, not acknowledging: resent with DUP and the same ids -------


def test_sigkill_of_the_whole_broker_resends_unacknowledged_messages_with_dup(brokers: Brokers, tmp_path: Path) -> None:
    data = tmp_path / "data"
    n = 5000
    b = brokers.start(data)
    cid, topic = f"dup-{uid()}", f"dur/dup/{uid()}"
    sub = connect(b.port, cid, clean=False)
    assert subscribe(sub, 1, [(topic, 1)]) == [1]
    pub = connect(b.port)
    window: list[Pub] = []

    def read_then_close() -> None:  # mid-stream: read what was sent (the inflight window), ack nothing
        window.extend(sync(sub, ack=False))
        sub.close()

    acked = stream(pub, topic, n, 1, kill_at=n // 2, kill=brokers.killer(b),
                   events={200: read_then_close})
    assert 0 < len(window) < 200, f"{len(window)} messages sent without acknowledgement"
    assert [m.payload for m in window] == [seq_payload(i) for i in range(len(window))]
    assert not any(m.dup for m in window)

    b = brokers.start(data)
    sub, present = reconnect(b.port, cid)
    assert present, "the persistent session was lost"
    got = receive(sub, payloads=[seq_payload(s) for s in acked])
    got += sync(sub)
    resent = got[:len(window)]
    assert [(m.payload, m.packet_id, m.dup) for m in resent] == [(m.payload, m.packet_id, True) for m in window], \
        "the unacknowledged messages did not come first, again, with DUP and their packet ids"
    assert [m.payload for m in got[len(window):] if m.dup] == [], "DUP set on messages never sent before"
    check_delivered(got, acked, exactly_once=False)
    disconnect(sub)


# -- 3. retained messages and subscriptions survive a SIGKILL of the whole broker ----------------------


def test_retained_messages_and_subscriptions_survive_a_sigkill_of_the_whole_broker(brokers: Brokers,
                                                                                   tmp_path: Path) -> None:
    data = tmp_path / "data"
    b = brokers.start(data, "--sync", "full")
    base = f"dur/ret/{uid()}"
    pub = connect(b.port)
    publish(pub, f"{base}/a", b"A", 1, retain=True, packet_id=1)
    publish(pub, f"{base}/b", b"B", 2, retain=True, packet_id=2)
    publish(pub, f"{base}/c", b"C", 1, retain=True, packet_id=3)
    publish(pub, f"{base}/c", b"", 1, retain=True, packet_id=4)  # clears c
    publish(pub, f"{base}/d/e", b"old", 1, retain=True, packet_id=5)
    publish(pub, f"{base}/d/e", b"new", 2, retain=True, packet_id=6)  # replaces it
    away, online = f"away-{uid()}", f"online-{uid()}"
    c = connect(b.port, away, clean=False)
    assert subscribe(c, 1, [(f"dur/sub/{away}/#", 1)]) == [1]
    disconnect(c)
    kept_open = connect(b.port, online, clean=False)  # still connected when the broker dies
    assert subscribe(kept_open, 1, [(f"dur/sub/{online}/+", 2), (f"dur/other/{online}", 0)]) == [2, 0]

    brokers.kill_whole(b)
    kept_open.read_until_closed()

    b = brokers.start(data, "--sync", "full")
    fresh = connect(b.port)
    assert subscribe(fresh, 1, [(f"{base}/#", 2)]) == [2]
    got = sync(fresh)
    assert sorted((m.topic, m.payload, m.qos, m.retain) for m in got) == [
        (f"{base}/a", b"A", 1, True), (f"{base}/b", b"B", 2, True), (f"{base}/d/e", b"new", 2, True)]

    pub = connect(b.port)
    for cid, topic, qos in [(away, f"dur/sub/{away}/x/y", 1), (online, f"dur/sub/{online}/z", 2)]:
        c, present = reconnect(b.port, cid)
        assert present, f"the persistent session {cid} was lost"
        publish(pub, topic, b"after the crash", qos, packet_id=7)
        assert [(m.topic, m.payload, m.qos) for m in sync(c)] == [(topic, b"after the crash", qos)], \
            f"{cid} lost its subscription"
        publish(pub, f"dur/other/{online}", b"zero", 0)
        got = sync(c)
        assert [m.payload for m in got] == ([b"zero"] if cid == online else [])
        disconnect(c)


# -- 4. one worker is SIGKILLed --------------------------------------------------------------------------


def test_sigkill_of_a_worker_keeps_the_sessions_of_its_clients_and_publishes_their_wills(brokers: Brokers,
                                                                                         tmp_path: Path) -> None:
    b = brokers.start(tmp_path / "data")
    victim, survivor = 0, 1
    tag = uid()
    live_t, queue_t, will_t = f"dur/kw/{tag}/live", f"dur/kw/{tag}/q", f"dur/kw/{tag}/will"
    stay_sub = raw_on(b, want=survivor)
    assert stay_sub.connect(f"kw-stay-{tag}") == (False, 0)
    assert subscribe(stay_sub, 1, [(live_t, 1), (will_t, 1)]) == [1, 1]
    stay_pub = raw_on(b, want=survivor)
    assert stay_pub.connect(f"kw-pub-{tag}") == (False, 0)
    pers_id = f"kw-pers-{tag}"
    pers = raw_on(b, want=victim)
    assert pers.connect(pers_id, clean=False) == (False, 0)
    assert subscribe(pers, 1, [(queue_t, 1)]) == [1]
    willer = raw_on(b, want=victim)
    assert willer.connect(f"kw-will-{tag}", will=p.Will(will_t, b"victim gone", 1, False)) == (False, 0)
    publish(stay_pub, queue_t, b"inflight", 1, packet_id=1)
    first = as_pub(*pers.recv())
    assert (first.payload, first.qos, first.dup) == (b"inflight", 1, False)  # and never acknowledged
    old = b.workers()[victim]
    survivor_pid = b.workers()[survivor].pid

    os.kill(old.pid, signal.SIGKILL)

    pers.read_until_closed()
    willer.read_until_closed()
    will = receive(stay_sub, count=1)
    assert [(m.topic, m.payload) for m in will] == [(will_t, b"victim gone")]
    wait_for(lambda: (w := b.workers().get(victim)) is not None and w.pid != old.pid, 5, f"a new worker {victim}")
    assert b.workers()[survivor].pid == survivor_pid, "the surviving worker was restarted"

    # the other worker's clients saw nothing: the same sockets keep working
    ping(stay_sub)
    publish(stay_pub, live_t, b"still here", 1, packet_id=2)
    assert [(m.topic, m.payload) for m in sync(stay_sub)] == [(live_t, b"still here")]

    queued = [b"q%d" % i for i in range(5)]  # published while the persistent client is away
    for i, payload in enumerate(queued):
        publish(stay_pub, queue_t, payload, 1, packet_id=10 + i)

    pers, present = reconnect(b.port, pers_id)
    assert present, "the killed worker's persistent session was lost"
    got = receive(pers, payloads=[b"inflight", *queued])
    got += sync(pers)
    assert (got[0].payload, got[0].dup, got[0].packet_id) == (b"inflight", True, first.packet_id), \
        f"the unacknowledged message did not come first with DUP and its packet id: {got[:3]}"
    assert list(dict.fromkeys(m.payload for m in got)) == [b"inflight", *queued]
    publish(stay_pub, queue_t, b"subscribed still", 1, packet_id=20)
    assert [m.payload for m in sync(pers)] == [b"subscribed still"]
    willer, present = reconnect(b.port, f"kw-will-{tag}", clean=True)
    assert not present
    ping(willer)
    assert sync(stay_sub) == [], "the will was published more than once"
    for c in (pers, willer, stay_sub, stay_pub):
        disconnect(c)


# -- 5. the router is SIGKILLed ----------------------------------------------------------------------------


def test_sigkill_of_the_router_keeps_clients_connected_and_traffic_resumes_within_5_s(brokers: Brokers,
                                                                                      tmp_path: Path) -> None:
    b = brokers.start(tmp_path / "data")
    tag = uid()
    topic = f"dur/router/{tag}"
    clean_subs: dict[int, RawClient] = {}
    durable_subs: dict[int, RawClient] = {}
    for w in (0, 1):
        c = raw_on(b, want=w)
        assert c.connect(f"rk-clean-{w}-{tag}") == (False, 0)
        assert subscribe(c, 1, [(topic, 1)]) == [1]
        clean_subs[w] = c
        c = raw_on(b, want=w)
        assert c.connect(f"rk-durable-{w}-{tag}", clean=False) == (False, 0)
        assert subscribe(c, 1, [(topic, 1)]) == [1]
        durable_subs[w] = c
    away_id = f"rk-away-{tag}"
    away = connect(b.port, away_id, clean=False)
    assert subscribe(away, 1, [(topic, 1)]) == [1]
    pub = raw_on(b, want=worker_of(b, away))
    assert pub.connect(f"rk-pub-{tag}") == (False, 0)
    disconnect(away)
    before = [b"before-%d" % i for i in range(10)]
    for i, payload in enumerate(before):
        publish(pub, topic, payload, 1, packet_id=1 + i)
    online = [*clean_subs.values(), *durable_subs.values()]
    for c in online:
        assert [m.payload for m in receive(c, count=len(before))] == before
    old = b.router()
    assert old is not None
    worker_pids = {w: proc.pid for w, proc in b.workers().items()}

    killed_at = time.monotonic()
    os.kill(old.pid, signal.SIGKILL)

    deadline = killed_at + RESUME_LIMIT
    wait_for(lambda: (r := b.router()) is not None and r.pid != old.pid, RESUME_LIMIT, "a new router")
    acked: list[bytes] = []
    for k in range(1, 1000):
        left = deadline - time.monotonic()
        assert left > 0, f"traffic did not resume within {RESUME_LIMIT} s of the router's death " \
                         f"(probes acknowledged: {acked})\n{b.output()[-3000:]}"
        probe = b"probe-%d" % k
        pub.send(p.encode_publish(topic.encode(), probe, 1, packet_id=100 + k))
        try:
            got = pub.recv(left)
        except TimeoutError:
            raise AssertionError(f"no PUBACK within {RESUME_LIMIT} s of the router's death "
                                 f"(probes acknowledged: {acked})\n{b.output()[-3000:]}") from None
        assert got == (0x40, (100 + k).to_bytes(2, "big")), f"expected the PUBACK of {probe!r}, got {got}"
        acked.append(probe)
        # persistent sessions are in the store: each acknowledged probe must reach them
        for c in durable_subs.values():
            receive(c, payloads=[probe], timeout=max(deadline - time.monotonic(), 0.1))
        # a clean subscriber is known again once its worker re-registered it; the barrier SUBACK comes
        # after every delivery routed before it
        if all(probe in [m.payload for m in sync(c)] for c in clean_subs.values()):
            break
    took = time.monotonic() - killed_at
    assert took <= RESUME_LIMIT, f"traffic resumed only {took:.1f} s after the router's death"

    # nobody was disconnected: the same sockets still work, and no worker was restarted
    for c in [*online, pub]:
        ping(c)
    assert {w: proc.pid for w, proc in b.workers().items()} == worker_pids, "workers were restarted"
    publish(pub, topic, b"after", 1, packet_id=999)
    for c in online:
        assert b"after" in [m.payload for m in receive(c, payloads=[b"after"])]

    # the offline persistent session lost nothing acknowledged, before or after the kill
    away, present = reconnect(b.port, away_id)
    assert present, "the offline persistent session was lost"
    want = [*before, *acked, b"after"]
    messages = receive(away, payloads=want)
    messages += sync(away)
    firsts = list(dict.fromkeys(m.payload for m in messages))
    assert firsts == want, f"expected {want}, got {firsts}"
    for c in [away, *online, pub]:
        disconnect(c)


# -- 5b. two tenants' sessions with the same client id: each keeps its own queue through a SIGKILL ---------


@pytest.mark.parametrize("victim", ["router", "worker"])
def test_sigkill_keeps_each_tenants_queued_messages_to_itself(brokers: Brokers, tmp_path: Path, victim: str) -> None:
    """Tenants a and b each hold an offline persistent session of the same client id with QoS 1
    messages queued on the same topic; the router (restarted from the store), or the worker that held
    their publishers, is SIGKILLed; each tenant's client then gets exactly its own messages."""
    brokers.config.write_text(brokers.config.read_text() + 'tenant_separator = "@"\n[tenants.a]\n[tenants.b]\n')
    b = brokers.start(tmp_path / "data")
    cid, topic = f"dur-tenant-{uid()}", f"dur/tenant/{uid()}"
    for tenant in ("a", "b"):
        c = raw_on(b, want=0)
        assert c.connect(cid, clean=False, username=f"s@{tenant}") == (False, 0)
        assert subscribe(c, 1, [(topic, 1)]) == [1]
        disconnect(c)
    queued = {tenant: [b"%s-%d" % (tenant.encode(), i) for i in range(5)] for tenant in ("a", "b")}
    for tenant, payloads in queued.items():
        pub = raw_on(b, want=1)
        assert pub.connect(f"dur-pub-{uid()}", username=f"p@{tenant}") == (False, 0)
        for i, payload in enumerate(payloads, 1):
            publish(pub, topic, payload, 1, packet_id=i)  # acknowledged: in the router's queue (and store)
    old = b.router() if victim == "router" else b.workers()[1]
    assert old is not None

    os.kill(old.pid, signal.SIGKILL)

    def replaced() -> bool:
        fresh = b.router() if victim == "router" else b.workers().get(1)
        return fresh is not None and fresh.pid != old.pid
    wait_for(replaced, 10, f"a new {victim}")
    # a CONNECT while a worker joins the new router again is closed: wait for both workers to have joined
    joined = "joined the router again" if victim == "router" else "worker 1 ready"  # (a new worker: its second start)
    wait_for(lambda: b.output().count(joined) >= 2, 10, "the workers to join the router")
    for tenant, payloads in queued.items():
        c = RawClient(b.port)
        assert c.connect(cid, clean=False, username=f"s@{tenant}") == (True, 0), f"tenant {tenant}'s session was lost"
        got = receive(c, payloads=payloads)
        got += sync(c)
        assert [m.payload for m in got] == payloads, f"tenant {tenant} got {got}"
        disconnect(c)


# -- 6. SIGTERM: a clean shutdown, and a restart with the same state ----------------------------------------


def test_sigterm_flushes_everything_and_a_restart_has_the_same_state(brokers: Brokers, tmp_path: Path) -> None:
    data = tmp_path / "data"
    b = brokers.start(data)
    tag = uid()
    away_id, busy_id = f"term-away-{tag}", f"term-busy-{tag}"
    away = connect(b.port, away_id, clean=False)
    assert subscribe(away, 1, [(f"dur/term/{tag}/#", 2)]) == [2]
    pub = raw_on(b, want=worker_of(b, away))
    assert pub.connect(f"term-pub-{tag}") == (False, 0)
    disconnect(away)
    busy = connect(b.port, busy_id, clean=False)  # online at SIGTERM with one message unacknowledged
    assert subscribe(busy, 1, [(f"dur/busy/{tag}", 1)]) == [1]
    publish(pub, f"dur/busy/{tag}", b"unacked", 1, packet_id=1)
    unacked = as_pub(*busy.recv())
    assert (unacked.payload, unacked.qos) == (b"unacked", 1)
    sent = [(b"m1", 1), (b"m0", 0), (b"m2", 2), (b"m3", 1)]
    for i, (payload, qos) in enumerate(sent):
        publish(pub, f"dur/term/{tag}/x", payload, qos, packet_id=10 + i)
    publish(pub, f"dur/keep/{tag}/r", b"R", 1, retain=True, packet_id=20)
    publish(pub, f"dur/keep/{tag}/s", b"S", 2, retain=True, packet_id=21)

    brokers.terminate(b)
    busy.read_until_closed()

    b = brokers.start(data)
    away, present = reconnect(b.port, away_id)
    assert present, "the persistent session was lost"
    assert [(m.payload, m.qos, m.dup) for m in sync(away)] == [(payload, qos, False) for payload, qos in sent if qos]
    busy, present = reconnect(b.port, busy_id)
    assert present, "the persistent session was lost"
    again = as_pub(*busy.recv())
    assert (again.payload, again.packet_id, again.dup) == (b"unacked", unacked.packet_id, True)
    busy.send(p.encode_puback(again.packet_id))
    assert sync(busy) == []
    pub = connect(b.port)
    publish(pub, f"dur/term/{tag}/y", b"still subscribed", 1)
    assert [m.payload for m in sync(away)] == [b"still subscribed"]
    fresh = connect(b.port)
    assert subscribe(fresh, 1, [(f"dur/keep/{tag}/#", 2)]) == [2]
    assert sorted((m.topic, m.payload, m.qos, m.retain) for m in sync(fresh)) == [
        (f"dur/keep/{tag}/r", b"R", 1, True), (f"dur/keep/{tag}/s", b"S", 2, True)]
    for c in (away, busy, pub, fresh):
        disconnect(c)


# -- 7. a corrupt or unreadable data dir stops startup; no persistence, clean sessions ----------------------


def refused_start(tmp_path: Path, *args: str, timeout: float = 30.0) -> str:
    """Start `plexmq serve` expecting it to refuse: its output; fails when it exits 0, writes a traceback
    or serves a client."""
    log_path = tmp_path / f"refused-{uid()}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "plexmq.acceptor", "serve", "--port", "0", "--workers", "1",
                                 "--metrics-port", "-1", "--console-port", "-1", *args],  # not the ports other brokers may hold
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def ended_or_serving() -> bool:
            if proc.poll() is not None:
                return True
            assert not _serves(log_path.read_bytes()), \
                f"the broker started and serves clients:\n{log_path.read_text(errors='replace')[-3000:]}"
            return False
        wait_for(ended_or_serving, timeout, "the broker to refuse to start")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = log_path.read_text(errors="replace")
    assert proc.returncode != 0, f"exit status 0:\n{out}"
    assert "Traceback" not in out, out[-3000:]
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1, f"{len(lines)} lines where one clear line was due:\n{out[-3000:]}"
    return out


def _serves(log: bytes) -> bool:
    found = re.search(rb"listening on [^ ]+:(\d+) ", log)
    if not found:
        return False
    try:
        with socket.create_connection(("127.0.0.1", int(found.group(1))), timeout=0.5) as s:
            s.sendall(b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x00\x00\x00")
            return s.recv(4) == b"\x20\x02\x00\x00"
    except OSError:
        return False


def line_naming(out: str, *paths: Path) -> str:
    """The first line of `out` that names one of `paths` itself (not something under it) and says more."""
    names = {str(path) for path in paths} | {os.path.realpath(path) for path in paths}
    exact = re.compile("|".join(re.escape(name) + r"(?![/\w.-])" for name in sorted(names)))
    lines = [line for line in out.splitlines() if exact.search(line)]
    assert lines, f"no line names {' or '.join(sorted(names))}:\n{out[-3000:]}"
    assert any(len(line.strip()) > len(min(names, key=len)) + 5 for line in lines), f"no reason given: {lines}"
    return lines[0]


def databases(data: Path) -> list[Path]:
    """The SQLite database files under the data dir (the first bytes say so)."""
    found = []
    for path in sorted(data.rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                if f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC:
                    found.append(path)
    listing = [str(path.relative_to(data)) for path in data.rglob("*")]
    assert found, f"no SQLite database under {data} after a clean run with a persistent session: {listing}"
    return found


def make_state(brokers: Brokers, data: Path, *args: str) -> str:
    """Run a broker that leaves a persistent session and a retained message in `data`, stop it (SIGTERM);
    the session's client id."""
    b = brokers.start(data, *args)
    cid = f"state-{uid()}"
    c = connect(b.port, cid, clean=False)
    assert subscribe(c, 1, [(f"dur/state/{cid}", 1)]) == [1]
    disconnect(c)
    pub = connect(b.port)
    publish(pub, f"dur/state/{cid}", b"queued", 1)
    publish(pub, f"dur/state/{cid}/r", b"retained", 1, retain=True)
    disconnect(pub)
    brokers.terminate(b)
    return cid


@pytest.mark.parametrize("damage", ["garbage", "garbage-after-header", "directory-in-its-place"])
def test_a_corrupt_database_stops_startup_with_one_line(brokers: Brokers, tmp_path: Path, damage: str) -> None:
    data = tmp_path / "data"
    make_state(brokers, data)
    dbs = databases(data)
    damaged: dict[Path, bytes | None] = {}
    for db in dbs:
        size = db.stat().st_size
        if damage == "garbage":
            db.write_bytes((GARBAGE * (size // len(GARBAGE) + 1))[:size])
        elif damage == "garbage-after-header":  # SQLite's 100-byte header intact, every page garbage
            head = db.read_bytes()[:100]
            db.write_bytes(head + (GARBAGE * (size // len(GARBAGE) + 1))[:size - 100])
        else:
            db.unlink()
            db.mkdir()
        damaged[db] = None if db.is_dir() else db.read_bytes()
        wal = db.with_name(db.name + "-wal")  # so that no write-ahead log can hide the damage
        if wal.is_file() and wal.stat().st_size:
            wal.write_bytes(GARBAGE)

    out = refused_start(tmp_path, "--data-dir", str(data))

    line_naming(out, *dbs)
    for db, content in damaged.items():  # the damaged store is left as it was, for a person to look at
        assert db.is_dir() if content is None else db.read_bytes() == content, f"{db} was changed"


def test_a_data_dir_that_is_a_file_stops_startup_with_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.write_bytes(b"not a directory\n")

    out = refused_start(tmp_path, "--data-dir", str(data))

    line_naming(out, data)
    assert data.read_bytes() == b"not a directory\n"


def test_a_second_broker_on_a_data_dir_in_use_refuses_and_leaves_the_first_alone(brokers: Brokers,
                                                                                 tmp_path: Path) -> None:
    """The data dir is claimed at start: a second broker names the holder and stops before it opens the
    store, the first keeps committing with the same router, and a SIGKILL leaves no stale claim."""
    data = tmp_path / "data"
    first = brokers.start(data)
    router = first.router()
    assert router is not None

    out = refused_start(tmp_path, "--data-dir", str(data), "--metrics-port", "0")

    assert f"pid {first.proc.pid}" in line_naming(out, data), out
    cid = f"claim-{uid()}"
    c = connect(first.port, cid, clean=False)  # a persistent session: its SUBACK waits for a commit
    assert subscribe(c, 1, [(f"dur/claim/{cid}", 1)]) == [1]
    disconnect(c)
    pub = connect(first.port)
    publish(pub, f"dur/claim/{cid}", b"stored", 1)  # so does this PUBACK
    disconnect(pub)
    assert first.router() == router, f"the first broker's router was restarted:\n{first.output()[-3000:]}"
    assert " ERROR " not in first.output() and " CRITICAL " not in first.output(), first.output()[-3000:]

    brokers.kill_whole(first)
    b = brokers.start(data)
    c, present = reconnect(b.port, cid)
    assert present and [m.payload for m in sync(c)] == [b"stored"]
    disconnect(c)


def mode_stops_reading(tmp_path: Path) -> bool:
    """False where this user reads files whatever their mode (root, or CAP_DAC_OVERRIDE)."""
    probe = tmp_path / "probe"
    probe.write_bytes(b"x")
    probe.chmod(0)
    try:
        probe.read_bytes()
    except PermissionError:
        return True
    finally:
        probe.unlink()
    return False


@pytest.mark.parametrize("target", ["database", "data dir"])
def test_an_unreadable_data_dir_stops_startup_with_one_line(brokers: Brokers, tmp_path: Path, target: str) -> None:
    if not mode_stops_reading(tmp_path):
        pytest.skip("this user reads files whatever their mode (root)")
    data = tmp_path / "data"
    make_state(brokers, data)
    dbs = databases(data)
    locked = dbs if target == "database" else [data]
    for path in locked:
        path.chmod(0)
    try:
        out = refused_start(tmp_path, "--data-dir", str(data))
    finally:
        for path in locked:
            path.chmod(0o700)
    line_naming(out, *locked, *dbs)  # a locked dir: naming it, or the file it keeps from being read


def test_no_persistence_writes_nothing_to_the_data_dir(brokers: Brokers, tmp_path: Path) -> None:
    data = tmp_path / "data"
    default_dir = ROOT / "plexmq-data"
    default_existed = default_dir.exists()
    cid = make_state(brokers, data, "--no-persistence")
    assert not data.exists() or list(data.rglob("*")) == [], \
        f"--no-persistence wrote {[str(f) for f in data.rglob('*')]}"
    assert default_existed or not default_dir.exists(), "--no-persistence wrote the default data dir"

    b = brokers.start(data, "--no-persistence")  # and it kept nothing: everything was in memory
    c, present = reconnect(b.port, cid)
    assert not present
    assert sync(c) == []
    assert subscribe(c, 1, [(f"dur/state/{cid}/#", 1)]) == [1]
    assert sync(c) == [], "a retained message outlived a broker without persistence"
    disconnect(c)
    brokers.terminate(b)
    assert not data.exists() or list(data.rglob("*")) == []


def test_clean_sessions_leave_nothing_behind_a_restart(brokers: Brokers, tmp_path: Path) -> None:
    data = tmp_path / "data"
    b = brokers.start(data)
    tag = uid()
    gone, held, dropped, kept = (f"cs-{name}-{tag}" for name in ("gone", "held", "dropped", "kept"))
    pub = connect(b.port)
    c = connect(b.port, gone, clean=True)  # subscribes, publishes, receives, leaves
    assert subscribe(c, 1, [(f"dur/cs/{gone}", 1)]) == [1]
    publish(c, f"dur/cs/{gone}/out", b"from it", 1)
    publish(pub, f"dur/cs/{gone}", b"to it", 1)
    assert [m.payload for m in sync(c)] == [b"to it"]
    disconnect(c)
    still = connect(b.port, held, clean=True)  # still connected when the broker dies
    assert subscribe(still, 1, [(f"dur/cs/{held}", 2)]) == [2]
    c = connect(b.port, dropped, clean=False)  # persistent, then discarded by a clean session 1 CONNECT
    assert subscribe(c, 1, [(f"dur/cs/{dropped}", 1)]) == [1]
    disconnect(c)
    c, present = reconnect(b.port, dropped, clean=True)
    assert not present
    disconnect(c)
    c = connect(b.port, kept, clean=False)  # the control: a persistent session does come back
    assert subscribe(c, 1, [(f"dur/cs/{kept}", 1)]) == [1]
    disconnect(c)

    brokers.kill_whole(b)
    still.read_until_closed()

    b = brokers.start(data)
    pub = connect(b.port)
    for cid in (gone, held, dropped):
        c, present = reconnect(b.port, cid)
        assert not present, f"{cid}: a clean session came back after the restart"
        publish(pub, f"dur/cs/{cid}", b"nobody", 1)
        assert sync(c) == [], f"{cid} is still subscribed"
        disconnect(c)
    c, present = reconnect(b.port, kept)
    assert present, "the persistent session was lost"
    disconnect(c)
    disconnect(pub)


def test_a_v5_session_resumed_with_expiry_0_leaves_nothing_behind_a_restart(brokers: Brokers, tmp_path: Path) -> None:
    """A stored session taken up again by a 5.0 CONNECT with clean start 0 and session expiry 0 ends
    with that connection: nothing of it is in the store for a restarted router."""
    data = tmp_path / "data"
    b = brokers.start(data)
    cid = f"cs5-{uid()}"
    c = RawClient(b.port)
    assert c.connect5(cid, properties={P.SESSION_EXPIRY_INTERVAL: 3600})[:2] == (False, 0)
    c.send(v5.encode_subscribe(1, [(f"dur/cs5/{cid}", 1)]))
    assert c.recv()[0] == 0x90  # the SUBACK: the session is stored
    c.send(v5.encode_disconnect())
    c.read_until_closed()
    c = RawClient(b.port)
    assert c.connect5(cid, clean_start=False)[:2] == (True, 0)  # present, and now without an expiry
    c.send(v5.encode_disconnect())
    c.read_until_closed()
    brokers.kill_whole(b)

    b = brokers.start(data)
    c = RawClient(b.port)
    assert c.connect5(cid, clean_start=False, properties={P.SESSION_EXPIRY_INTERVAL: 3600})[:2] == (False, 0), \
        "a session that ended with its connection came back after the restart"
    c.send(v5.encode_disconnect())
    c.read_until_closed()


# -- 7. MQTT 5: a session with an expiry interval, messages with properties and an expiry ----------------


def test_sigkill_keeps_a_v5_session_and_its_messages_properties_and_expiry(brokers: Brokers, tmp_path: Path) -> None:
    data = tmp_path / "data"
    b = brokers.start(data)
    cid, topic = f"dur5-{uid()}", f"dur/v5/{uid()}"
    c = RawClient(b.port)
    assert c.connect5(cid, properties={P.SESSION_EXPIRY_INTERVAL: 3600})[:2] == (False, 0)
    # a subscription identifier and no local: kept in the store with the subscription
    c.send(v5.encode_subscribe(1, [(topic, 1 | 0x04)], {P.SUBSCRIPTION_IDENTIFIER: 42}))
    assert c.recv()[0] == 0x90
    c.send(v5.encode_disconnect())
    c.read_until_closed()
    carried: P.Properties = {P.CONTENT_TYPE: "text/plain", P.USER_PROPERTY: [("trace", "t-1")]}
    pub = RawClient(b.port)
    pub.connect5(f"dur5-pub-{uid()}", properties={P.REQUEST_PROBLEM_INFORMATION: 0})
    for pid, (payload, expiry) in enumerate([(b"brief", 2), (b"lasting", 3600)], 1):
        pub.send(v5.encode_publish(topic.encode(), payload, 1, packet_id=pid,
                                   properties={**carried, P.MESSAGE_EXPIRY_INTERVAL: expiry}))
        assert pub.recv() == (0x40, pid.to_bytes(2, "big"))  # acknowledged: stored
    pub.send(v5.encode_publish(f"{topic}/r".encode(), b"kept", 1, True, packet_id=3,
                               properties={**carried, P.MESSAGE_EXPIRY_INTERVAL: 3600}))
    assert pub.recv() == (0x40, b"\x00\x03\x10")  # stored, and nobody subscribes to it: 0x10

    brokers.kill_whole(b)
    time.sleep(2.1)  # the 2 s interval ends while the broker is down (expiry is time: nothing to await)
    b = brokers.start(data)
    c = RawClient(b.port)
    present, code, _props = c.connect5(cid, clean_start=False, properties={P.SESSION_EXPIRY_INTERVAL: 3600})
    assert (present, code) == (True, 0), "the 5.0 session was lost"
    c.send(v5.encode_subscribe(2, [(f"{topic}/r", 1)]))
    got: list[tuple] = []
    while len(got) < 2:  # the queued message and the retained one, in either order around the SUBACK
        first, body = c.recv()
        if first >> 4 == v5.PUBLISH:
            topic_got, pid, payload, props = v5.decode_publish(first & 15, body, from_server=True)
            c.send(v5.encode_ack(v5.PUBACK, pid))
            left = props.pop(P.MESSAGE_EXPIRY_INTERVAL)
            assert isinstance(left, int) and 3590 <= left < 3600
            assert props == (carried if topic_got.endswith("/r") else {**carried, P.SUBSCRIPTION_IDENTIFIER: [42]})
            got.append((topic_got, payload))
    assert sorted(got) == [(topic, b"lasting"), (f"{topic}/r", b"kept")]  # "brief" expired, never delivered
    c.send(v5.encode_publish(topic.encode(), b"own", 1, packet_id=9))  # no local survived the restart too
    assert c.recv() == (0x40, b"\x00\x09")
    pub = RawClient(b.port)
    pub.connect5(f"dur5-pub-{uid()}")
    pub.send(v5.encode_publish(topic.encode(), b"other", 0))
    first, body = c.recv()
    topic_got, _pid, payload, props = v5.decode_publish(first & 15, body, from_server=True)
    assert (topic_got, payload, props[P.SUBSCRIPTION_IDENTIFIER]) == (topic, b"other", [42])
    c.send(v5.encode_disconnect(0, {P.SESSION_EXPIRY_INTERVAL: 0}))
    c.read_until_closed()


def test_a_v5_sessions_own_expiry_is_kept_across_a_sigkill_and_ends_it_after_the_restart(brokers: Brokers,
                                                                                           tmp_path: Path) -> None:
    data = tmp_path / "data"
    b = brokers.start(data)
    brief, lasting = f"brief-{uid()}", f"lasting-{uid()}"
    for client_id, expiry in ((lasting, 3600), (brief, 1)):
        c = RawClient(b.port)
        assert c.connect5(client_id, properties={P.SESSION_EXPIRY_INTERVAL: expiry})[:2] == (False, 0)
        c.send(v5.encode_subscribe(1, [(f"dur/exp/{client_id}", 1)]))
        assert c.recv()[0] == 0x90  # the SUBACK: the session is stored
        c.send(v5.encode_disconnect())
        c.read_until_closed()
    brokers.kill_whole(b)
    b = brokers.start(data)
    wait_for(lambda: f"client {brief}: persistent session expired" in b.output(), 10, "the 1 s session to end")
    for client_id, kept in ((brief, False), (lasting, True)):
        c = RawClient(b.port)
        assert c.connect5(client_id, clean_start=False)[0] is kept
        c.send(v5.encode_disconnect())
        c.read_until_closed()


def test_a_delayed_will_is_kept_across_a_sigkill_of_the_router_and_sent_when_due(brokers: Brokers,
                                                                                   tmp_path: Path) -> None:
    """A will waiting out its delay is stored with its session: the restarted router publishes it
    once, when it is due; the will of a client that came back meanwhile never comes, and none is
    left in the store."""
    data = tmp_path / "data"
    b = brokers.start(data, workers=1)  # one worker: the watcher's SUBACK below follows the wills' GONE
    tag = uid()
    topic = f"dur/will/{tag}"
    watcher = connect(b.port, f"dw-watch-{tag}", clean=False)  # persistent: it gets the will whenever it comes
    assert subscribe(watcher, 1, [(f"{topic}/#", 1)]) == [1]
    pub = connect(b.port)
    due, back = f"dw-due-{tag}", f"dw-back-{tag}"
    for client_id, delay in ((due, 3), (back, 3600)):
        c = RawClient(b.port)
        will = v5.Will(f"{topic}/{client_id}", b"gone", 1, False, {P.WILL_DELAY_INTERVAL: delay})
        assert c.connect5(client_id, properties={P.SESSION_EXPIRY_INTERVAL: 3600}, will=will)[:2] == (False, 0)
        c.send(v5.encode_disconnect(0x04))  # Disconnect with Will Message
        c.read_until_closed()
    lost_at = time.monotonic()
    assert sync(watcher) == []  # a persistent session's SUBACK: after the commit that stored both wills
    old = b.router()
    assert old is not None

    os.kill(old.pid, signal.SIGKILL)

    wait_for(lambda: (r := b.router()) is not None and r.pid != old.pid, 5, "a new router")
    # retained, so through the router: its PUBACK says that the worker has joined the new router
    publish(pub, f"{topic}-probe", b"probe", 1, retain=True)
    c = RawClient(b.port)
    assert c.connect5(back, clean_start=False, properties={P.SESSION_EXPIRY_INTERVAL: 3600})[:2] == (True, 0)
    c.send(v5.encode_disconnect())  # back in time: its will is never sent
    c.read_until_closed()
    assert [(m.topic, m.payload) for m in receive(watcher, count=1, timeout=10)] == [(f"{topic}/{due}", b"gone")]
    assert time.monotonic() - lost_at >= 3 - 0.05, "the will came before its delay"
    assert sync(watcher) == [], "a will came twice, or the one of the client that came back"
    c = RawClient(b.port)
    assert c.connect5(due, clean_start=False)[:2] == (True, 0), "the session of the will was lost"
    c.send(v5.encode_disconnect())
    c.read_until_closed()
    for c in (watcher, pub):
        disconnect(c)
    brokers.terminate(b)
    with sqlite3.connect(data / "plexmq.db") as after:
        assert after.execute("SELECT count(*) FROM wills").fetchone() == (0,)


def test_a_store_of_the_previous_schema_is_upgraded_in_place(brokers: Brokers, tmp_path: Path) -> None:
    """A data dir written before MQTT 5 (schema 2) opens: its messages and retained messages gain
    empty properties and no expiry, its sessions the broker's default expiry, and nothing is lost."""
    data = tmp_path / "data"
    data.mkdir()
    db = sqlite3.connect(data / "plexmq.db")
    db.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
        INSERT INTO meta VALUES ('schema', 2);
        CREATE TABLE sessions (client_id TEXT PRIMARY KEY, last_seen REAL NOT NULL);
        CREATE TABLE subscriptions (client_id TEXT NOT NULL, filter TEXT NOT NULL, qos INTEGER NOT NULL,
                                    PRIMARY KEY (client_id, filter)) WITHOUT ROWID;
        CREATE TABLE messages (seq INTEGER PRIMARY KEY, client_id TEXT NOT NULL, packet_id INTEGER NOT NULL,
                               topic BLOB NOT NULL, payload BLOB NOT NULL, qos INTEGER NOT NULL,
                               retain INTEGER NOT NULL, state INTEGER NOT NULL);
        CREATE UNIQUE INDEX message_ids ON messages (client_id, packet_id);
        CREATE TABLE incoming (client_id TEXT NOT NULL, packet_id INTEGER NOT NULL,
                               PRIMARY KEY (client_id, packet_id)) WITHOUT ROWID;
        CREATE TABLE retained (topic TEXT PRIMARY KEY, payload BLOB NOT NULL, qos INTEGER NOT NULL);
        INSERT INTO sessions VALUES ('old-client', 0);
        INSERT INTO subscriptions VALUES ('old-client', 'old/#', 1);
        INSERT INTO messages VALUES (1, 'old-client', 1, x'6f6c642f61', x'717565756564', 1, 0, 0);
        INSERT INTO retained VALUES ('old/r', x'6b657074', 1);
    """)
    db.close()
    b = brokers.start(data)
    c, present = reconnect(b.port, "old-client")
    assert present
    first, body = c.recv()
    assert as_pub(first, body)[:2] == ("old/a", b"queued")
    c.send(p.encode_puback(as_pub(first, body).packet_id))
    assert subscribe(c, 2, [("old/r", 1)]) == [1]
    first, body = c.recv()
    assert as_pub(first, body)[:2] == ("old/r", b"kept")
    c.send(p.encode_puback(as_pub(first, body).packet_id))
    disconnect(c)
    brokers.terminate(b)  # the broker holds the store exclusively: it is read back after the stop
    with sqlite3.connect(data / "plexmq.db") as after:
        assert after.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() == (SCHEMA_VERSION,)
        # the session gained its own expiry: none (-1), so persistent_client_expiration applies
        assert after.execute("SELECT expiry FROM sessions WHERE client_id = 'old-client'").fetchone() == (-1,)
