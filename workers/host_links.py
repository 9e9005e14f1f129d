"""The Unix stream sockets between the workers of one host (workers/peers.py): each worker listens at
`RUN_DIR/peer-w<id>.sock`, its inbox, and connects to a peer's the first time it sends there. The
loop writes and reads them itself: no ZeroMQ I/O thread between, whose hand-offs cost each frame
three thread wake-ups and a dozen system calls more (strace of a worker under 40,000 QoS 1 messages/s
across two workers).

A frame is its records' length and its number (`FRAME`), then the records; the receiver answers on the
same connection with the number of the last frame it has delivered (`ANSWER`), once per read. Data a
writer has handed to the kernel is in the reader's queue: a writer killed after that loses none of it.
A peer that closes its inbox (killed), or is not there to connect to, is *gone*: its clients went with it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from collections.abc import Callable

from plexmq import wire

FRAME = struct.Struct("<IQ")  # a frame's records' length, its number
ANSWER = struct.Struct("<Q")  # the number of the last frame delivered
READ = 1 << 18  # bytes read at most per readiness
_pack_frame, _unpack_frame, _FRAME_SIZE = FRAME.pack, FRAME.unpack_from, FRAME.size
_pack_answer, _unpack_answer, _ANSWER_SIZE = ANSWER.pack, ANSWER.unpack_from, ANSWER.size


def inbox_path(run_dir: str, place: str) -> str:
    """Where the worker of `place` (its identity: `w3`, or `node/w3` on a node) takes its host's peers' frames."""
    return os.path.join(run_dir, f"peer-{place.rpartition('/')[2]}.sock")


def _recv(sock: socket.socket) -> bytes | None:
    """What a readable socket holds: b"" once the other end closed it (or it failed), None for nothing yet."""
    try:
        return sock.recv(READ)
    except BlockingIOError:
        return None
    except OSError:
        return b""


class HostPeer:
    """A worker of this host that this one sends to: its socket, what it has not taken yet, and the
    turn's records for it (`Peers`)."""

    __slots__ = ("loop", "sock", "fd", "batch", "sent", "answered", "since", "out", "got", "on_answer", "on_gone")

    def __init__(self, loop: asyncio.AbstractEventLoop, path: str, on_answer: Callable[[HostPeer, int], None],
                 on_gone: Callable[[HostPeer], None]) -> None:
        """`on_answer`: it delivered frames up to a number; `on_gone`: it is not there, or no longer."""
        self.loop = loop
        self.on_answer = on_answer
        self.on_gone = on_gone
        self.batch = wire.Batch()
        self.sent = 0  # the number of the last frame sent here
        self.answered = 0  # the number of the last frame it answered
        self.since = 0.0  # loop.time() when its oldest unanswered frame left (0: none)
        self.out = bytearray()  # what the socket has not taken yet
        self.got = b""  # the first bytes of an answer
        sock = self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(path)
        except OSError:  # not there (killed, not yet started again)
            sock.close()
            self.fd = -1
            return
        self.fd = sock.fileno()
        loop.add_reader(self.fd, self._read)

    def send(self, seq: int, frame: bytes) -> bool:
        """Frame number `seq` (False: no answer can be waiting, unlike a ZeroMQ peer's)."""
        if self.fd < 0:
            self.on_gone(self)
            return False
        head = _pack_frame(len(frame), seq)
        if self.out:
            self.out += head
            self.out += frame
            return False
        try:
            sent = self.sock.sendmsg((head, frame))
        except BlockingIOError:
            sent = 0
        except OSError:
            self._lost()
            return False
        if sent < len(head) + len(frame):
            self.out += (head + frame)[sent:]
            self.loop.add_writer(self.fd, self._write)
        return False

    def _write(self) -> None:
        try:
            sent = self.sock.send(self.out)
        except BlockingIOError:
            return
        except OSError:
            self._lost()
            return
        del self.out[:sent]
        if not self.out:
            self.loop.remove_writer(self.fd)

    def _read(self) -> None:
        data = _recv(self.sock)
        if data is None:
            return
        if not data:
            self._lost()
            return
        if self.got:
            data = self.got + data
        whole = len(data) - len(data) % _ANSWER_SIZE
        self.got = data[whole:]
        if whole:  # answers only grow: the last one says it all
            self.on_answer(self, _unpack_answer(data, whole - _ANSWER_SIZE)[0])

    def _lost(self) -> None:
        self.close()
        self.on_gone(self)

    def close(self) -> None:
        if self.fd >= 0:
            self.loop.remove_reader(self.fd)
            if self.out:
                self.loop.remove_writer(self.fd)
            self.fd = -1
            self.sock.close()


class _Inbound:
    """A connection of a worker of this host to this one's inbox: what it sent that is not yet whole,
    and an answer its socket did not take."""

    __slots__ = ("sock", "fd", "buf", "owed")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.buf = bytearray()
        self.owed = b""


class HostInbox:
    """This worker's inbox: the connections of the workers of its host, each frame's records delivered
    (`on_frame`) and answered."""

    def __init__(self, loop: asyncio.AbstractEventLoop, path: str, on_frame: Callable[[bytes], None]) -> None:
        self.loop = loop
        self.path = path
        self.on_frame = on_frame
        if os.path.exists(path):  # left by this worker's predecessor, killed
            os.unlink(path)
        listener = self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.setblocking(False)
        listener.bind(path)
        listener.listen(socket.SOMAXCONN)  # a connect finding it full would take the peer for gone
        loop.add_reader(listener.fileno(), self._accept)
        self.inbound: dict[int, _Inbound] = {}

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            inbound = self.inbound[sock.fileno()] = _Inbound(sock)
            self.loop.add_reader(inbound.fd, self._drain, inbound)

    def _drain(self, inbound: _Inbound) -> None:
        """Deliver each whole frame read, then answer with the last one's number."""
        data = _recv(inbound.sock)
        if data is None:
            return
        if not data:
            self._drop(inbound)
            return
        buf = inbound.buf
        buf += data
        pos, end, last = 0, len(buf), 0
        with memoryview(buf) as view:  # each frame copied once, out of the buffer (released before it shrinks)
            while end - pos >= _FRAME_SIZE:
                length, seq = _unpack_frame(buf, pos)
                stop = pos + _FRAME_SIZE + length
                if stop > end:
                    break
                self.on_frame(bytes(view[pos + _FRAME_SIZE:stop]))
                last, pos = seq, stop
        if pos:
            del buf[:pos]
        if last:
            self._answer(inbound, _pack_answer(last))

    def _answer(self, inbound: _Inbound, answer: bytes | None) -> None:
        """Only the latest answer matters: it takes the place of any not yet begun (`owed` is the rest of
        one begun, then at most one whole), and what the socket does not take waits until it can."""
        owed = inbound.owed
        if answer is not None:
            owed = owed[:len(owed) % _ANSWER_SIZE] + answer
        try:
            sent = inbound.sock.send(owed)
        except BlockingIOError:
            sent = 0
        except OSError:
            return
        rest = owed[sent:]
        if rest and not inbound.owed:
            self.loop.add_writer(inbound.fd, self._answer, inbound, None)
        elif inbound.owed and not rest:
            self.loop.remove_writer(inbound.fd)
        inbound.owed = rest

    def _drop(self, inbound: _Inbound) -> None:
        self.loop.remove_reader(inbound.fd)
        if inbound.owed:
            self.loop.remove_writer(inbound.fd)
        del self.inbound[inbound.fd]
        inbound.sock.close()

    def close(self) -> None:
        for inbound in list(self.inbound.values()):
            self._drop(inbound)
        self.loop.remove_reader(self.listener.fileno())
        self.listener.close()
        try:
            os.unlink(self.path)  # a run dir a broker stopped in holds nothing of its own
        except FileNotFoundError:
            pass
