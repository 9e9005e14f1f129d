"""Unit tests of the router's route table (router/routes.py): places counted per filter, the ROUTES
records that lead each worker's frame, and the frames a gated SUBACK holds until the other workers
have applied its generation."""

from __future__ import annotations

import orjson

from plexmq import wire
from plexmq.router.routes import ROUTER, RouteTable

WORKERS = {b"w0": 100, b"w1": 101}


def routes_of(lead: bytes) -> list:
    """The header of a ROUTES record that leads a frame."""
    ((kind, header, _payload),) = list(wire.records(lead))
    assert kind == wire.ROUTES
    return orjson.loads(header)


def table() -> RouteTable:
    """Both workers said HELLO and applied the (empty) whole table."""
    routes = RouteTable()
    for worker in WORKERS:
        routes.hello(worker)
    assert {w: routes_of(lead) for w, lead in routes.leads(WORKERS).items()} == {w: [0, True, []] for w in WORKERS}
    for worker in WORKERS:
        routes.acknowledged(worker, 0)
    return routes


def test_a_place_is_new_once_and_gone_with_its_last_subscription() -> None:
    routes = table()
    assert routes.add("", "a/+", b"w0") is True
    assert routes.add("", "a/+", b"w0") is False  # a second subscriber there: no change to tell
    assert routes.add("", "a/+", ROUTER) is True
    leads = routes.leads(WORKERS)
    assert routes_of(leads[b"w1"]) == [1, False, [["", "a/+", ["w0", ""]]]]
    routes.remove("", "a/+", b"w0")
    assert routes.leads(WORKERS) == {}  # w0 still serves one
    routes.remove("", "a/+", b"w0")
    routes.remove("", "a/+", ROUTER)
    assert routes_of(routes.leads(WORKERS)[b"w0"]) == [2, False, [["", "a/+", []]]]
    assert routes.places == {}


def test_a_filter_of_one_subscription_keeps_its_place_alone() -> None:
    """One subscription's place is kept as it is (most filters have one subscriber: a dict of one is
    232 bytes); a second place, a second subscription and their removal count as with a dict."""
    routes = table()
    assert routes.add("", "b", b"w1") is True
    assert routes.places == {("", "b"): b"w1"}
    assert routes.add("", "b", ROUTER) is True
    routes.remove("", "b", b"w1")
    assert routes_of(routes.leads(WORKERS)[b"w0"]) == [1, False, [["", "b", [""]]]]
    routes.remove("", "b", ROUTER)
    assert routes.add("", "c", ROUTER) is True
    routes.remove("", "c", ROUTER)
    gen, whole, entries = routes_of(routes.leads(WORKERS)[b"w0"])
    assert (gen, whole, sorted(entries)) == (2, False, [["", "b", []], ["", "c", []]])
    assert routes.places == {}


def test_a_worker_that_says_hello_gets_the_whole_table() -> None:
    routes = table()
    routes.add("", "x", b"w1")
    routes.leads(WORKERS)
    routes.hello(b"w0")
    routes.add("", "y", ROUTER)
    leads = routes.leads(WORKERS)
    assert routes_of(leads[b"w0"]) == [2, True, [["", "x", ["w1"]], ["", "y", [""]]]]
    assert routes_of(leads[b"w1"]) == [2, False, [["", "y", [""]]]]


def test_a_gated_suback_and_all_after_it_wait_for_the_other_workers() -> None:
    routes = table()
    routes.add("", "f", b"w0")
    routes.leads(WORKERS)
    assert routes.order(b"w0", b"before", b"suback", True) == (b"before", b"")
    assert routes.order(b"w0", b"next", b"acked", False) == (b"", b"")  # behind the SUBACK: held too
    assert routes.order(b"w1", b"other", b"", False) == (b"other", b"")  # other workers are not held
    routes.acknowledged(b"w1", 1)
    assert routes.order(b"w0", b"now", b"", False) == (b"suback" + b"next" + b"acked" + b"now", b"")
    assert routes.deferred == {}


def test_a_later_gated_suback_waits_for_its_own_generation() -> None:
    """Two SUBACKs of one worker gated in two turns: the first generation's acknowledgement must
    not release the second."""
    routes = table()
    routes.add("", "f1", b"w0")
    routes.leads(WORKERS)
    assert routes.order(b"w0", b"", b"suback1", True) == (b"", b"")
    routes.add("", "f2", b"w0")
    routes.leads(WORKERS)
    assert routes.order(b"w0", b"", b"suback2", True) == (b"", b"")
    routes.acknowledged(b"w1", 1)
    assert routes.order(b"w0", b"", b"", False) == (b"", b"")
    routes.acknowledged(b"w1", 2)
    assert routes.order(b"w0", b"", b"", False) == (b"suback1suback2", b"")


def test_with_one_worker_nothing_waits() -> None:
    routes = RouteTable()
    routes.hello(b"w0")
    routes.leads({b"w0": 1})
    routes.add("", "f", b"w0")
    routes.leads({b"w0": 1})
    assert routes.order(b"w0", b"now", b"suback", True) == (b"now", b"suback")
