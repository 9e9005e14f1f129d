"""Hosts for the standby-router tests (issue 24): PostgreSQL in a namespace of its own, two routers
sharing it as their store (one active, one standby) and nodes that list both, on the bridges of
tests/hosts.py. The database, not the test, says which router is active (its lease row).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from plexmq.acceptor.status import Samples, scrape
from plexmq.bench.postgres import PostgreSQL, installed
from tests.conftest import wait_for
from tests.hosts import METRICS_PORT, ROUTER_PORT, START_LIMIT, Host, Net, _can_make_namespaces

LEASE = 2.0  # router_lease of the tests' routers, seconds
ROUTERS = ("ra", "rb")
NODES = ("n1", "n2")
PG_PORT = 5432
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ", re.M)


class StandbyNet(Net):
    """A `pg` host running PostgreSQL, routers `ra` and `rb` with it as their store, nodes joining
    whichever is active."""

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path)
        self.pg: PostgreSQL | None = None

    def open(self) -> None:
        super().open()
        host = self.host("pg")
        self.pg = PostgreSQL(host=host.back_ip, netns=host.ns, port=PG_PORT)

    @property
    def dsn(self) -> str:
        assert self.pg is not None
        return self.pg.dsn

    def link_of(self, router: Host) -> str:
        return f"tcp://{router.back_ip}:{ROUTER_PORT}"

    @property
    def router_url(self) -> str:
        """What a node's `router` lists: both routers."""
        return ",".join(self.link_of(self.host(name)) for name in ROUTERS)

    def start_router_named(self, name: str) -> Host:
        """Start router `name` (it becomes active or standby: the lease decides) and wait until it has
        bound its link."""
        r = self.host(name)
        r.start("--role", "router", "--router-bind", self.link_of(r), "--router-curve-dir", str(self.keys),
                "--store", self.dsn, "--data-dir", str(self.tmp_path / f"{name}-data"),
                "--metrics-port", str(METRICS_PORT),
                config=f'metrics_host = "{r.front_ip}"\nsys_interval = 1\nrouter_lease = {LEASE}\n'
                       f'router_name = "{name}"\n')

        def bound() -> bool:
            r.check_running()
            return "router listening on tcp://" in r.since_start() or "standby" in r.since_start()
        wait_for(bound, START_LIMIT, f"router {name} to bind its link")
        return r

    def start_routers(self) -> None:
        """Both routers at once (the database picks the active one), then the nodes joined to it
        (started where they are not running)."""
        for name in ROUTERS:
            self.start_router_named(name)
        self.join_nodes()

    def restart_routers(self) -> None:
        """Stop both routers, then start them at once again (as `start_routers`)."""
        for name in ROUTERS:
            self.hosts[name].stop()
        self.start_routers()

    def running(self, name: str) -> bool:
        proc = self.host(name).proc
        return proc is not None and proc.poll() is None

    def restore(self) -> None:
        """Bring back what a test killed, cut or stopped, as tests/test_failover.py's tests share one
        net: every back link up, the database and both routers running, one of them active and both
        nodes joined to it. Nothing is restarted on an intact net."""
        assert self.pg is not None
        for host in self.hosts.values():
            host.heal()
        if self.pg.proc is None or self.pg.proc.poll() is not None:
            self.pg.start()
        for name in ROUTERS:
            if not self.running(name):
                self.start_router_named(name)
        self.join_nodes()

    def join_nodes(self) -> None:
        """Wait for the active router, start the nodes that are not running, and wait until both have
        joined it."""
        self.active()
        for name in NODES:
            if not self.running(name):
                self.start_node(name, join=False)
        for name in NODES:
            self.wait_joined(name)

    def lease(self) -> tuple[str, int] | None:
        """(holder, epoch) of the lease while it is current; None when it has lapsed or the
        database does not answer."""
        assert self.pg is not None
        try:
            rows = self.pg.sql("SELECT holder, epoch FROM router_lease WHERE id = 1 AND expires > now()")
        except Exception:  # noqa: BLE001  # down or restarting: no current holder to report
            return None
        return (rows[0][0], rows[0][1]) if rows else None

    def active(self, timeout: float = START_LIMIT) -> Host:
        """The router holding the lease, once one does and serves its metrics (right after a kill the
        lease still names the dead router until it lapses: asked again each time)."""
        def serving() -> Host | None:
            found = self.lease()
            if found is None:
                return None
            r = self.hosts[found[0]]
            url = f"http://{r.front_ip}:{METRICS_PORT}"
            try:
                scrape(url)
            except OSError:
                return None
            self.metrics_url = url
            return r
        return wait_for(serving, timeout, "a router to hold the lease and serve its metrics")

    def metrics(self) -> Samples:
        """As Net.metrics, of whichever router is active now."""
        holder = self.lease()
        if holder is not None:
            self.metrics_url = f"http://{self.hosts[holder[0]].front_ip}:{METRICS_PORT}"
        return scrape(self.metrics_url)

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.pg is not None:
                self.pg.remove()


def when(host: Host, text: str, after: int | None = None) -> datetime:
    """The time of the first log line of `host` that contains `text`: of this start, or from character
    `after` of its whole log on (host.output(): what an earlier test on the same host logged is not it)."""
    log = host.since_start() if after is None else host.output()
    at = log.find(text, after or 0)
    assert at >= 0, f"no {text!r} in {host.name}'s log:\n{log[-3000:]}"
    stamps = list(STAMP.finditer(log, 0, at + 1))
    assert stamps, f"no time stamp before {text!r} in {host.name}'s log"
    return datetime.strptime(stamps[-1].group(1), "%Y-%m-%d %H:%M:%S,%f")


def open_standby_net(tmp_path: Path) -> Iterator[StandbyNet]:
    reason = _can_make_namespaces()
    if reason:
        pytest.skip(f"network namespaces unavailable: {reason}")
    if not installed():
        pytest.skip("no PostgreSQL server (apt-get install postgresql)")
    net = StandbyNet(tmp_path)
    try:
        net.open()
        net.start_routers()
        yield net
    finally:
        net.close()

