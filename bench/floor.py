"""`python -m plexmq.bench.floor`: what one idle TCP connection costs a worker before any MQTT state, the
floor under the worker's share of idle100k's KB per connection.

A server adopts N accepted sockets as a worker does (`socket.socket(fileno=...)`, then its Poller,
workers/sockets.py, with a one-slot protocol) and reports its RSS growth per connection; `--uvloop`
adopts them with `loop.connect_accepted_socket` instead (what the worker did before, and still does
for TLS), `--plain` keeps only the accepted socket objects. The clients are a child process.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import resource
import signal
import socket
import time

import psutil
import uvloop

from plexmq.workers.sockets import Poller


class _Idle(asyncio.Protocol):
    __slots__ = ("transport",)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport


def _clients(port: int, count: int) -> None:
    """The child: open `count` connections and hold them until killed."""
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]
    while held:
        time.sleep(60)


async def _serve(count: int, how: str) -> float:
    loop = asyncio.get_running_loop()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)
    listener.setblocking(False)
    child = os.fork()
    if child == 0:
        _clients(listener.getsockname()[1], count)
        os._exit(0)
    try:
        kept: list[object] = []
        poller = Poller(loop)
        process = psutil.Process()
        base = 0
        for _ in range(count):
            sock, _addr = await loop.sock_accept(listener)
            if not base:
                gc.collect()
                base = process.memory_info().rss
            if how == "plain":
                kept.append(sock)
                continue
            adopted = socket.socket(fileno=sock.detach())
            adopted.setblocking(False)
            protocol = _Idle()
            if how == "uvloop":
                await loop.connect_accepted_socket(lambda: protocol, adopted)  # noqa: B023  # called before the next one
            else:
                poller.serve(adopted, protocol)
            kept.append(protocol)
        gc.collect()
        return (process.memory_info().rss - base) / count
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plexmq.bench.floor", description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--connections", type=int, default=8000)
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--uvloop", dest="how", action="store_const", const="uvloop", default="poller",
                     help="a uvloop transport per socket (the worker's TLS sockets)")
    how.add_argument("--plain", dest="how", action="store_const", const="plain",
                     help="keep the accepted sockets only, no transport")
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = args.connections * 2 + 64  # both ends live in this process group's limit each
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:  # no global policy change
        per_conn = runner.run(_serve(args.connections, args.how))
    what = {"plain": "accepted socket objects", "uvloop": "uvloop transport + one-slot protocol",
            "poller": "the worker's Poller + one-slot protocol"}[args.how]
    print(f"{args.connections} connections, {what}: {per_conn:.0f} bytes of RSS each")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
