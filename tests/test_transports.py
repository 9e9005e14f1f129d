"""The TLS and WebSocket listeners: real brokers, paho over TLS and WebSocket (plain and secure),
mosquitto clients with --cafile, client certificates, the WebSocket handshake and frames, bad TLS config.

A throwaway CA, server and client certificates are made once per session with the openssl tool.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import socket
import ssl
import subprocess
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from wsproto import WSConnection
from wsproto.connection import CLIENT
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    Pong,
    RejectConnection,
    Request,
    TextMessage,
)

from plexmq.mqtt import v4 as p
from tests.cli import one_error_line, run, write
from tests.conftest import Broker, wait_for
from tests.mqtt import Client
from tests.pki import Pki, make_pki

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl tool is not installed")

WAIT = 10
MOSQUITTO = shutil.which("mosquitto_pub") is not None and shutil.which("mosquitto_sub") is not None
CONNECT = p.encode_connect("transport-raw", True, 60)
CONNACK_OK = b"\x20\x02\x00\x00"
CONNACK_BAD_LOGIN = b"\x20\x02\x00\x04"


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def authority(pki: Pki) -> tuple[x509.Certificate, Any]:
    """The test CA's certificate and key, to sign with the cryptography package."""
    return (x509.load_pem_x509_certificate(Path(pki.ca).read_bytes()),
            serialization.load_pem_private_key(Path(pki.ca_key).read_bytes(), None))


def client_certificate(pki: Pki, where: Path, cn: str) -> tuple[str, str]:
    """A client certificate with CN `cn`, signed by the test CA, and its key: the cryptography package
    writes a CN that openssl's -subj cannot (a NUL)."""
    ca, ca_key = authority(pki)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(hours=1)).not_valid_after(now + timedelta(days=2))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    name = uuid.uuid4().hex[:8]
    (where / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (where / f"{name}.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                          serialization.NoEncryption()))
    return str(where / f"{name}.crt"), str(where / f"{name}.key")


def revoke(pki: Pki, path: Path, *certs: str) -> None:
    """Write the test CA's CRL revoking the certificate files `certs` to `path`, replacing it whole."""
    ca, ca_key = authority(pki)
    now = datetime.now(UTC)
    crl = (x509.CertificateRevocationListBuilder().issuer_name(ca.subject)
           .last_update(now - timedelta(hours=1)).next_update(now + timedelta(days=2)))
    for cert in certs:
        serial = x509.load_pem_x509_certificate(Path(cert).read_bytes()).serial_number
        crl = crl.add_revoked_certificate(x509.RevokedCertificateBuilder().serial_number(serial)
                                          .revocation_date(now - timedelta(hours=1)).build())
    part = path.with_suffix(".part")
    part.write_bytes(crl.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    os.replace(part, path)


def tls_section(pki: Pki, enabled: bool = True, **more: object) -> str:
    lines = [f"enabled = {str(enabled).lower()}", "port = 0", f'certfile = "{pki.server_cert}"',
             f'keyfile = "{pki.server_key}"', *(f"{k} = {str(v).lower() if isinstance(v, bool) else repr(v)}"
                                                for k, v in more.items())]
    return "[tls]\n" + "\n".join(lines) + "\n"


def start(where: Path, config: str, *args: str) -> Broker:
    path = write(where, "connect_timeout = 1\n" + config)  # a silent client is closed within 2 s
    return Broker(where / "broker.log", ["--workers", "2", "--config", str(path), *args])


def port_of(broker: Broker, scheme: str) -> int:
    found = re.search(rf"listening on [^ ]+:(\d+) \({scheme}\)", broker.output())
    assert found, f"no {scheme} listener in the log:\n{broker.output()}"
    return int(found.group(1))


@pytest.fixture(scope="module")
def open_broker(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """TLS without client certificates, and plain WebSocket."""
    b = start(tmp_path_factory.mktemp("open"), tls_section(pki) + "[websocket]\nenabled = true\nport = 0\n")
    yield b
    b.stop()


@pytest.fixture(scope="module")
def wss_broker(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """WebSocket over TLS only: [tls] gives the certificate without a listener of its own."""
    b = start(tmp_path_factory.mktemp("wss"), tls_section(pki, enabled=False)
              + "[websocket]\nenabled = true\nport = 0\ntls = true\n")
    yield b
    b.stop()


@pytest.fixture(scope="module")
def mutual_broker(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """Client certificates required, their CN the username, over TLS and WebSocket over TLS."""
    b = start(tmp_path_factory.mktemp("mutual"),
              tls_section(pki, cafile=pki.ca, require_certificate=True, use_identity_as_username=True)
              + "[websocket]\nenabled = true\nport = 0\ntls = true\n", "--log-level", "debug")
    yield b
    b.stop()


def topic(name: str) -> str:
    return f"transports/{name}/{uuid.uuid4().hex[:8]}"


def crossing(a: Client, b: Client, name: str) -> None:
    """`a` and `b` each receive what the other publishes."""
    t = topic(name)
    assert a.subscribe(f"{t}/a", 1) == [1] and b.subscribe(f"{t}/b", 1) == [1]
    a.publish(f"{t}/b", b"from a", qos=1)
    b.publish(f"{t}/a", b"from b", qos=1)
    got_b, got_a = b.get(WAIT), a.get(WAIT)
    assert (got_b.topic, got_b.payload) == (f"{t}/b", b"from a")
    assert (got_a.topic, got_a.payload) == (f"{t}/a", b"from b")
    for c in (a, b):
        c.disconnect()


def tls_socket(port: int, pki: Pki, cert: tuple[str, str] | None = None) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=pki.ca)
    if cert:
        context.load_cert_chain(*cert)
    return context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=WAIT), server_hostname="localhost")


def mqtt_answer(sock: socket.socket) -> bytes:
    """The first bytes the broker answers a CONNECT with; b"" when it closes instead (TLS refusals included)."""
    try:
        sock.sendall(CONNECT)
        return sock.recv(4)
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        return b""


def answer_with(port: int, pki: Pki, cert: tuple[str, str] | None) -> bytes:
    """`mqtt_answer` over a new TLS connection presenting `cert`; b"" when the handshake is refused
    (TLS 1.2 refuses within it, TLS 1.3 after the client's side of it)."""
    try:
        with tls_socket(port, pki, cert) as s:
            return mqtt_answer(s)
    except (ssl.SSLError, ConnectionResetError):
        return b""


# -- listeners and the log --------------------------------------------------------------------------


def test_every_listener_has_its_log_line(open_broker: Broker, wss_broker: Broker) -> None:
    assert re.search(rf"plexmq listening on 127\.0\.0\.1:{open_broker.port} with 2 workers\n", open_broker.output())
    assert port_of(open_broker, "mqtts") != port_of(open_broker, "ws")
    assert port_of(wss_broker, "wss")
    assert "(mqtts)" not in wss_broker.output() and "(ws)" not in wss_broker.output()


def test_a_tenants_tls_listener_uses_the_tls_certificate_and_places_its_clients(pki: Pki, tmp_path: Path) -> None:
    """A tenant's mqtts listener speaks TLS with the [tls] certificate (its own listener off), and a
    client there is in that tenant: tenant_required refuses the same client on the plain listener."""
    b = start(tmp_path, 'tenant_required = true\n[tenants.acme]\nlisteners = ["mqtts://127.0.0.1:0"]\n'
              + tls_section(pki, enabled=False), "--workers", "1")
    try:
        found = re.search(r"listening on [^ ]+:(\d+) \(mqtts, tenant acme\)", b.output())
        assert found, b.output()
        assert answer_with(int(found.group(1)), pki, None) == CONNACK_OK
        with socket.create_connection(("127.0.0.1", b.port), timeout=WAIT) as plain:
            assert mqtt_answer(plain) == b"\x20\x02\x00\x05"  # no tenant found
    finally:
        b.stop()


# -- paho across transports -------------------------------------------------------------------------


# each transport at 3.1.1 and at 5.0, crossing with a TCP client of the other version
VERSIONS = pytest.mark.parametrize("version", [paho.MQTTv311, paho.MQTTv5], ids=["v311", "v5"])


def other(version: int) -> int:
    return paho.MQTTv5 if version == paho.MQTTv311 else paho.MQTTv311


@VERSIONS
def test_paho_over_tls_and_tcp(open_broker: Broker, pki: Pki, version: int) -> None:
    crossing(Client(port_of(open_broker, "mqtts"), tls=pki.tls(), protocol=version),
             Client(open_broker.port, protocol=other(version)), "tls")


@VERSIONS
def test_paho_over_websocket_and_tcp(open_broker: Broker, version: int) -> None:
    crossing(Client(port_of(open_broker, "ws"), transport="websockets", protocol=version),
             Client(open_broker.port, protocol=other(version)), "ws")


@VERSIONS
def test_paho_over_secure_websocket_and_tcp(wss_broker: Broker, pki: Pki, version: int) -> None:
    crossing(Client(port_of(wss_broker, "wss"), transport="websockets", tls=pki.tls(), protocol=version),
             Client(wss_broker.port, protocol=other(version)), "wss")


def test_websocket_and_tls_clients_reach_each_other(open_broker: Broker, pki: Pki) -> None:
    crossing(Client(port_of(open_broker, "ws"), transport="websockets"),
             Client(port_of(open_broker, "mqtts"), tls=pki.tls()), "ws-tls")


def test_large_messages_over_websocket(open_broker: Broker) -> None:
    """Frames with 16- and 64-bit lengths, both ways."""
    sub = Client(port_of(open_broker, "ws"), transport="websockets")
    pub = Client(port_of(open_broker, "ws"), transport="websockets")
    t = topic("large")
    sub.subscribe(t, 1)
    for size in (100, 1000, 70_000, 300_000):
        payload = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
        pub.publish(t, payload, qos=1)
        assert sub.get(WAIT).payload == payload
    sub.disconnect()
    pub.disconnect()


# -- mosquitto clients with --cafile -----------------------------------------------------------------


@pytest.mark.skipif(not MOSQUITTO, reason="mosquitto-clients not installed")
def test_mosquitto_clients_over_tls(open_broker: Broker, pki: Pki) -> None:
    port, t = str(port_of(open_broker, "mqtts")), topic("mosquitto")
    common = ["-h", "localhost", "-p", port, "--cafile", pki.ca, "-t", t]
    with subprocess.Popen(["stdbuf", "-oL", "mosquitto_sub", *common, "-C", "1", "-W", str(WAIT), "-d"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as sub:  # stdbuf: lines now
        assert sub.stdout is not None
        while "SUBACK" not in (line := sub.stdout.readline()):
            assert line, "mosquitto_sub exited before its SUBACK"
        pub = subprocess.run(["mosquitto_pub", *common, "-q", "1", "-m", "over tls"], capture_output=True,
                             text=True, timeout=WAIT)
        assert pub.returncode == 0, pub.stdout + pub.stderr
        out, _ = sub.communicate(timeout=WAIT)
        assert sub.returncode == 0 and "over tls" in out, out


# -- client certificates ----------------------------------------------------------------------------


def test_require_certificate_refuses_a_client_without_one(mutual_broker: Broker, pki: Pki) -> None:
    port = port_of(mutual_broker, "mqtts")
    assert answer_with(port, pki, None) == b""
    assert answer_with(port, pki, (pki.client_cert, pki.client_key)) == CONNACK_OK
    assert mutual_broker.workers() and mutual_broker.router(), "a refused handshake took a process down"


@pytest.mark.skipif(not MOSQUITTO, reason="mosquitto-clients not installed")
def test_mosquitto_pub_with_a_client_certificate(mutual_broker: Broker, pki: Pki) -> None:
    args = ["mosquitto_pub", "-h", "localhost", "-p", str(port_of(mutual_broker, "mqtts")), "--cafile", pki.ca,
            "-t", topic("mosquitto-cert"), "-m", "x", "-q", "1"]
    without = subprocess.run(args, capture_output=True, text=True, timeout=WAIT)
    assert without.returncode != 0
    cert = subprocess.run([*args, "--cert", pki.client_cert, "--key", pki.client_key], capture_output=True, text=True,
                          timeout=WAIT)
    assert cert.returncode == 0, cert.stdout + cert.stderr


def test_identity_as_username_takes_the_certificate_cn(mutual_broker: Broker, pki: Pki) -> None:
    """Over TLS and over WebSocket over TLS; a certificate without a CN is refused."""
    before = mutual_broker.output().count("CN 'device-42'")
    with tls_socket(port_of(mutual_broker, "mqtts"), pki, (pki.client_cert, pki.client_key)) as s:
        assert mqtt_answer(s) == CONNACK_OK
    ws = Client(port_of(mutual_broker, "wss"), transport="websockets", tls=pki.tls(client=True))
    ws.disconnect()
    wait_for(lambda: mutual_broker.output().count("CN 'device-42'") >= before + 2, WAIT, "both CNs in the log")
    with tls_socket(port_of(mutual_broker, "mqtts"), pki, (pki.nameless_cert, pki.nameless_key)) as s:
        assert mqtt_answer(s) == CONNACK_BAD_LOGIN
    wait_for(lambda: "client certificate without a CN" in mutual_broker.output(), WAIT, "the refusal in the log")


@pytest.mark.parametrize("cn", ["dev\x00ice", "dev+ice", "dev#ice"], ids=["nul", "plus", "hash"])
def test_a_certificate_cn_that_cannot_be_a_user_name_is_refused(mutual_broker: Broker, pki: Pki, tmp_path: Path,
                                                                  cn: str) -> None:
    """As mosquitto refuses a CN with a NUL: CONNACK 0x04 (5.0: 0x86) and a log line; the wildcards too,
    which no ACL pattern's %u would match. A `/` in a CN is a user name like any other."""
    cert = client_certificate(pki, tmp_path, cn)
    port = port_of(mutual_broker, "mqtts")
    with tls_socket(port, pki, cert) as s:
        assert mqtt_answer(s) == CONNACK_BAD_LOGIN
    with tls_socket(port, pki, cert) as s:
        s.sendall(p.encode_connect("bad-cn", True, 60, protocol_level=5))
        connack = s.recv(256)
        assert connack[0] == 0x20 and connack[3] == 0x86, connack
    wait_for(lambda: mutual_broker.output().count(f"client certificate CN {cn!r} holds") == 2, WAIT,
             "both refusals in the log")
    with tls_socket(port, pki, client_certificate(pki, tmp_path, "fleet/dev-7")) as s:
        assert mqtt_answer(s) == CONNACK_OK


@pytest.mark.parametrize("scheme", ["mqtts", "ws"])
def test_a_silent_client_is_closed_at_the_connect_timeout(open_broker: Broker, scheme: str) -> None:
    """Before its TLS or WebSocket handshake: the handshake counts against connect_timeout."""
    with socket.create_connection(("127.0.0.1", port_of(open_broker, scheme)), timeout=WAIT) as s:
        s.settimeout(5)
        assert s.recv(1) == b""


def test_plain_bytes_on_the_tls_port_are_refused(open_broker: Broker) -> None:
    with socket.create_connection(("127.0.0.1", port_of(open_broker, "mqtts")), timeout=WAIT) as s:
        assert mqtt_answer(s) in (b"", b"\x15\x03\x03\x00")  # closed, or the start of a TLS alert
    Client(open_broker.port).disconnect()


def test_a_certificate_the_crl_revokes_is_refused_and_a_reload_reads_the_crl_again(pki: Pki, tmp_path: Path) -> None:
    """tls.crlfile: a revoked client certificate is refused at the handshake, another accepted; the
    file is read again at a reload (SIGHUP), for new connections: one open already stays. A CRL that
    cannot be loaded at a reload keeps the one in force."""
    lost, kept = (client_certificate(pki, tmp_path, name) for name in ("lost-device", "kept-device"))
    crl = tmp_path / "revoked.crl"
    revoke(pki, crl, lost[0])
    b = start(tmp_path, tls_section(pki, cafile=pki.ca, require_certificate=True, crlfile=str(crl)))
    try:
        port = port_of(b, "mqtts")
        assert answer_with(port, pki, lost) == b""
        assert answer_with(port, pki, kept) == CONNACK_OK
        with tls_socket(port, pki, kept) as live:
            live.sendall(p.encode_connect("crl-live", True, 60))  # not the client id of the others: no takeover
            assert live.recv(4) == CONNACK_OK
            crl.write_text("not a CRL\n")
            b.proc.send_signal(signal.SIGHUP)
            wait_for(lambda: "config not reloaded: tls.crlfile" in b.output(), WAIT, "the bad CRL refused")
            assert answer_with(port, pki, kept) == CONNACK_OK
            revoke(pki, crl, lost[0], kept[0])
            b.proc.send_signal(signal.SIGHUP)
            wait_for(lambda: len(re.findall(r"worker \d+ reloaded its settings", b.output())) == 2, WAIT,
                     "both workers to reload")
            assert answer_with(port, pki, kept) == b""
            assert answer_with(port, pki, lost) == b""
            live.sendall(p.PINGREQ_PACKET)
            assert live.recv(2) == p.PINGRESP_PACKET
        wait_for(lambda: b.output().count("certificate verify failed: certificate revoked") == 3, WAIT,
                 "each refusal logged with its reason")
    finally:
        b.stop()


# -- the WebSocket handshake and frames ---------------------------------------------------------------


class WsClient:
    """A WebSocket client from wsproto, to send what paho never sends."""

    def __init__(self, port: int, subprotocols: list[str]) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        self.ws = WSConnection(CLIENT)
        self.sock.sendall(self.ws.send(Request(host="localhost", target="/mqtt", subprotocols=subprotocols)))

    def send(self, event: Event) -> None:
        self.sock.sendall(self.ws.send(event))

    def next(self) -> Event:
        while True:
            for event in self.ws.events():
                return event
            data = self.sock.recv(65536)
            assert data, "the broker closed the connection"
            self.ws.receive_data(data)

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("offered", [["chat"], [], ["mqttv5", "wamp"]])
def test_websocket_without_the_mqtt_subprotocol_is_refused(open_broker: Broker, offered: list[str]) -> None:
    client = WsClient(port_of(open_broker, "ws"), offered)
    refusal = client.next()
    assert isinstance(refusal, RejectConnection) and 400 <= refusal.status_code < 500
    client.close()


@pytest.mark.parametrize("offered", [["mqtt"], ["mqttv3.1"], ["chat", "mqtt"]])
def test_websocket_answers_with_the_mqtt_subprotocol(open_broker: Broker, offered: list[str]) -> None:
    client = WsClient(port_of(open_broker, "ws"), offered)
    accepted = client.next()
    assert isinstance(accepted, AcceptConnection) and accepted.subprotocol == [s for s in offered if "mqtt" in s][0]
    client.close()


def test_websocket_ping_mqtt_in_pieces_and_close(open_broker: Broker) -> None:
    client = WsClient(port_of(open_broker, "ws"), ["mqtt"])
    assert isinstance(client.next(), AcceptConnection)
    client.send(Ping(b"hi"))
    assert client.next() == Pong(b"hi")
    client.send(BytesMessage(CONNECT[:5], message_finished=False))  # one packet across frames
    client.send(BytesMessage(CONNECT[5:]))
    connack = client.next()
    assert isinstance(connack, BytesMessage) and bytes(connack.data) == CONNACK_OK
    client.send(BytesMessage(p.PINGREQ_PACKET + p.PINGREQ_PACKET))  # two packets in one frame
    pongs = b""
    while len(pongs) < 4:
        event = client.next()
        assert isinstance(event, BytesMessage)
        pongs += bytes(event.data)
    assert pongs == p.PINGRESP_PACKET * 2
    client.send(CloseConnection(1000))
    answer = client.next()
    assert isinstance(answer, CloseConnection) and answer.code == 1000
    client.close()


def test_websocket_text_frames_close_the_connection(open_broker: Broker) -> None:
    client = WsClient(port_of(open_broker, "ws"), ["mqtt"])
    assert isinstance(client.next(), AcceptConnection)
    client.send(TextMessage("CONNECT"))
    answer = client.next()
    assert isinstance(answer, CloseConnection) and answer.code == 1003
    client.close()


def test_mqtt_disconnect_closes_the_websocket(open_broker: Broker) -> None:
    client = WsClient(port_of(open_broker, "ws"), ["mqtt"])
    assert isinstance(client.next(), AcceptConnection)
    client.send(BytesMessage(CONNECT))
    assert isinstance(client.next(), BytesMessage)
    client.send(BytesMessage(b"\xe0\x00"))  # DISCONNECT
    answer = client.next()
    assert isinstance(answer, CloseConnection) and answer.code == 1000
    client.close()


FLOOD = 32 << 20  # bytes of pings offered: far more than the socket buffers on both sides hold
GROWTH = 16 << 20  # what the worker's RSS may grow by meanwhile
STALL = 3  # seconds the socket takes nothing more: the broker has stopped reading


@pytest.mark.parametrize("scheme", ["ws", "mqtt"])
def test_a_ping_flood_from_a_client_that_never_reads_is_paused_not_buffered(open_broker: Broker, scheme: str) -> None:
    """WebSocket pings (each answered with a pong, RFC 6455 5.5.2) or MQTT PINGREQs from a client that never
    reads: once its answers back up, the worker stops reading it, so its memory stays flat (it grew by
    the whole flood), and reads again when the client does: everything is answered, in order."""
    port = port_of(open_broker, scheme) if scheme == "ws" else open_broker.port
    publish = p.encode_publish(b"transports/flood", b"", 1, packet_id=1)  # answered by PUBACK, after every ping
    if scheme == "ws":
        client = WsClient(port, ["mqtt"])
        assert isinstance(client.next(), AcceptConnection)
        sock = client.sock
        wrap = client.ws.send
        chunk = wrap(Ping(b"p" * 125)) * 512  # the largest control frames (RFC 6455 5.5), masked by the client
        done = wrap(BytesMessage(publish))
        last = b"\x82\x04" + p.encode_puback(1)  # an unmasked binary frame
        sock.sendall(wrap(BytesMessage(p.encode_connect("ping-flood", True, 0))))
        assert isinstance(client.next(), BytesMessage)
    else:
        sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        chunk, done, last = p.PINGREQ_PACKET * 32768, publish, p.encode_puback(1)
        sock.sendall(p.encode_connect("ping-flood", True, 0))
        assert sock.recv(4) == CONNACK_OK
    worker = open_broker.workers()[open_broker.worker_holding(sock.getsockname()[1])]
    before = worker.memory_info().rss
    sock.setblocking(False)
    offered, rest = 0, memoryview(b"")
    while offered < FLOOD and select.select([], [sock], [], STALL)[1]:
        rest = rest or memoryview(chunk)
        sent = sock.send(rest)
        offered, rest = offered + sent, rest[sent:]
    grown = worker.memory_info().rss - before
    assert grown < GROWTH, f"the worker grew by {grown >> 20} MB while {offered >> 20} MB of pings came"
    rest, tail = memoryview(bytes(rest) + done), b""  # now read: the rest of the pings and the PUBLISH go out
    while not tail.endswith(last):
        readable, writable, _ = select.select([sock], [sock] if rest else [], [], WAIT)
        assert readable or writable, "the broker neither reads nor answers"
        if writable:
            rest = rest[sock.send(rest):]
        if readable:
            data = sock.recv(1 << 20)
            assert data, "the broker closed the connection"
            tail = tail[-8:] + data
    sock.close()


# -- bad TLS config stops startup with one line -------------------------------------------------------


BAD = [  # (the [tls] lines past enabled = true and port = 0, what the line must name)
    pytest.param("", "tls.certfile", id="no-certfile"),
    pytest.param('certfile = "{server_cert}"\n', "tls.keyfile", id="no-keyfile"),
    pytest.param('certfile = "{where}/absent.pem"\nkeyfile = "{server_key}"\n', "tls.certfile", id="unreadable-cert"),
    pytest.param('certfile = "{where}/junk.pem"\nkeyfile = "{server_key}"\n', "tls.certfile", id="junk-cert"),
    pytest.param('certfile = "{server_cert}"\nkeyfile = "{client_key}"\n', "tls.keyfile", id="wrong-key"),
    pytest.param('certfile = "{server_cert}"\nkeyfile = "{server_key}"\nrequire_certificate = true\n', "tls.cafile",
                 id="require-certificate-without-cafile"),
    pytest.param('certfile = "{server_cert}"\nkeyfile = "{server_key}"\nuse_identity_as_username = true\n',
                 "tls.use_identity_as_username", id="identity-without-required-certificate"),
    pytest.param('certfile = "{server_cert}"\nkeyfile = "{server_key}"\nciphers = "NO-SUCH-CIPHER"\n', "tls.ciphers",
                 id="ciphers"),
    pytest.param('certfile = "{server_cert}"\nkeyfile = "{server_key}"\ncafile = "{ca}"\ncrlfile = "{where}/junk.pem"\n',
                 "tls.crlfile", id="crl-without-required-certificate"),
    pytest.param('certfile = "{server_cert}"\nkeyfile = "{server_key}"\ncafile = "{ca}"\nrequire_certificate = true\n'
                 'crlfile = "{where}/absent.pem"\n', "tls.crlfile", id="unreadable-crl"),
    pytest.param('certfile = "{server_cert}"\nkeyfile = "{server_key}"\ncafile = "{ca}"\nrequire_certificate = true\n'
                 'crlfile = "{where}/junk.pem"\n', "tls.crlfile", id="junk-crl"),
    pytest.param('certfile = "{server_cert}"\nkeyfile = "{server_key}"\ncafile = "{ca}"\nrequire_certificate = true\n'
                 'crlfile = "{ca}"\n', "tls.crlfile", id="certificate-as-crl"),
]


@pytest.mark.parametrize("lines,key", BAD)
def test_bad_tls_config_stops_startup_with_one_line(tmp_path: Path, pki: Pki, lines: str, key: str) -> None:
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    lines = lines.format(where=tmp_path, server_cert=pki.server_cert, server_key=pki.server_key, client_key=pki.client_key,
                         ca=pki.ca)
    for text in (f"[tls]\nenabled = true\nport = 0\n{lines}",  # the TLS listener, or WebSocket over TLS alone
                 f"[tls]\n{lines}[websocket]\nenabled = true\nport = 0\ntls = true\n"):
        message = one_error_line(run("serve", "--port", "0", "--config", str(write(tmp_path, text))))
        assert key in message, message
        if "absent" in lines:
            assert "absent.pem" in message, message


def test_the_readme_security_example_works(pki: Pki, tmp_path: Path) -> None:
    """README.md's "Securing plexmq" config and ACL, with this test's files in place of /etc/plexmq:
    alice logs in over TLS, writes where the ACL lets her and is refused where it does not."""
    from tests.logins import users

    readme = (Path(__file__).parent.parent / "README.md").read_text().split("## Securing plexmq", 1)[1]
    toml = re.search(r"```toml\n(.*?)```", readme, re.DOTALL).group(1)  # type: ignore[union-attr]  # the README has it
    acl = re.search(r"```\n(# /etc/plexmq/acl.*?)```", readme, re.DOTALL).group(1)  # type: ignore[union-attr]  # the README has it
    (tmp_path / "acl").write_text(acl)
    users(tmp_path / "passwd", alice="wonderland")
    shutil.copy(pki.server_cert, tmp_path / "server.crt")
    shutil.copy(pki.server_key, tmp_path / "server.key")
    toml = toml.replace("/etc/plexmq/", f"{tmp_path}/").replace("port = 8883", "port = 0")
    b = Broker(tmp_path / "broker.log", ["--config", str(write(tmp_path, toml))])
    try:
        alice = Client(port_of(b, "mqtts"), "readme-alice", username="alice", password="wonderland", tls=pki.tls())
        assert alice.subscribe("sensors/#", 1) == [1]
        assert alice.subscribe("secret/x", 1) == [0x80]
        alice.publish("sensors/t1", b"21.5", qos=1)
        assert alice.get().payload == b"21.5"
        alice.disconnect()
    finally:
        b.stop()
