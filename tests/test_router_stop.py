"""The router's side of a graceful stop of the whole broker (router/main.py `take_last_frames`): it
reads what its own workers sent before they stopped, up to each one's BYE, and that BYE ends no
session. The frames read at the stop travel over a real ZeroMQ ROUTER/DEALER pair, as between the
processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from plexmq.router.main import take_last_frames
from plexmq.wire import Session
from tests.router_harness import RouterHarness


@pytest.fixture
def sockets() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    """The router's ROUTER and a worker's DEALER (identity w0), connected in-process."""
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    router.bind("inproc://link")
    dealer.setsockopt(zmq.IDENTITY, b"w0")
    dealer.connect("inproc://link")
    yield router, dealer
    dealer.close(0)
    router.close(0)
    ctx.term()


def test_a_stopping_router_takes_a_clean_connect_sent_before_the_bye(tmp_path: Path, sockets) -> None:
    """A new clean session's CONNACK leaves the worker before its CONNECT reaches the router; the
    router stopping then must still read the CONNECT, or the session it discards comes back at the
    next start. It fails when the stopping router reads nothing more."""
    router_sock, dealer = sockets
    h = RouterHarness(tmp_path)
    w0 = h.worker("w0")
    w0.connect(1, "keeper", clean=False)
    w0.subscribe(1, 1, [("kept", 1)])
    w0.gone(1, publish_will=False)
    h.turn()
    h.router.stopping = True  # its SIGTERM; the worker's next frames come through the socket
    w0.via = dealer
    w0.connect(2, "keeper", connack_sent=1)  # clean: the worker answered it itself
    w0.link.bye()
    w0.send()
    take_last_frames(router_sock, h.router, 10.0)
    assert not h.router.links.links[b"w0"].alive  # its BYE was read: nothing more to wait for
    again = h.restart()
    w0 = again.worker("w0")
    w0.connect(3, "keeper", clean=False)
    again.turn()
    assert w0.take() == [Session(3, False, [])]


def test_a_bye_while_the_broker_stops_publishes_no_will_and_keeps_the_session(tmp_path: Path) -> None:
    """All-in-one, the workers stop with the router: their clients' sessions stay as they were, with
    no wills (a node's BYE, while its router lives on, sends them: tests/test_nodes.py). It fails
    when the BYE takes the worker for dead whatever the router is doing."""
    h = RouterHarness(tmp_path)
    w0, watcher = h.worker("w0"), h.worker("w1")
    watcher.connect(9, "watcher")
    watcher.subscribe(9, 1, [("will/#", 0)])
    w0.connect(1, "dev", clean=False, will=("will/dev", b"bye", 0, False))
    h.turn()
    watcher.take()
    h.router.stopping = True
    w0.link.bye()
    w0.send()
    h.turn()
    assert watcher.take() == [] and not h.router.links.links[b"w0"].alive
    w0 = h.restart().worker("w0")
    w0.connect(2, "dev", clean=False)
    w0.harness.turn()
    assert w0.take() == [Session(2, True, [])]
