"""The worker↔router records (plexmq/wire.py): each encodes to the bytes peers of this protocol
version expect and decodes back; every sender writes its record and every record has its handler;
a peer of another protocol version is refused in words on both sides.

The table of records follows mochi-mqtt's packets fixtures: a case names a record, its value and the
header bytes it travels as, so a change of any record's bytes shows here (and asks for PROTOCOL+1).
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import zmq
import zmq.auth

from plexmq import wire
from plexmq.acceptor.supervisor import Child, Supervisor
from plexmq.process import LINK_REFUSED
from plexmq.router.core import Router
from plexmq.workers import from_router
from plexmq.workers.link import RouterLink
from tests.conftest import ROOT, Broker, wait_for
from tests.hosts import make_keys
from tests.link_peer import hello, link_peer, router_endpoint


class Case(NamedTuple):
    desc: str
    kind: int
    record: Any  # a record of plexmq/wire.py
    header: bytes  # as it travels


CASES = [
    Case("hello", wire.HELLO, wire.Hello(wire.PROTOCOL, 2, "n1", "10.0.0.2", 4242, [1, 7], "tcp://10.0.0.2:7000"),
         b'{"protocol":%d,"worker":2,"node":"n1","address":"10.0.0.2","pid":4242,"live":[1,7],'
         b'"direct":"tcp://10.0.0.2:7000"}' % wire.PROTOCOL),
    Case("connect with a 5.0 will", wire.CONNECT,
         wire.Connect(3, "c1", True, "u", "will/t", 1, True, 0, True, 60, [5, "0102", 30], "acme", 5, 123456789012),
         b'[3,"c1",false,"u","will/t",1,true,0,true,60,[5,"0102",30],"acme",5,123456789012]'),
    Case("connect registered again, no will", wire.CONNECT,
         wire.Connect(4, "c2", False, None, None, 0, False, 9, False, -1, None),
         b'[4,"c2",true,null,null,0,false,9,false,-1,null,"",0,0]'),
    Case("subscribe", wire.SUBSCRIBE, wire.Subscribe(3, 10, [["a/+", 1], ["b", 0x87]]),
         b'[3,10,[["a/+",1],["b",135]]]'),
    Case("unsubscribe", wire.UNSUBSCRIBE, wire.Unsubscribe(3, 11, ["a/+"]), b'[3,11,["a/+"]]'),
    Case("rel", wire.REL, wire.Rel(3, 0x1234), b"\x03\x00\x00\x00\x34\x12"),
    Case("gone with its will", wire.GONE, wire.Gone(3, True), b"\x03\x00\x00\x00\x01"),
    Case("gone without", wire.GONE, wire.Gone(3, False), b"\x03\x00\x00\x00\x00"),
    Case("session expiry", wire.SESSION_EXPIRY, wire.SessionExpiry(3, 300), b"\x03\x00\x00\x00\x2c\x01\x00\x00"),
    Case("stats", wire.STATS, wire.Stats("n1/0", "n1", 42, 5, 1, 2, 3, 4, 5, 6, {"3.1.1": 5}, 7, 0.5, 1024, 8, 9,
                                          {"a": {"connections": 1, "refused": {"not_authorized": 2}}}, {"a": [["t/1", 64]]},
                                          [[3, 40]]),
         b'{"id":"n1/0","node":"n1","pid":42,"clients":5,"dropped":1,"denied":2,"withheld":3,"refused":4,'
         b'"auth_failures":5,"queued":6,"protocols":{"3.1.1":5},"shed":7,"cpu":0.5,"rss":1024,'
         b'"local_received":8,"local_sent":9,"tenants":{"a":{"connections":1,"refused":{"not_authorized":2}}},'
         b'"topics":{"a":[["t/1",64]]},"traced":[[3,40]]}'),
    Case("clients", wire.CLIENTS,
         wire.Clients(7, "0", [["c1", "1.2.3.4:5", 60, 0, 0, True, "5.0", "a", "u", 1700000000.5, 1, 2, 30, 40]], 3),
         b'{"id":7,"worker":"0","clients":[["c1","1.2.3.4:5",60,0,0,true,"5.0","a","u",1700000000.5,1,2,30,40]],'
         b'"matched":3}'),
    Case("routes ack", wire.ROUTES_ACK, wire.RoutesAck(9), b"\x09\x00\x00\x00"),
    Case("kicked", wire.KICKED, wire.Kicked(3), b"\x03\x00\x00\x00"),
    Case("traces ack", wire.TRACES_ACK, wire.TracesAck(4), b"\x04\x00\x00\x00"),
    Case("traced", wire.TRACED, wire.Traced(3, "t/a", 1, True, 2048, "c1", 1700000000.5),
         b'[3,"t/a",1,true,2048,"c1",1700000000.5]'),
    Case("bans ack", wire.BANS_ACK, wire.BansAck(4, 2), b"[4,2]"),
    Case("session present", wire.SESSION, wire.Session(3, True, [["a/+", 1]]), b'[3,true,[["a/+",1]],""]'),
    Case("session refused", wire.SESSION, wire.Session(3, False, [], "max_connections"), b'[3,false,[],"max_connections"]'),
    Case("suback", wire.SUBACK, wire.Suback(3, 10, [1, 0x87], [["a/+", 1], ["b", -1]]),
         b'[3,10,[1,135],[["a/+",1],["b",-1]]]'),
    Case("unsuback", wire.UNSUBACK, wire.Unsuback(3, 11, b"\x00\x11"), b"\x03\x00\x00\x00\x0b\x00\x00\x11"),
    Case("resend rel", wire.RESEND_REL, wire.ResendRel(3, 40000), b"\x03\x00\x00\x00\x40\x9c"),
    Case("kick", wire.KICK, wire.Kick(3), b"\x03\x00\x00\x00"),
    Case("list clients", wire.LIST_CLIENTS, wire.ListClients(7, "sensor", None),
         b'{"id":7,"filter":"sensor","tenant":null,"protocol":"","exact":false,"most":0,"sort":"client_id","descending":false}'),
    Case("list a tenant's 5.0 clients, the first 100", wire.LIST_CLIENTS, wire.ListClients(7, "", "a", "5.0", False, 100),
         b'{"id":7,"filter":"","tenant":"a","protocol":"5.0","exact":false,"most":100,"sort":"client_id","descending":false}'),
    Case("list one client", wire.LIST_CLIENTS, wire.ListClients(7, "c1", None, "", True, 1),
         b'{"id":7,"filter":"c1","tenant":null,"protocol":"","exact":true,"most":1,"sort":"client_id","descending":false}'),
    Case("list the most active clients", wire.LIST_CLIENTS,
         wire.ListClients(7, "", None, "", False, 20, "messages_out", True),
         b'{"id":7,"filter":"","tenant":null,"protocol":"","exact":false,"most":20,"sort":"messages_out","descending":true}'),
    Case("close", wire.CLOSE, wire.Close(3), b"\x03\x00\x00\x00"),
    Case("routes", wire.ROUTES, wire.Routes(2, False, [["t", "a/+", ["w0", ""]]]), b'[2,false,[["t","a/+",["w0",""]]]]'),
    Case("traces", wire.TRACES, wire.Traces(2, [[3, "a", "t/#", "", ""], [4, "a", "#", "username", "u"]]),
         b'[2,[[3,"a","t/#","",""],[4,"a","#","username","u"]]]'),
    Case("directory", wire.DIRECTORY, wire.Directory({"n2/w0": "tcp://10.0.0.3:7000"}), b'{"n2/w0":"tcp://10.0.0.3:7000"}'),
    Case("bans", wire.BANS, wire.Bans(3, False, [["*", "address", "10.0.0.0/8", "scan", 0.0, "ops", 1700000000.5]],
                                      [["", "client_id", "c1"]]),
         b'[3,false,[["*","address","10.0.0.0/8","scan",0.0,"ops",1700000000.5]],[["","client_id","c1"]]]'),
    Case("sync", wire.SYNC, wire.Sync(7), b"\x07\x00\x00\x00\x00\x00\x00\x00"),
    Case("synced", wire.SYNCED, wire.Sync(7), b"\x07\x00\x00\x00\x00\x00\x00\x00"),
    Case("rejoin", wire.REJOIN, wire.Rejoin(5), b"\x05\x00\x00\x00"),
    Case("refused", wire.REFUSED, wire.Refused(1), b"\x01\x00\x00\x00"),
    Case("standby", wire.STANDBY, wire.Standby("b", "tcp://10.0.0.1:7883"), b'["b","tcp://10.0.0.1:7883"]'),
]

TO_ROUTER = (wire.HELLO, wire.CONNECT, wire.SUBSCRIBE, wire.UNSUBSCRIBE, wire.PUB, wire.ACK, wire.REL, wire.GONE,
             wire.PUB0, wire.STATS, wire.CLIENTS, wire.SESSION_EXPIRY, wire.PUB0_V5, wire.ROUTES_ACK, wire.BYE,
             wire.KICKED, wire.TRACES_ACK, wire.TRACED, wire.BANS_ACK, wire.SYNCED)
TO_WORKER = (wire.SESSION, wire.SUBACK, wire.UNSUBACK, wire.ROUTED, wire.DELIVER, wire.RESEND_REL, wire.KICK,
             wire.DELIVER_RAW, wire.LIST_CLIENTS, wire.CLOSE, wire.DELIVER_RAW_V5, wire.ROUTES, wire.REJOIN, wire.BEAT,
             wire.REFUSED, wire.STANDBY, wire.TRACES, wire.DIRECTORY, wire.BANS, wire.SYNC)


@pytest.mark.parametrize("case", CASES, ids=[c.desc for c in CASES])
def test_a_record_encodes_to_its_bytes_and_decodes_back(case: Case) -> None:
    assert case.record.encode() == case.header
    assert type(case.record).decode(case.header) == case.record


def test_every_kind_is_one_direction_and_numbered_once() -> None:
    assert not set(TO_ROUTER) & set(TO_WORKER)
    assert len(set(TO_ROUTER + TO_WORKER)) == len(TO_ROUTER + TO_WORKER)
    assert {c.kind for c in CASES} <= set(TO_ROUTER + TO_WORKER)


def test_every_record_has_its_handler_at_the_other_end() -> None:
    assert set(from_router.HANDLERS) == set(TO_WORKER)
    assert set(Router(10, 10)._handlers) == set(TO_ROUTER)


def records_of(batch: wire.Batch) -> list[tuple[int, bytes, bytes]]:
    return list(wire.records(batch.take()))


def test_the_workers_senders_write_their_records() -> None:
    link: Any = types.SimpleNamespace(batch=wire.Batch(), unrouted=0, batched=0)
    connect = wire.Connect(3, "c1", False, None, "w", 0, False, 0, True, -1, None)
    stats = next(c.record for c in CASES if c.kind == wire.STATS)
    sends: list[tuple[Callable[..., None], tuple, int, Any, bytes]] = [
        (RouterLink.connect, (connect, b"will"), wire.CONNECT, connect, b"will"),
        (RouterLink.subscribe, (3, 10, [["a", 1]]), wire.SUBSCRIBE, wire.Subscribe(3, 10, [["a", 1]]), b""),
        (RouterLink.unsubscribe, (3, 11, ["a"]), wire.UNSUBSCRIBE, wire.Unsubscribe(3, 11, ["a"]), b""),
        (RouterLink.rel, (3, 12), wire.REL, wire.Rel(3, 12), b""),
        (RouterLink.gone, (3, True), wire.GONE, wire.Gone(3, True), b""),
        (RouterLink.session_expiry, (3, 0), wire.SESSION_EXPIRY, wire.SessionExpiry(3, 0), b""),
        (RouterLink.stats, (stats,), wire.STATS, stats, b""),
        (RouterLink.clients, (7, "0", [], 4), wire.CLIENTS, wire.Clients(7, "0", [], 4), b""),
        (RouterLink.routes_ack, (4,), wire.ROUTES_ACK, wire.RoutesAck(4), b""),
        (RouterLink.kicked, (3,), wire.KICKED, wire.Kicked(3), b""),
        (RouterLink.traces_ack, (2,), wire.TRACES_ACK, wire.TracesAck(2), b""),
        (RouterLink.bans_ack, (2, 1), wire.BANS_ACK, wire.BansAck(2, 1), b""),
        (RouterLink.traced, (3, b"t/a", 1, False, b"x" * 2000, "c1", 5.0), wire.TRACED,
         wire.Traced(3, "t/a", 1, False, 2000, "c1", 5.0), b"x" * wire.TRACED_PAYLOAD),
    ]
    for send, args, kind, record, payload in sends:
        send(link, *args)
        assert records_of(link.batch) == [(kind, record.encode(), payload)], send.__name__
    RouterLink.bye(link)
    assert records_of(link.batch) == [(wire.BYE, b"", b"")]


def test_the_routers_senders_write_their_records() -> None:
    out = wire.ToWorker()
    out.session(3, False, [])
    out.suback(3, 10, [0], [["a", 0]])
    out.unsuback(3, 11, b"\x11")
    out.resend_rel(3, 40000)
    out.kick(3)
    out.list_clients(wire.ListClients(7, "", None))
    out.close(3)
    out.rejoin(5)
    out.traces(2, [[3, "", "t/#", "", ""]])
    out.bans(wire.Bans(4, True, [], []))
    out.beat()
    out.refused()
    assert records_of(out) == [
        (wire.SESSION, wire.Session(3, False, []).encode(), b""),
        (wire.SUBACK, wire.Suback(3, 10, [0], [["a", 0]]).encode(), b""),
        (wire.UNSUBACK, wire.Unsuback(3, 11, b"\x11").encode(), b""),
        (wire.RESEND_REL, wire.ResendRel(3, 40000).encode(), b""),
        (wire.KICK, wire.Kick(3).encode(), b""),
        (wire.LIST_CLIENTS, wire.ListClients(7, "", None).encode(), b""),
        (wire.CLOSE, wire.Close(3).encode(), b""),
        (wire.REJOIN, wire.Rejoin(5).encode(), b""),
        (wire.TRACES, wire.Traces(2, [[3, "", "t/#", "", ""]]).encode(), b""),
        (wire.BANS, wire.Bans(4, True, [], []).encode(), b""),
        (wire.BEAT, b"", b""),
        (wire.REFUSED, wire.Refused(wire.PROTOCOL).encode(), b""),
    ]


# -- the hot records: packed where sent, unpacked where handled ---------------------------------------


@pytest.mark.parametrize("props, expiry", [(b"", 0), (b"\x01\x01", 0), (b"", 1700000000), (b"\x03\x00\x01t", 5)])
@pytest.mark.parametrize("qos, retain, ask", [(0, False, False), (1, True, False), (2, False, True)])
def test_pub_round_trips(props: bytes, expiry: int, qos: int, retain: bool, ask: bool) -> None:
    link: Any = types.SimpleNamespace(batch=wire.Batch(), unrouted=0, batched=0)
    RouterLink.pub(link, 3, 12, qos, retain, b"a/b", b"payload", props, expiry, ask)
    ((kind, header, payload),) = records_of(link.batch)
    assert (kind, payload, link.unrouted) == (wire.PUB, b"payload", 1)
    conn, packet_id, flags = wire.unpack_pub(header)
    start = wire.PUB_HEAD.size
    got_props, got_expiry = b"", 0
    if flags & wire.HAS_EXTRA:
        got_props, got_expiry, start = wire.read_extra(header, start)
    assert (conn, packet_id, flags & 3, bool(flags & 4), bool(flags & wire.MATCH_ASKED)) == (3, 12, qos, retain, ask)
    assert (header[start:], got_props, got_expiry) == (b"a/b", props, expiry)


@pytest.mark.parametrize("v5", [False, True])
def test_pub0_round_trips(v5: bool) -> None:
    link: Any = types.SimpleNamespace(batch=wire.Batch(), unrouted=0, batched=0)
    RouterLink.pub0(link, 3, b"a/b", 2, b"packets", v5)
    ((kind, header, payload),) = records_of(link.batch)
    assert kind == (wire.PUB0_V5 if v5 else wire.PUB0) and payload == b"packets"
    assert wire.unpack_pub0(header) == (2, 3) and header[wire.PUB0_HEAD.size:] == b"a/b"


def test_ack_round_trips() -> None:
    link: Any = types.SimpleNamespace(batch=wire.Batch(), batched=0)
    RouterLink.ack(link, 3, 40000, wire.ACK_RECEIVED)
    assert [(k, wire.unpack_ack(h)) for k, h, _p in records_of(link.batch)] == \
        [(wire.ACK, (3, 40000, wire.ACK_RECEIVED))]


@pytest.mark.parametrize("props, expiry", [(b"", 0), (b"\x01\x01", 1700000000)])
def test_deliver_round_trips(props: bytes, expiry: int) -> None:
    out = wire.ToWorker()
    subs = wire.pack_subscriber(3, 1, 0) + wire.pack_subscriber(4, 2, 40000)
    out.deliver(wire.deliver_head(b"a/b", 2, True, True, props, expiry), subs, b"payload")
    ((kind, header, payload),) = records_of(out)
    assert (kind, payload) == (wire.DELIVER, b"payload")
    flags, topic_len = wire.unpack_deliver(header)
    start = wire.DELIVER_HEAD.size + topic_len
    assert header[wire.DELIVER_HEAD.size:start] == b"a/b" and flags & 15 == wire.pub_flags(2, True, True)
    extra = (b"", 0)
    if flags & wire.HAS_EXTRA:
        *extra, start = wire.read_extra(header, start)  # type: ignore[assignment]  # a list where a tuple was
    assert tuple(extra) == (props, expiry)
    assert list(wire.iter_subscribers(header[start:])) == [(3, 1, 0), (4, 2, 40000)]


@pytest.mark.parametrize("form, kind", [(0, wire.DELIVER_RAW), (1, wire.DELIVER_RAW_V5)])
def test_deliver_raw_round_trips(form: int, kind: int) -> None:
    out = wire.ToWorker()
    out.deliver_raw(wire.pack_subscriber(3, 0, 0), b"packets", form, 2)
    assert [(k, wire.COUNT.unpack_from(h)[0], list(wire.iter_subscribers(h[wire.COUNT.size:])), p)
            for k, h, p in records_of(out)] == [(kind, 2, [(3, 0, 0)], b"packets")]


@pytest.mark.parametrize("counts", [[0, 1], [2, 3], [3, 3, 0, 2]])
def test_routed_round_trips(counts: list[int]) -> None:
    out = wire.ToWorker()
    out.routed(counts)
    ((kind, header, _payload),) = records_of(out)
    assert kind == wire.ROUTED and wire.read_routed(header) == (counts[0], counts[1], tuple(counts[2:]))


def test_a_truncated_frame_is_refused() -> None:
    with pytest.raises(ValueError):
        list(wire.records(wire.record(wire.KICK, wire.Kick(3).encode())[:-1]))


# -- protocol versions -------------------------------------------------------------------------------


def test_a_hello_of_another_version_is_read_as_far_as_its_refusal_names_it() -> None:
    assert wire.Hello.decode(b'{"protocol":99,"worker":1,"node":"n1","address":"x","pid":1,"live":[],"new":1}') == \
        wire.Hello(99, 1, "n1", "", 0, [])
    before_versions = b'{"worker":1,"node":"n1","address":"","pid":1,"live":[]}'
    assert wire.Hello.decode(before_versions).protocol == 0


def test_the_router_refuses_a_worker_of_another_version_and_reads_nothing_after_its_hello(
        caplog: pytest.LogCaptureFixture) -> None:
    router = Router(10, 10)
    worker = b"n1/w0"
    batch = wire.Batch()
    batch.add(wire.HELLO, wire.Hello(wire.PROTOCOL + 1, 0, "n1", "10.0.0.2", 1, []).encode())
    batch.add(wire.CONNECT, wire.Connect(1, "c1", True, None, None, 0, False, 0, False, -1, None).encode())
    assert router.links.accept(worker, wire.LINK.pack(1, 0))
    with caplog.at_level(logging.WARNING, "plexmq.router"):
        router.handle_frame(worker, batch.take())
    assert not router.default.sessions and worker not in router.links.alive()
    frames = router.take_frames(split=False)
    assert [(w, list(wire.records(now))) for w, now, _later in frames] == \
        [(worker, [(wire.REFUSED, wire.Refused(wire.PROTOCOL).encode(), b"")])]
    assert [r.getMessage() for r in caplog.records] == [
        f"worker n1/w0 speaks link protocol {wire.PROTOCOL + 1}, this router {wire.PROTOCOL} (run the same plexmq "
        "version on both), refused: taken for dead, 0 sessions disconnected"]


def test_a_worker_refused_by_the_router_says_both_versions_and_stops(caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.new_event_loop()
    try:
        stopped: list[bool] = []
        worker: Any = types.SimpleNamespace(loop=loop, exit_status=0, stop=lambda: stopped.append(True))
        with caplog.at_level(logging.CRITICAL, "plexmq.worker"):
            from_router.refused(worker, wire.Refused(wire.PROTOCOL + 1).encode(), b"")
        loop.call_soon(loop.stop)
        loop.run_forever()
    finally:
        loop.close()
    assert worker.exit_status == LINK_REFUSED and stopped == [True]
    assert [r.getMessage() for r in caplog.records] == [
        f"the router speaks link protocol {wire.PROTOCOL + 1}, this node {wire.PROTOCOL}: run the same plexmq "
        "version on both"]


def test_a_refused_worker_stops_the_node_instead_of_restarting() -> None:
    reasons: list[str] = []
    loop = asyncio.new_event_loop()
    try:
        supervisor = Supervisor({"workers": 1, "role": "node", "config_path": "config.json", "bridges": {}}, loop, reasons.append)
        child: Child = supervisor.workers[0]
        child.proc = types.SimpleNamespace(poll=lambda: LINK_REFUSED, returncode=LINK_REFUSED, pid=1)  # type: ignore[assignment]  # a stand-in for the Popen
        supervisor.reap()
    finally:
        loop.close()
    assert reasons == ["the router refused worker 0's link (see the line above)"]


def test_a_node_whose_router_speaks_another_version_stops_with_one_line(tmp_path: Path) -> None:
    """A real node (acceptor and worker processes) against a router that refuses every HELLO."""
    keys = make_keys(tmp_path / "keys")
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    try:
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.CURVE_SERVER, 1)
        secret = zmq.auth.load_certificate(str(keys / "server.key_secret"))[1]
        assert secret is not None
        router.setsockopt(zmq.CURVE_SECRETKEY, secret)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        log_path = tmp_path / "node.log"
        with open(log_path, "wb") as log:
            node = subprocess.Popen(
                [sys.executable, "-m", "plexmq.acceptor", "serve", "--role", "node", "--router", f"tcp://127.0.0.1:{port}",
                 "--router-curve-dir", str(keys), "--node-name", "n1", "--host", "127.0.0.1", "--port", "0",
                 "--workers", "1", "--metrics-port", "-1", "--data-dir", str(tmp_path / "data")],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
            try:
                assert router.poll(20000), "the node's worker did not say HELLO"
                identity, tag, frame = router.recv_multipart()
                ((kind, header, _payload),) = wire.records(frame)
                assert kind == wire.HELLO and wire.Hello.decode(header).protocol == wire.PROTOCOL
                join, _seq = wire.LINK.unpack(tag)
                router.send_multipart((identity, wire.LINK.pack(join, 0),
                                       wire.record(wire.REFUSED, wire.Refused(wire.PROTOCOL + 1).encode())))
                assert node.wait(20) == 1
            finally:
                if node.poll() is None:
                    node.kill()
                    node.wait()
    finally:
        router.close()
        ctx.term()
    output = log_path.read_text()
    line = (f"the router speaks link protocol {wire.PROTOCOL + 1}, this node {wire.PROTOCOL}: run the same plexmq "
            "version on both")
    assert output.count(line) == 1, output
    assert "stopping the broker: the router refused worker 0's link" in output, output
    assert "restarting it" not in output, output


def test_a_router_refuses_a_node_of_another_version_over_its_socket(start_broker: Callable[..., Broker]) -> None:
    b = start_broker("--workers", "1")
    with link_peer(router_endpoint(b), b"n9/w0") as peer:
        peer.send(0, hello(0, "n9", wire.PROTOCOL + 1))
        frame = peer.frame(5)
        assert frame is not None, "the router did not answer the HELLO"
        kinds = [(kind, header) for kind, header, _p in wire.records(frame)]
    assert kinds == [(wire.REFUSED, wire.Refused(wire.PROTOCOL).encode())]
    wait_for(lambda: f"worker n9/w0 speaks link protocol {wire.PROTOCOL + 1}, this router {wire.PROTOCOL}"
             in b.output(), 5, "the router's line")
