"""The router process: one ROUTER socket, drained in bounded batches, one reply frame per worker."""

from __future__ import annotations

import logging
import os
import signal
import sys

import orjson
import zmq

from router.core import Router
from router.process import CONFIG_ENV, become_child

log = logging.getLogger("plexmq.router")

DRAIN_LIMIT = 500  # frames taken per turn before replies are flushed (rumqttd drains up to 500 too)


def serve(config: dict) -> None:
    """Run until SIGTERM."""
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    ctx = zmq.Context(io_threads=1)
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # an unroutable send raises instead of vanishing
    sock.setsockopt(zmq.SNDHWM, 0)  # flow control is ours (DESIGN.md): never let ZeroMQ drop
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(config["router_endpoint"])
    router = Router(config["max_inflight"], config["max_queued_messages"])
    log.info("router listening on %s", config["router_endpoint"])
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    recv = sock.recv_multipart
    handle = router.handle_frame
    while not stopping:
        try:
            if not poller.poll(1000):
                continue
        except zmq.ZMQError:
            continue  # interrupted by a signal
        for _ in range(DRAIN_LIMIT):
            try:
                worker, frame = recv(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                break
            handle(worker, frame)
        for worker, frame in router.take_frames():
            try:
                sock.send_multipart((worker, frame), zmq.NOBLOCK)
            except zmq.ZMQError as exc:
                log.warning("cannot reach worker %r: %s", worker, exc)
    sock.close(0)
    ctx.term()
    log.info("router stopped")


def main() -> None:
    config = orjson.loads(os.environ[CONFIG_ENV])
    become_child(config["parent_pid"], config["log_level"])
    try:
        serve(config)
    except KeyboardInterrupt:
        sys.exit(0)

