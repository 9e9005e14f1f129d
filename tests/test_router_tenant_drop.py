"""A tenant removed by a reload with `on_remove = "drop"` (router/lifecycle.py: `Lifecycle.drop_tenant`),
in the router core (tests/router_harness.py): its live connections are closed, a connection waiting to
take one of its sessions over is refused, its sessions, queues, wills and retained messages go from
memory and the store, and the other tenants keep theirs."""

from __future__ import annotations

from pathlib import Path

from plexmq.wire import Close, Kick, Session
from tests.router_harness import Deliver, RouterHarness
from tests.test_router_tenants import connected


def test_a_dropped_tenant_loses_everything_and_the_others_keep_theirs(tmp_path: Path) -> None:
    h = RouterHarness(tmp_path)
    w0, w1 = h.worker("w0"), h.worker("w1")
    for conn, tenant in ((1, "a"), (2, "b")):
        connected(h, w0, conn, "dev", tenant, clean=False, subs=(("t", 1),))
        w0.gone(conn)  # offline, persistent
        connected(h, w0, conn + 10, "pub", tenant)
        w0.pub(conn + 10, "t", b"queued for " + tenant.encode(), qos=1, pid=1)
        w0.pub(conn + 10, "r", b"kept", qos=1, pid=2, retain=True)
    connected(h, w0, 3, "live", "a", clean=False, will=("w", b"will", 0, False))
    w1.connect(4, "live", clean=False, tenant="a")  # another worker: waits for the KICKED of connection 3
    h.turn()
    w0.take(), w1.take()

    h.router.drop_tenant("a")
    h.turn()
    assert Close(3) in w0.take() and Kick(4) in w1.take()
    assert "a" not in h.router.tenants and (w0.identity, 11) not in h.router.conn_tenants
    w0.gone(3)  # the worker's answer to the CLOSE: nothing of a's comes back
    w0.pub(11, "t", b"after the drop", qos=1, pid=3)
    h.turn()
    assert "a" not in h.router.tenants

    h = h.restart()
    assert set(h.router.tenants) == {"", "b"}
    w0 = h.worker("w0")
    w0.connect(5, "dev", clean=False, tenant="b")
    h.turn()
    records = w0.take()
    assert records[0] == Session(5, True, [["t", 1]])
    assert [r.payload for r in records[1:] if isinstance(r, Deliver)] == [b"queued for b"]
    assert list(h.router.tenants["b"].retained.messages) == ["r"]
