"""Test clients: a raw-socket client for byte-exact checks and a thin paho wrapper that awaits events."""

from __future__ import annotations

import queue
import socket
import threading
import time
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from plexmq.mqtt import v4 as p
from plexmq.mqtt import v5


class RawClient:
    """Speaks bytes to the broker and reads whole packets back (framing from the project's codec)."""

    def __init__(self, port: int, timeout: float = 5.0, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buf = b""

    @property
    def local_port(self) -> int:
        return self.sock.getsockname()[1]

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def connect(self, client_id: str, clean: bool = True, keepalive: int = 60, **kw: Any) -> tuple[bool, int]:
        self.send(p.encode_connect(client_id, clean, keepalive, **kw))
        first, body = self.recv()
        assert first == 0x20, f"expected CONNACK, got {first:#x}"
        return p.decode_connack(0, body)

    def connect5(self, client_id: str, clean_start: bool = True, keepalive: int = 60,
                 properties: dict | None = None, **kw: Any) -> tuple[bool, int, dict]:
        """An MQTT 5.0 CONNECT; the CONNACK's (session present, reason code, properties)."""
        self.send(v5.encode_connect(client_id, clean_start, keepalive, protocol_level=5, properties=properties, **kw))
        first, body = self.recv()
        assert first == 0x20, f"expected CONNACK, got {first:#x}"
        return v5.decode_connack(0, body)

    def recv(self, timeout: float = 5.0) -> tuple[int, bytes]:
        """(first byte, body) of the next packet; AssertionError if none comes in time or the socket closes."""
        self.sock.settimeout(timeout)
        while True:
            found = p.frame(self.buf, 0, 1 << 28)
            if found:
                first, start, end = found
                body = self.buf[start:end]
                self.buf = self.buf[end:]
                return first, body
            data = self.sock.recv(65536)
            if not data:
                raise AssertionError("connection closed by the broker")
            self.buf += data

    def read_until_closed(self, timeout: float = 5.0) -> bytes:
        """Everything the broker sends until it closes the socket; AssertionError if it stays open."""
        deadline = time.monotonic() + timeout
        data = self.buf
        self.buf = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"the broker did not close the connection (got {data!r})")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                return data
            except TimeoutError:
                continue
            if not chunk:
                return data
            data += chunk

    def close(self) -> None:
        self.sock.close()


class Client:
    """A paho-mqtt client (3.1.1 unless `protocol` says otherwise) whose events land in queues the
    test can wait on. With MQTTv5, `clean` is clean start and `session_expiry` goes in CONNECT."""

    def __init__(self, port: int, client_id: str = "", clean: bool = True, keepalive: int = 60,
                 will: tuple[str, bytes, int, bool] | None = None, protocol: int = paho.MQTTv311,
                 username: str | None = None, password: str | None = None, transport: str = "tcp",
                 tls: dict[str, Any] | None = None, session_expiry: int = 0) -> None:
        """`transport`: tcp or websockets; `tls`: the arguments of paho's tls_set (ca_certs, certfile, keyfile)."""
        v5 = protocol == paho.MQTTv5
        self.client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol,  # type: ignore[arg-type]  # protocol: paho's int constants
                                  transport=transport, **({} if v5 else {"clean_session": clean}))  # type: ignore[arg-type]  # as above
        if tls is not None:
            self.client.tls_set(**tls)
        if username is not None:
            self.client.username_pw_set(username, password)
        self.messages: queue.Queue[paho.MQTTMessage] = queue.Queue()
        self.connacks: queue.Queue[tuple[bool, int]] = queue.Queue()
        self.subacks: queue.Queue[list[int]] = queue.Queue()
        self.disconnected = threading.Event()
        self.connack_properties: Properties | None = None
        self.disconnect_reason: int | None = None
        self.client.on_message = lambda c, u, msg: self.messages.put(msg)
        self.client.on_connect = self._connected
        self.client.on_subscribe = lambda c, u, mid, codes, props: self.subacks.put([r.value for r in codes])
        self.client.on_disconnect = self._disconnected
        if will:
            self.client.will_set(will[0], will[1], will[2], will[3])
        if v5:
            properties = Properties(PacketTypes.CONNECT)
            if session_expiry:
                properties.SessionExpiryInterval = session_expiry
            self.client.connect("127.0.0.1", port, keepalive, clean_start=clean, properties=properties)
        else:
            self.client.connect("127.0.0.1", port, keepalive)
        self.client.loop_start()
        self.session_present, rc = self.connacks.get(timeout=5)
        assert rc == 0, f"CONNACK {rc}"

    def _connected(self, client: paho.Client, userdata: object, flags: paho.ConnectFlags, rc: ReasonCode,
                   properties: Properties | None) -> None:
        self.connack_properties = properties
        self.connacks.put((flags.session_present, rc.value))

    def _disconnected(self, client: paho.Client, userdata: object, flags: object, rc: ReasonCode,
                      properties: Properties | None) -> None:
        self.disconnect_reason = rc.value
        self.disconnected.set()

    def subscribe(self, topic: str, qos: int = 0) -> list[int]:
        self.client.subscribe(topic, qos)
        return self.subacks.get(timeout=5)

    def publish(self, topic: str, payload: bytes | str, qos: int = 0, retain: bool = False,
                properties: Properties | None = None) -> None:
        info = self.client.publish(topic, payload, qos, retain, properties)
        if qos:
            info.wait_for_publish(5)
            assert info.is_published()

    def get(self, timeout: float = 5.0) -> paho.MQTTMessage:
        return self.messages.get(timeout=timeout)

    def nothing(self, timeout: float = 0.3) -> bool:
        """True when no message arrives within `timeout` (the one place a test waits for an absence)."""
        try:
            self.messages.get(timeout=timeout)
        except queue.Empty:
            return True
        return False

    def disconnect(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def drop(self) -> None:
        """Close the socket without DISCONNECT (so the will fires)."""
        self.client.loop_stop()
        self.client.socket().close()  # type: ignore[union-attr]  # connected: has a socket
