"""The acceptor <-> worker channel: accepted sockets passed with SCM_RIGHTS over a SEQPACKET pair.

Messages (one datagram each):
  acceptor -> worker  b"F" + the address family of the fds (one byte: socket.AF_INET or AF_INET6, so
                      the worker makes its socket objects without asking the kernel) + one listener
                      byte per fd, with the fds: the listener's index in
                      `config["listening"]` (written by the acceptor, acceptor/config.py `listeners` order:
                      the broker's own first, then the tenants'), a [scheme, owning tenant] pair that says
                      how to speak on the socket (mqtt, mqtts, ws, wss) and whose it is ("": nobody's);
  worker -> acceptor  b"L" + <II: connections held, sockets received since the worker started
                      (the acceptor adds the sockets it handed that the worker has not yet seen)
"""

from __future__ import annotations

import array
import socket
import struct

FDS = ord("F")
LOAD = ord("L")

MAX_FDS_PER_MESSAGE = 64  # well under the kernel's SCM_MAX_FD (253)
LOAD_REPORT = struct.Struct("<II")


def channel_pair() -> tuple[socket.socket, socket.socket]:
    """(acceptor end, worker end); the worker end is inherited by the worker process."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def send_fds(chan: socket.socket, fds: list[int], family: int, listeners: bytes) -> None:
    """Pass up to MAX_FDS_PER_MESSAGE sockets of one address family in one sendmsg."""
    chan.sendmsg([b"F" + bytes((family,)) + listeners], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])


def recv_message(chan: socket.socket) -> tuple[bytes, list[int], int]:
    """(data, fds received, fds the kernel could not give us because we are out of descriptors)."""
    msg, ancdata, flags, _addr = chan.recvmsg(2 + MAX_FDS_PER_MESSAGE, socket.CMSG_SPACE(MAX_FDS_PER_MESSAGE * 4))
    fds = array.array("i")
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    lost = 0
    if msg[:1] == b"F":
        lost = len(msg) - 2 - len(fds)
    return msg, list(fds), lost
