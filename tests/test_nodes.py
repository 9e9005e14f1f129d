"""A router and nodes on hosts of their own (network namespaces, tests/hosts.py): messages, sessions and
wills cross nodes, and nothing acknowledged is lost when a node or the router dies or a link is cut.

Real processes on real (virtual) links, clients in the root namespace on the front bridge. Waits await
events (CONNACK, SUBACK barriers, metrics, log lines); the timing assertions are the router's notice of a
lost node, which must come within link_timeout and a margin.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from plexmq.mqtt import properties as P
from plexmq.mqtt import v4 as p
from plexmq.mqtt import v5
from tests.conftest import ROOT, wait_for
from tests.hosts import LINK_TIMEOUT, Host, Net, make_keys, net, shared_net  # noqa: F401 (net, shared_net: fixtures)
from tests.mqtt import RawClient
from tests.steps import Pub, as_pub, disconnect_of, ping, publish, receive, recv_publish, subscribe, subscribe5, sync, uid

MARGIN = 3.0  # seconds beyond link_timeout for the router's notice: the last word may be a heartbeat period (1 s)
# before the kill or cut, the router checks for silence once a second, and 1 s of slack
WINDOW = 100  # QoS 1 PUBLISHes a streaming publisher keeps unacknowledged


# -- helpers -----------------------------------------------------------------------------------------


def bye(*clients: RawClient) -> None:
    """DISCONNECT (the will is not published) and close."""
    for c in clients:
        c.send(p.DISCONNECT_PACKET)
        c.read_until_closed()


def seq(i: int) -> bytes:
    return b"%06d" % i


class Reader(threading.Thread):
    """A subscriber's socket read in the background: every PUBLISH recorded and (QoS 1) acknowledged,
    until the connection closes or `stop` is called."""

    def __init__(self, c: RawClient) -> None:
        super().__init__(daemon=True)
        self.c = c
        self.pubs: list[Pub] = []
        self.closed = False
        self.stopping = threading.Event()
        self.start()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                first, body = self.c.recv(0.1)
            except TimeoutError:
                continue
            except (AssertionError, OSError):  # closed by the broker, or reset
                self.closed = True
                return
            assert first >> 4 == p.PUBLISH, f"unexpected packet {first:#x}"
            pub = as_pub(first, body)
            self.pubs.append(pub)
            if pub.qos == 1:
                try:
                    self.c.send(p.encode_puback(pub.packet_id))
                except OSError:
                    self.closed = True
                    return

    def stop(self) -> list[Pub]:
        self.stopping.set()
        self.join(5)
        assert not self.is_alive(), "the reader did not stop"
        return self.pubs


def stream(c: RawClient, topic: str, n: int, kill_at: int, kill: Callable[[], None], stall: float = 15.0) -> set[int]:
    """Publish QoS 1 messages 0..n-1 (payload and packet id from the sequence number) with at most
    WINDOW unacknowledged; call `kill` once `kill_at` are acknowledged. Ends when all are acknowledged,
    the connection closes, or no PUBACK comes for `stall` seconds; the sequence numbers acknowledged."""
    tb = topic.encode()
    acked: set[int] = set()
    sent = 0
    killed = False
    while len(acked) < n:
        if sent < n and sent - len(acked) < WINDOW:
            batch = range(sent, min(sent + WINDOW // 4, n))
            try:
                c.send(b"".join(p.encode_publish(tb, seq(i), 1, packet_id=i + 1) for i in batch))
            except OSError:
                break
            sent = batch.stop
            continue
        try:
            first, body = c.recv(stall)
        except TimeoutError:
            break
        except (AssertionError, OSError):  # closed
            break
        assert first == 0x40, f"unexpected packet {first:#x} on the publisher"
        acked.add(int.from_bytes(body, "big") - 1)
        if not killed and len(acked) >= kill_at:
            killed = True
            kill()
    assert killed, "the stream ended before the kill"
    return acked


def across(net: Net, name: str) -> tuple[str, str, Reader, RawClient]:
    """(client id, topic, its reader, a publisher on n1) of a persistent QoS 1 subscriber on n2 read in
    the background: the stream the kill tests cut."""
    cid, topic = f"nodes-{name}-{uid()}", f"nodes/{name}/{uid()}"
    sub = net.host("n2").client(cid, clean=False)
    assert subscribe(sub, 1, [(topic, 1)]) == [1]
    return cid, topic, Reader(sub), net.host("n1").client()


def check_all_acked_came(acked: set[int], *got: list[Pub]) -> None:
    seqs = {int(m.payload) for pubs in got for m in pubs}
    missing = sorted(acked - seqs)
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged messages were lost: {missing[:10]}"


def plexmq(*args: str) -> str:
    """The output of a `plexmq` tool run as a subprocess (in the root namespace)."""
    done = subprocess.run([sys.executable, "-m", "plexmq.acceptor", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, f"plexmq {' '.join(args)}: exit {done.returncode}\n{done.stdout}{done.stderr}"
    return done.stdout


def wait_node_up(net: Net, name: str, up: float, since: float, limit: float) -> None:
    """Wait until the router's metrics say node `name` is up (1) or lost (0), no later than `limit`
    seconds after `since` (a monotonic time)."""
    wait_for(lambda: net.node_up(name) == up, max(limit - (time.monotonic() - since), 0.0),
             f"plexmq_node_up{{node={name!r}}} == {up:g} within {limit:g} s")


# -- 1. messages, retained messages, wills, shared and persistent sessions across nodes ----------------


def test_the_router_logs_each_node_that_joins_once(shared_net: Net) -> None:
    """One INFO line per node, with its name and address (not one per worker, nor per rejoin)."""
    joined = re.findall(r" INFO plexmq\.router\[\d+\]: node (\S+) joined from (\S+)$", shared_net.router.output(), re.M)
    assert sorted(joined) == [(name, shared_net.host(name).back_ip) for name in ("n1", "n2")]



@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize(("src", "dst"), [("n1", "n2"), ("n2", "n1")], ids=["n1-to-n2", "n2-to-n1"])
def test_a_message_published_on_one_node_reaches_a_subscriber_on_the_other(shared_net: Net, src: str, dst: str,
                                                                           qos: int) -> None:
    topic = f"nodes/cross/{uid()}"
    sub = shared_net.host(dst).client()
    assert subscribe(sub, 1, [(topic, qos)]) == [qos]
    pub = shared_net.host(src).client()
    payloads = [b"%s-%d" % (src.encode(), i) for i in range(5)]
    for i, payload in enumerate(payloads, 1):
        publish(pub, topic, payload, qos, packet_id=i)
    got = receive(sub, count=len(payloads))
    assert [(m.topic, m.payload, m.qos) for m in got] == [(topic, x, qos) for x in payloads]
    assert sync(sub) == [], "a message came twice"
    bye(sub, pub)


def test_a_retained_message_set_on_one_node_reaches_a_new_subscriber_on_the_other(shared_net: Net) -> None:
    topic = f"nodes/retained/{uid()}"
    pub = shared_net.host("n1").client()
    publish(pub, topic, b"kept", 1, retain=True)
    sub = shared_net.host("n2").client()
    assert subscribe(sub, 1, [(topic, 1)]) == [1]
    got = receive(sub, count=1)
    assert [(m.payload, m.retain) for m in got] == [(b"kept", True)]
    publish(pub, topic, b"", 1, retain=True, packet_id=2)  # cleared: the shared hosts as they were
    bye(sub, pub)


def test_the_will_of_a_client_that_drops_its_socket_on_one_node_reaches_the_other(shared_net: Net) -> None:
    topic = f"nodes/will/{uid()}"
    watcher = shared_net.host("n2").client()
    assert subscribe(watcher, 1, [(topic, 1)]) == [1]
    c = shared_net.host("n1").client(will=p.Will(topic, b"dropped", 1, False))
    ping(c)  # connected for sure (the CONNACK came), then gone without DISCONNECT
    c.close()
    got = receive(watcher, count=1)
    assert [(m.topic, m.payload) for m in got] == [(topic, b"dropped")]
    bye(watcher)


def test_a_shared_subscription_with_a_member_on_each_node_gets_each_message_once(shared_net: Net) -> None:
    topic = f"nodes/shared/{uid()}"
    members = [shared_net.host(name).client() for name in ("n1", "n2")]
    for m in members:
        assert subscribe(m, 1, [(f"$share/g/{topic}", 1)]) == [1]
    pub = shared_net.host("n1").client()
    payloads = [seq(i) for i in range(40)]
    for i, payload in enumerate(payloads, 1):
        publish(pub, topic, payload, 1, packet_id=i)  # acknowledged: routed
    got = [sync(m) for m in members]  # a barrier on each member: what was routed to it has come
    counts = Counter(x.payload for pubs in got for x in pubs)
    assert sorted(counts) == payloads, f"missing: {sorted(set(payloads) - set(counts))[:10]}"
    assert {k for k, v in counts.items() if v > 1} == set(), "a message went to more than one member"
    bye(*members, pub)


def test_a_persistent_session_left_on_one_node_is_resumed_on_the_other_with_what_was_queued(shared_net: Net) -> None:
    cid, topic = f"nodes-pers-{uid()}", f"nodes/pers/{uid()}"
    n1, n2 = shared_net.host("n1"), shared_net.host("n2")
    sub = n2.client(cid, clean=False)
    assert subscribe(sub, 1, [(topic, 1)]) == [1]
    bye(sub)
    pub = n1.client()
    queued = [b"q%d" % i for i in range(5)]
    for i, payload in enumerate(queued, 1):
        publish(pub, topic, payload, 1, packet_id=i)
    sub = n1.raw()
    assert sub.connect(cid, clean=False) == (True, 0), "the session left on n2 was not present on n1"
    got = receive(sub, payloads=queued)
    got += sync(sub)
    assert [m.payload for m in got] == queued
    bye(sub, pub)
    sub = n1.client(cid, clean=True)  # the session dropped: the shared hosts as they were
    bye(sub)


def test_status_and_clients_show_both_nodes_and_the_clients_node(shared_net: Net) -> None:
    tag = uid()
    a, b = shared_net.host("n1").client(f"st-a-{tag}"), shared_net.host("n2").client(f"st-b-{tag}")

    def listed() -> dict[str, str] | None:
        out = plexmq("clients", "--metrics", shared_net.metrics_url, "--token-file", shared_net.token_file, "--filter", tag)
        rows = {line.split()[0]: line.split()[1] for line in out.splitlines() if tag in line}
        return rows if len(rows) == 2 else None
    assert wait_for(listed, 10, "plexmq clients to list both clients") == {f"st-a-{tag}": "n1/0", f"st-b-{tag}": "n2/0"}

    def nodes() -> dict[str, tuple[str, ...]] | None:
        out = plexmq("status", "--metrics", shared_net.metrics_url, "--once")
        rows = {m[0]: m[1:] for m in re.findall(r"^(n[12]) +(\S+) +(\S+) +(\d+) +(\d+)$", out, re.M)}
        return rows if len(rows) == 2 and all(int(r[3]) >= 1 for r in rows.values()) else None
    rows = wait_for(nodes, 10, "plexmq status to show both nodes up with a client each")
    assert {name: row[:3] for name, row in rows.items()} == {
        name: (shared_net.host(name).back_ip, "up", "1") for name in ("n1", "n2")}
    # $SYS (retained, refreshed every second on this router) names them too
    assert subscribe(a, 1, [("$SYS/broker/nodes/+/state", 0), ("$SYS/broker/nodes/+/address", 0)]) == [0, 0]
    seen = {(m.topic, m.payload) for m in receive(a, count=4)}
    assert seen >= {(f"$SYS/broker/nodes/{name}/{key}", value.encode()) for name in ("n1", "n2")
                    for key, value in (("state", "up"), ("address", shared_net.host(name).back_ip))}, seen
    bye(a, b)


def test_a_node_stopped_gracefully_has_the_router_publish_its_clients_wills_at_once(shared_net: Net) -> None:
    """SIGTERM to a node: its worker says BYE before it goes, so the router takes it for dead then
    (not link_timeout later) and publishes the wills of its clients."""
    n6 = shared_net.start_node("n6")
    topic = f"nodes/bye/{uid()}"
    watcher = shared_net.host("n1").client()
    assert subscribe(watcher, 1, [(topic, 1)]) == [1]
    doomed = n6.raw()
    assert doomed.connect(f"bye-{uid()}", will=p.Will(topic, b"node stopped", 1, False)) == (False, 0)
    n6.stop()
    doomed.read_until_closed()
    assert [m.payload for m in receive(watcher, count=1)] == [b"node stopped"]
    assert "worker n6/w0 stopped: taken for dead" in shared_net.router.output(), shared_net.router.output()[-2000:]
    assert sync(watcher) == [], "the will was published twice"
    bye(watcher)


def test_the_acl_of_a_node_applies_to_its_clients(shared_net: Net, tmp_path: Path) -> None:
    """Logins and the ACL are the nodes' (deploy/nodes.md): anonymous clients of n5 may read acl/# and
    write nothing; a message from n1 reaches them, theirs reach nobody, other filters are refused."""
    acl = tmp_path / "acl"
    acl.write_text("topic read nodes/acl/#\n")
    n5 = shared_net.start_node("n5", config=f'acl_file = "{acl}"\n')
    try:
        topic = f"nodes/acl/{uid()}"
        reader = n5.client()
        assert subscribe(reader, 1, [(topic, 1), ("nodes/other/#", 1)]) == [1, 0x80]
        watcher, pub = shared_net.host("n1").client(), shared_net.host("n1").client()
        assert subscribe(watcher, 1, [(topic, 1)]) == [1]
        publish(reader, topic, b"denied on n5", 1)  # acknowledged (3.1.1 has no refusal) and dropped
        publish(pub, topic, b"from n1", 1)
        assert [m.payload for m in receive(reader, count=1)] == [b"from n1"]
        assert [m.payload for m in receive(watcher, count=1)] == [b"from n1"]
        assert sync(watcher) == [] and sync(reader) == []
        bye(reader, watcher, pub)
    finally:
        n5.stop()


# -- 2. a session taken over from another node -------------------------------------------------------


def test_a_client_id_connecting_on_another_node_takes_the_session_over(shared_net: Net) -> None:
    """The 5.0 connection on n1 hears DISCONNECT 0x8E (session taken over) and closes; the persistent
    session (its subscription) continues on n2."""
    cid, topic = f"nodes-take-{uid()}", f"nodes/take/{uid()}"
    expiry = {P.SESSION_EXPIRY_INTERVAL: 600}
    old = shared_net.host("n1").raw()
    assert old.connect5(cid, properties=expiry)[:2] == (False, 0)
    old.send(v5.encode_subscribe(1, [(topic, 1)]))
    assert old.recv()[0] == 0x90

    new = shared_net.host("n2").raw()
    assert new.connect5(cid, clean_start=False, properties=expiry)[:2] == (True, 0), "no session present on n2"
    rest = old.read_until_closed()
    assert rest[:1] == b"\xe0" and rest[2:3] == b"\x8e", f"n1 closed without DISCONNECT 0x8E: {rest!r}"

    pub = shared_net.host("n1").client()
    publish(pub, topic, b"after", 1)
    first, body = new.recv()
    got_topic, packet_id, payload, _props = v5.decode_publish(first & 15, body, from_server=True)
    assert (got_topic, payload) == (topic, b"after")
    new.send(v5.encode_ack(v5.PUBACK, packet_id))
    new.send(v5.encode_disconnect(0, {P.SESSION_EXPIRY_INTERVAL: 0}))  # the session ends with it
    new.read_until_closed()
    bye(pub)


# -- 3. a node killed mid-stream ---------------------------------------------------------------------


def test_sigkill_of_a_node_loses_no_acknowledged_message_of_its_persistent_subscriber(net: Net) -> None:
    """The subscriber's node dies while QoS 1 streams to it from n1: the router takes n2 for lost
    within link_timeout, and the subscriber, back on n1, gets every acknowledged message."""
    n, n1, n2 = 3000, net.host("n1"), net.host("n2")
    cid, topic, reader, pub = across(net, "kill")
    killed_at = 0.0

    def kill() -> None:
        nonlocal killed_at
        n2.kill()
        killed_at = time.monotonic()

    acked = stream(pub, topic, n, kill_at=n // 3, kill=kill)
    assert acked == set(range(n)), f"n1 acknowledged {len(acked)} of {n}: the publisher's node is alive"
    before = reader.stop()
    assert reader.closed and 0 < len(before) < n, f"{len(before)} came before the kill: not mid-stream"
    wait_node_up(net, "n2", 0, killed_at, LINK_TIMEOUT + MARGIN)

    sub = n1.raw()
    assert sub.connect(cid, clean=False) == (True, 0), "the persistent session was lost"
    after = receive(sub, payloads=[seq(i) for i in acked - {int(m.payload) for m in before}])
    after += sync(sub)
    check_all_acked_came(acked, before, after)
    assert "taken for dead" in net.router.output(), net.router.output()[-3000:]
    bye(sub, pub)


# -- 4. the router killed mid-stream -----------------------------------------------------------------


def test_sigkill_of_the_router_loses_no_acknowledged_message(net: Net) -> None:
    """The router process dies while QoS 1 streams from n1 to a persistent subscriber on n2; its
    acceptor restarts it, both nodes join again, and every acknowledged message reaches the subscriber.
    Observed: publisher and subscriber stay connected throughout (their nodes live on); the node's
    worker sends again what the dead router had not confirmed, so every message is acknowledged in the
    end without the publisher sending anything twice."""
    n, n1, n2 = 3000, net.host("n1"), net.host("n2")
    cid, topic, reader, pub = across(net, "rk")
    old = net.router.child("plexmq.router")
    assert old is not None, f"no router process under the router host's acceptor: {net.router.processes()}"

    acked = stream(pub, topic, n, kill_at=n // 3, kill=old.kill)

    def restarted() -> psutil.Process | None:
        fresh = net.router.child("plexmq.router")
        return fresh if fresh is not None and fresh.pid != old.pid else None
    wait_for(restarted, 10, "the router host's acceptor to start a new router")
    for node in (n1, n2):
        net.wait_joined(node.name)
        assert "joined the router again" in node.output(), f"{node.name} did not join again:\n{node.output()[-3000:]}"
    assert not reader.closed, "the subscriber's connection closed"
    ping(pub)
    missing = sorted(set(range(n)) - acked)
    assert not missing, f"never acknowledged after the restart: {missing[:10]} ({len(missing)})"
    wait_for(lambda: {int(m.payload) for m in reader.pubs} >= acked, 15,
             "every acknowledged message to reach the subscriber")
    check_all_acked_came(acked, reader.stop(), sync(reader.c))
    bye(reader.c, pub)


# -- 5. a cut link -----------------------------------------------------------------------------------


def test_a_cut_link_takes_the_node_for_lost_and_healing_it_brings_its_clients_back(net: Net) -> None:
    """n1's back link cut silently: within link_timeout the router takes n1 for lost and publishes the
    will of its client; healed, n1 joins again and its client, connected throughout, gets what was
    queued for its persistent session meanwhile and new messages."""
    tag = uid()
    will_t, queue_t = f"nodes/cut/{tag}/will", f"nodes/cut/{tag}/q"
    n1, n2 = net.host("n1"), net.host("n2")
    watcher = n2.client()
    assert subscribe(watcher, 1, [(will_t, 1)]) == [1]
    pub = n2.client()
    pers = n1.client(f"nodes-cut-{tag}", clean=False, will=p.Will(will_t, b"cut off", 1, False))
    assert subscribe(pers, 1, [(queue_t, 1)]) == [1]

    n1.cut()
    cut_at = time.monotonic()
    wait_node_up(net, "n1", 0, cut_at, LINK_TIMEOUT + MARGIN)
    got = receive(watcher, count=1, timeout=MARGIN)
    assert [(m.topic, m.payload) for m in got] == [(will_t, b"cut off")]
    queued = [b"while-cut-%d" % i for i in range(3)]
    for i, payload in enumerate(queued, 1):
        publish(pub, queue_t, payload, 1, packet_id=i)

    n1.heal()
    net.wait_joined("n1")
    got = receive(pers, payloads=queued, timeout=10)
    assert [m.payload for m in got] == queued
    ping(pers)  # the same connection: it was never closed
    publish(pub, queue_t, b"after", 1, packet_id=10)
    assert [m.payload for m in receive(pers, count=1)] == [b"after"]
    assert sync(watcher) == [], "the will was published more than once"
    assert "taken for dead" in net.router.output(), net.router.output()[-3000:]
    assert "joined the router again" in n1.output(), n1.output()[-3000:]
    bye(pers, watcher, pub)


# -- 6. strangers ------------------------------------------------------------------------------------


def test_a_node_with_other_keys_never_joins_and_refuses_clients(shared_net: Net, tmp_path: Path) -> None:
    """n3 has keys of its own; n4 the router's server key but a client key of its own (refused by the
    router's ZAP handler, not by the handshake's crypto). Neither joins, and once its join has gone
    unanswered each refuses a CONNECT (3.1.1: 0x03; 5.0: 0x88 Server unavailable, saying why) rather
    than accept a client whose SUBSCRIBE or QoS 1 PUBLISH would never be answered; the router keeps
    serving n1 and n2."""
    topic = f"nodes/stranger/{uid()}"
    other = make_keys(tmp_path / "other")
    impostor = make_keys(tmp_path / "impostor")
    (impostor / "server.key_secret").write_bytes((shared_net.keys / "server.key_secret").read_bytes())
    sub = shared_net.host("n2").client()
    assert subscribe(sub, 1, [(topic, 1)]) == [1]
    strangers = [shared_net.start_node("n3", keys=other, join=False),
                 shared_net.start_node("n4", keys=impostor, join=False)]
    try:
        def refusal(s: Host) -> int:
            c = s.raw()
            try:
                return c.connect(f"stranger-{uid()}")[1]
            finally:
                c.close()

        # No event says "refused" on the router's side (ZeroMQ drops the handshake silently): each
        # stranger's first second is a grace for its join's answer, then its clients are refused
        wait_for(lambda: all(refusal(s) == 0x03 for s in strangers), 15, "the strangers to refuse a 3.1.1 CONNECT")
        for s in strangers:
            c = s.raw()
            _present, code, told = c.connect5(f"stranger5-{uid()}")
            assert code == 0x88 and told[P.REASON_STRING].startswith("no router: no answer from the router at"), told
            assert c.read_until_closed() == b""

        def warned() -> bool:
            assert not {"n3", "n4"} & shared_net.nodes(), f"a stranger joined: {shared_net.nodes()}"
            return all("no answer from the router" in s.since_start() for s in strangers)
        wait_for(warned, 15, "the strangers' workers to report no answer from the router")
        for s in strangers:  # a refused link loses frames quietly; the warning is all an operator sees
            assert "Traceback" not in s.since_start(), s.since_start()[-3000:]
        pub = shared_net.host("n1").client()
        publish(pub, topic, b"from n1", 1)
        assert [m.payload for m in receive(sub, count=1)] == [b"from n1"]
        assert sync(sub) == []
        bye(sub, pub)
    finally:
        for s in strangers:
            s.stop()


# -- 7. tenants across nodes -------------------------------------------------------------------------


def test_two_tenants_on_two_nodes_stay_apart_and_take_over_within_their_own(shared_net: Net) -> None:
    """Tenants a and b, the same topic and client id on both nodes: a's subscriber on t1 gets a's message
    from t2 and never b's; b's client with that id takes nothing over; a's id moving to t2 takes a's
    session over (DISCONNECT 0x8E on t1), and b's client lives on."""
    tenants = 'tenant_separator = "@"\n[tenants.a]\n[tenants.b]\n'
    t1, t2 = (shared_net.start_node(name, config=tenants) for name in ("t1", "t2"))
    try:
        cid, topic = f"nodes-tenant-{uid()}", f"nodes/tenant/{uid()}"
        expiry = {P.SESSION_EXPIRY_INTERVAL: 600}
        a_sub = t1.raw()
        assert a_sub.connect5(cid, properties=expiry, username="s@a")[:2] == (False, 0)
        assert subscribe5(a_sub, 1, [(topic, 1)]) == [1]
        b_sub = t2.client(cid, username="s@b")  # the same id in b: a's session stays where it is
        assert subscribe(b_sub, 1, [(topic, 1)]) == [1]
        a_pub, b_pub = t2.client(username="p@a"), t1.client(username="p@b")
        publish(b_pub, topic, b"for b", 1)
        publish(a_pub, topic, b"for a", 1)
        assert [m.payload for m in receive(b_sub, count=1)] == [b"for b"]
        assert sync(b_sub) == []
        _topic, packet_id, payload, _props, _first = recv_publish(a_sub)
        assert payload == b"for a"
        a_sub.send(v5.encode_ack(v5.PUBACK, packet_id))
        assert subscribe5(a_sub, 2, [(f"barrier/{uid()}", 0)]) == [0], "b's message reached a"

        new = t2.raw()
        assert new.connect5(cid, clean_start=False, properties=expiry, username="s@a")[:2] == (True, 0)
        assert disconnect_of(a_sub)[0] == 0x8E
        publish(a_pub, topic, b"after", 1, packet_id=2)
        assert recv_publish(new)[2] == b"after"
        assert sync(b_sub) == [], "a's message reached b"
        new.send(v5.encode_disconnect(0, {P.SESSION_EXPIRY_INTERVAL: 0}))  # a's session ends with it
        new.read_until_closed()
        bye(b_sub, a_pub, b_pub)
    finally:
        t1.stop()
        t2.stop()
