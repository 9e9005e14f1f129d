"""The broker's numbers: what each worker reports once a second plus the router's own counters,
published as `$SYS` topics (mosquitto's names where they exist) and collected by Prometheus.

Why in the router: it is the one process every worker already talks to, so the counters ride in
the batches (`wire.STATS`) and nothing else has to gather them.

Per tenant (issue 23; `metrics_tenants`): each worker's tallies (workers/counters.py) summed with the
router's own figures of the tenant (router/tenants.py), for every tenant that exists (declared, held by
the router, or reported by a worker: a worker tallies only tenants it placed a connection in), served as
`plexmq_tenant_*` series with a `tenant` label and published as that tenant's own `$SYS` set.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import psutil
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from plexmq import bridge_status as status
from plexmq import version
from plexmq.bridge_status import local_client_id
from plexmq.mqtt import PROTOCOLS
from plexmq.router.ops import alarms
from plexmq.router.ops.history import History

if TYPE_CHECKING:
    from plexmq.router.core import Router
    from plexmq.router.ha.lease import Members
    from plexmq.router.tenants import Tenant

WORKER_COUNTERS = ("dropped", "denied", "withheld", "refused", "auth_failures", "queued", "shed", "local_received", "local_sent")
# a worker's per-tenant numbers that are summed over workers (its `refused` and `limit_hits` are merged)
TENANT_COUNTERS = ("connections", "received", "sent", "bytes_in", "bytes_out", "dropped", "denied")
# a tenant's own $SYS/broker/... topics (mosquitto's names) and the figure of `Stats._tenants` each shows
TENANT_SYS = {"clients/connected": "connections", "clients/disconnected": "offline", "messages/received": "received",
              "messages/sent": "sent", "bytes/received": "bytes_in", "bytes/sent": "bytes_out",
              "publish/messages/dropped": "dropped", "subscriptions/count": "subscriptions",
              "retained messages/count": "retained"}
BRIDGE_SYS = ("state", "queued", "sent", "received", "dropped")  # $SYS/broker/bridges/NAME/... (acceptor/bridges)
COUNTED = ("received", "sent", "dropped", "bytes_in", "bytes_out")  # the overview's counters, shown per second
LOAD_WINDOWS = (1, 5, 15)  # minutes, as mosquitto's load/.../1min, 5min, 15min
# CONNECT protocol level -> the MQTT version it names: how $SYS, /metrics and `plexmq clients` say it
class Stats:
    """Worker reports and the router's counters. The router's loop calls `refresh` once a second;
    the metrics thread reads only the snapshot it leaves (never the router's live dicts)."""

    def __init__(self, router: Router, acceptor_pid: int, per_tenant: bool = True, declared: Iterable[str] = (),
                 members: Members | None = None, run_dir: str = "") -> None:
        self.router = router
        self.run_dir = run_dir  # where the bridge process writes its status (plexmq/bridge_status.py); "": none
        self.members = members  # the routers sharing a PostgreSQL store (None: SQLite, no lease)
        self.per_tenant = per_tenant  # metrics_tenants
        self.declared = set(declared)  # the config's tenants, which exist before any client names them
        self.started = time.time()
        self.processes = {"router": psutil.Process(), "acceptor": psutil.Process(acceptor_pid)}
        self.loads: dict[str, dict[int, float]] = {"received": {}, "sent": {}}  # msgs/minute, averaged
        self.snapshot: dict[str, Any] = {}  # numbers, and the workers, nodes and protocols as dicts
        self._last: tuple[float, int, int] | None = None
        self.alarms = alarms.Alarms()  # raised and cleared at each refresh, shown in the snapshot's "alarms"
        self.refreshed = threading.Condition()  # notified after each refresh: the console's streams wait on it
        self.history = History()  # the overview's series, the last hour and day (router/ops/history.py)

    def refresh(self, now: float) -> None:
        """Take every number once (main thread), and the load averages with them."""
        router = self.router
        workers = {label: dict(report) for label, report in sorted(router.reports.items(), key=_in_order)}
        totals = {name: sum(w.get(name, 0) for w in workers.values()) for name in WORKER_COUNTERS}
        held = {tenant.name: _held(tenant) for tenant in router.tenants.values()}  # one walk of the sessions
        snapshot: dict[str, Any] = {
            "at": now,
            "workers": workers,
            "nodes": self._nodes(workers),
            "clients": sum(w["clients"] for w in workers.values()),
            "protocols": {name: sum(w["protocols"][name] for w in workers.values()) for name in PROTOCOLS.values()},
            # with the messages workers delivered themselves (router/routes.py)
            "received": router.received + totals["local_received"],
            "sent": router.delivered + totals["local_sent"],
            "routed_dropped": router.outbox.dropped,
            "unknown": router.unknown,
            "topics": len(router.routes.places),  # (tenant, filter) subscribed anywhere: the route table's
            **{name: sum(h[name] for h in held.values()) for name in HELD},
            **totals,
            "tenants": self._tenants(workers, held) if self.per_tenant else {},
            "router": self._router(),
            "bridges": self._bridges(),
        }
        snapshot["alarms"] = self.alarms.check(snapshot)
        self.snapshot = snapshot
        self._remember(snapshot)
        self._update_loads(now, snapshot["received"], snapshot["sent"])
        with self.refreshed:
            self.refreshed.notify_all()

    def _remember(self, snap: dict[str, Any]) -> None:
        """The snapshot's figures into the overview's history."""
        self.history.add(snap["at"], snap["clients"], self.counted(snap), snap["workers"])

    def counted(self, snap: dict[str, Any]) -> dict[str, int | None]:
        """The broker's COUNTED totals in a snapshot: its bytes are its tenants' summed (the workers count
        them per tenant only: None without metrics_tenants)."""
        tenants = snap["tenants"].values()
        return {"received": snap["received"], "sent": snap["sent"], "dropped": snap["dropped"] + snap["routed_dropped"],
                "bytes_in": sum(t["bytes_in"] for t in tenants) if self.per_tenant else None,
                "bytes_out": sum(t["bytes_out"] for t in tenants) if self.per_tenant else None}

    def _tenants(self, workers: dict[str, dict], held: dict[str, dict[str, int]]) -> dict[str, dict]:
        """Each tenant in use (the router holds it or a worker reported it), by name: what the router
        holds of it, and the messages, bytes, drops, denials, refusals and limit hits of the workers and
        the router together. Declared tenants nothing has used yet are added at a scrape (`collect`),
        so that thousands declared cost nothing each second."""
        found: dict[str, dict] = {}

        def entry(name: str) -> dict:
            numbers = found.get(name)
            if numbers is None:
                numbers = found[name] = _unused()
            return numbers

        for tenant in self.router.tenants.values():
            numbers = entry(tenant.name)
            numbers.update(held[tenant.name])
            numbers["received"] += tenant.received
            numbers["sent"] += tenant.delivered
            numbers["limit_hits"].update(tenant.limit_hits)
        for report in workers.values():
            for name, theirs in report["tenants"].items():
                numbers = entry(name)
                for key in TENANT_COUNTERS:
                    numbers[key] += theirs[key]
                numbers["refused"].update(theirs["refused"])
                numbers["limit_hits"].update(theirs["limit_hits"])
        return dict(sorted(found.items()))

    def _nodes(self, workers: dict[str, dict]) -> dict[str, dict]:
        """Each node that has joined (role node; none all-in-one): its address, workers, clients and
        link state ("up" while any of its workers is joined, else "lost")."""
        nodes: dict[str, dict] = {}
        for link in self.router.links.links.values():
            if not link.node:
                continue
            node = nodes.setdefault(link.node, {"address": link.address, "workers": 0, "clients": 0, "state": "lost"})
            if link.join:
                node["workers"] += 1
                node["state"] = "up"
                node["address"] = link.address
        for report in workers.values():
            if report.get("node") in nodes:
                nodes[report["node"]]["clients"] += report["clients"]
        return dict(sorted(nodes.items()))

    def _router(self) -> dict[str, Any]:
        """This (active) router's lease and every router's last word in router_members; {} without a lease.
        failovers: the lease has passed on epoch - 1 times since the first router took it."""
        if self.members is None:
            return {}
        lease, silent_after = self.members.lease, self.members.silent_after
        return {"name": lease.name, "epoch": lease.epoch, "active_since": lease.since, "failovers": lease.epoch - 1,
                "members": {m.name: {"state": m.state, "seen": m.age, "up": m.state != "gone" and m.age <= silent_after}
                            for m in self.members.seen}}

    def _bridges(self) -> dict[str, dict]:
        """Each bridge's figures as its process last wrote them, with its queue here: the messages waiting
        for its local session, not yet sent to it (written beside them for `plexmq bridges`)."""
        bridges = status.read(self.run_dir) if self.run_dir else {}
        for name, bridge in bridges.items():
            tenant = self.router.tenants.get(bridge["tenant"])
            session = tenant.sessions.get(local_client_id(name)) if tenant is not None else None
            bridge["queued"] = len(session.queued) if session is not None else 0
        if bridges:
            status.write(os.path.join(self.run_dir, status.QUEUES), {name: b["queued"] for name, b in bridges.items()})
        return bridges

    def _update_loads(self, now: float, received: int, sent: int) -> None:
        """Exponentially averaged messages per minute over 1, 5 and 15 minutes."""
        if self._last is not None and now > self._last[0]:
            elapsed = now - self._last[0]
            for name, count, before in (("received", received, self._last[1]), ("sent", sent, self._last[2])):
                rate = (count - before) * 60.0 / elapsed
                for window in LOAD_WINDOWS:
                    keep = math.exp(-elapsed / (window * 60.0))
                    self.loads[name][window] = self.loads[name].get(window, rate) * keep + rate * (1 - keep)
        self._last = (now, received, sent)

    def sys_messages(self, now: float) -> Iterator[tuple[Tenant, str, bytes]]:
        """(tenant, topic, payload) of every $SYS message, published every sys_interval seconds into the
        tenants that have a `$SYS` subscriber only (`SubscriptionTrie.has_first_level`: `+` and `#` never
        match `$` topics, so that is exact): thousands of tenants nobody there watches cost one lookup
        each. Routed live, never kept: a new subscriber gets them from `figures` at once."""
        for tenant in self.router.tenants.values():
            if tenant.trie.has_first_level("$SYS"):
                for topic, payload in self.figures(tenant, now):
                    yield tenant, topic, payload

    def figures(self, tenant: Tenant, now: float) -> Iterator[tuple[str, bytes]]:
        """(topic, payload) of the tenant's $SYS set now: the broker's in the default tenant (the
        operator's view), each other tenant's own figures under mosquitto's names (none without
        metrics_tenants, or before the first refresh)."""
        if not self.snapshot:
            return
        if not tenant.name:
            yield from self._broker_sys(now)
            return
        numbers = self.snapshot["tenants"].get(tenant.name)
        if numbers is None:
            return
        for topic, key in TENANT_SYS.items():
            yield f"$SYS/broker/{topic}", str(numbers[key]).encode()
        yield "$SYS/broker/clients/total", str(numbers["connections"] + numbers["offline"]).encode()

    def _broker_sys(self, now: float) -> Iterator[tuple[str, bytes]]:
        """(topic, payload) of the broker-wide $SYS messages, the default tenant's."""
        snap = self.snapshot
        values: dict[str, object] = {
            "version": f"plexmq {version()}",
            "uptime": f"{int(now - self.started)} seconds",
            "clients/connected": snap["clients"],
            "clients/disconnected": snap["offline"],
            "clients/total": snap["clients"] + snap["offline"],
            "messages/received": snap["received"],
            "messages/sent": snap["sent"],
            "publish/messages/dropped": snap["routed_dropped"] + snap["dropped"] + snap["shed"] + snap["unknown"],
            "publish/messages/withheld": snap["withheld"],
            "subscriptions/count": snap["subscriptions"],
            "retained messages/count": snap["retained"],
        }
        for protocol, count in snap["protocols"].items():
            values[f"clients/protocol/{protocol}"] = count
        for name, by_window in self.loads.items():
            for window, value in sorted(by_window.items()):
                values[f"load/messages/{name}/{window}min"] = f"{value:.2f}"
        for topic, shown in values.items():
            yield f"$SYS/broker/{topic}", str(shown).encode()
        for label, report in snap["workers"].items():
            yield f"$SYS/broker/workers/{label}/clients/connected", str(report["clients"]).encode()
            yield f"$SYS/broker/workers/{label}/cpu", f"{report['cpu']:.1f}".encode()
            yield f"$SYS/broker/workers/{label}/rss", str(report["rss"]).encode()
        for name, node in snap["nodes"].items():
            for key in ("address", "state", "workers"):
                yield f"$SYS/broker/nodes/{name}/{key}", str(node[key]).encode()
            yield f"$SYS/broker/nodes/{name}/clients/connected", str(node["clients"]).encode()
        if snap["router"]:
            for key in ("name", "epoch", "failovers"):
                yield f"$SYS/broker/router/{key}", str(snap["router"][key]).encode()
            yield "$SYS/broker/router/active_since", str(int(snap["router"]["active_since"])).encode()
            for name, member in snap["router"]["members"].items():
                yield f"$SYS/broker/router/members/{name}/state", (member["state"] if member["up"] else "gone").encode()
        for name, bridge in snap["bridges"].items():
            for key in BRIDGE_SYS:
                yield f"$SYS/broker/bridges/{name}/{key}", str(bridge[key]).encode()

    def collect(self) -> Iterator[Metric]:
        """The Prometheus view of the same numbers (prometheus_client calls it on each scrape)."""
        snap = self.snapshot
        if not snap:
            return
        workers: dict[str, dict] = snap["workers"]
        clients = GaugeMetricFamily("plexmq_clients_connected", "Clients connected", labels=["worker"])
        for label, report in workers.items():
            clients.add_metric([label], report["clients"])
        yield clients
        nodes: dict[str, dict] = snap["nodes"]
        if nodes:
            up = GaugeMetricFamily("plexmq_node_up", "Whether a node's link is up (1) or lost (0)",
                                   labels=["node", "address"])
            node_workers = GaugeMetricFamily("plexmq_node_workers", "Workers of a node joined to the router", labels=["node"])
            node_clients = GaugeMetricFamily("plexmq_node_clients", "Clients connected to a node", labels=["node"])
            for name, node in nodes.items():
                up.add_metric([name, node["address"]], node["state"] == "up")
                node_workers.add_metric([name], node["workers"])
                node_clients.add_metric([name], node["clients"])
            yield from (up, node_workers, node_clients)
        if snap["router"]:
            yield from _router_metrics(snap["router"])
        protocols = GaugeMetricFamily("plexmq_clients_protocol", "Connected clients (CONNACK sent), by MQTT version",
                                      labels=["protocol"])
        for protocol, count in snap["protocols"].items():
            protocols.add_metric([protocol], count)
        yield protocols
        yield CounterMetricFamily("plexmq_messages_received", "PUBLISH messages routed", value=snap["received"])
        yield CounterMetricFamily("plexmq_messages_sent", "PUBLISH messages routed to subscribers", value=snap["sent"])
        dropped = CounterMetricFamily("plexmq_messages_dropped", "Messages dropped, by reason", labels=["reason"])
        dropped.add_metric(["session_queue_full"], snap["routed_dropped"])
        dropped.add_metric(["client_queue_full"], snap["dropped"])
        dropped.add_metric(["acl_denied"], snap["denied"])
        dropped.add_metric(["memory_limit"], snap["shed"])
        dropped.add_metric(["unknown_connection"], snap["unknown"])
        yield dropped
        yield CounterMetricFamily("plexmq_messages_withheld", "Deliveries the receiver's ACL read rules did not allow "
                                  "(also counted in acl_denied)", value=snap["withheld"])
        refused = CounterMetricFamily("plexmq_connections_refused", "Connections refused, by reason", labels=["reason"])
        refused.add_metric(["out_of_file_descriptors"], snap["refused"])
        refused.add_metric(["login_failed"], snap["auth_failures"])
        yield refused
        yield GaugeMetricFamily("plexmq_subscriptions", "Subscriptions", value=snap["subscriptions"])
        yield GaugeMetricFamily("plexmq_retained_messages", "Retained messages", value=snap["retained"])
        yield GaugeMetricFamily("plexmq_sessions", "Sessions held by the router", value=snap["sessions"])
        queued = GaugeMetricFamily("plexmq_queued_messages", "Messages queued, by where", labels=["where"])
        queued.add_metric(["router_sessions"], snap["session_queued"])
        queued.add_metric(["worker_connections"], snap["queued"])
        yield queued
        cpu = GaugeMetricFamily("plexmq_process_cpu_percent", "CPU of each process (100 = one core)",
                                labels=["process", "pid"])
        rss = GaugeMetricFamily("plexmq_process_rss_bytes", "Resident memory of each process", labels=["process", "pid"])
        for name, proc in self.processes.items():
            try:
                cpu.add_metric([name, str(proc.pid)], proc.cpu_percent())
                rss.add_metric([name, str(proc.pid)], proc.memory_info().rss)
            except psutil.Error:
                continue
        for label, report in workers.items():
            cpu.add_metric([f"worker-{label}", str(report["pid"])], report["cpu"])
            rss.add_metric([f"worker-{label}", str(report["pid"])], report["rss"])
        yield cpu
        yield rss
        tenants = snap["tenants"]
        if self.per_tenant and not self.declared <= tenants.keys():
            tenants = dict(sorted({**{name: _unused() for name in self.declared}, **tenants}.items()))
        yield from _tenant_metrics(tenants)
        yield alarms.metric(snap["alarms"])

    def healthy(self) -> bool:
        """Every worker reported within link_timeout (read from the snapshot: any thread)."""
        reporting = self.reporting()
        return bool(reporting) and all(reporting.values())

    def reporting(self) -> dict[str, bool]:
        """Each worker of the snapshot: whether it reported within link_timeout (any thread)."""
        now, limit = time.monotonic(), self.router.links.timeout
        return {label: now - w["at"] < limit for label, w in (self.snapshot.get("workers") or {}).items()}


# what the router holds of each tenant, summed for the broker-wide figures (`_held`)
HELD = ("sessions", "offline", "subscriptions", "session_queued", "retained")


def _router_metrics(router: dict[str, Any]) -> Iterator[Metric]:
    """The lease as the active router holds it, and each router's state (a standby serves no /metrics)."""
    epoch = GaugeMetricFamily("plexmq_router_epoch", "The lease's epoch the active router holds (one more at each "
                              "takeover)", labels=["name"])
    epoch.add_metric([router["name"]], router["epoch"])
    since = GaugeMetricFamily("plexmq_router_active_since_seconds", "Unix time the active router took the lease",
                              labels=["name"])
    since.add_metric([router["name"]], router["active_since"])
    up = GaugeMetricFamily("plexmq_router_member_up", "Whether a router sharing the store said its state lately (1) "
                           "or not (0)", labels=["name", "state"])
    seen = GaugeMetricFamily("plexmq_router_member_seen_seconds", "Seconds since a router sharing the store last "
                             "said its state", labels=["name"])
    for name, member in router["members"].items():
        up.add_metric([name, member["state"]], member["up"])
        seen.add_metric([name], member["seen"])
    yield from (epoch, since, up, seen)


def _unused() -> dict:
    """The figures of a tenant nothing has used yet."""
    return {**dict.fromkeys(HELD, 0), **dict.fromkeys(TENANT_COUNTERS, 0), "refused": Counter(), "limit_hits": Counter()}


def _held(tenant: Tenant) -> dict[str, int]:
    """What the router holds of one tenant: its sessions (those offline), subscriptions, messages queued
    for its sessions, retained messages."""
    sessions = tenant.sessions.values()
    return {"sessions": len(sessions), "offline": sum(1 for s in sessions if s.worker is None),
            "subscriptions": sum(len(s.subs) for s in sessions), "session_queued": sum(len(s.unacked) for s in sessions),
            "retained": len(tenant.retained)}


def _tenant_metrics(tenants: dict[str, dict]) -> Iterator[Metric]:
    """The `plexmq_tenant_*` families: one series per tenant that exists (none: metrics_tenants = false)."""
    if not tenants:
        return
    gauges = (("connections", "plexmq_tenant_connections", "Clients connected, per tenant"),
              ("sessions", "plexmq_tenant_sessions", "Sessions held by the router, per tenant"),
              ("subscriptions", "plexmq_tenant_subscriptions", "Subscriptions, per tenant"),
              ("retained", "plexmq_tenant_retained_messages", "Retained messages, per tenant"),
              ("session_queued", "plexmq_tenant_queued_messages", "Messages the router queues for a tenant's sessions"))
    counters = (("received", "plexmq_tenant_messages_received", "PUBLISH messages from a tenant's clients"),
                ("sent", "plexmq_tenant_messages_sent", "PUBLISH messages to a tenant's subscribers"),
                ("bytes_in", "plexmq_tenant_bytes_received", "Bytes read from a tenant's clients"),
                ("bytes_out", "plexmq_tenant_bytes_sent", "Bytes written to a tenant's clients"),
                ("dropped", "plexmq_tenant_dropped", "Deliveries to a tenant's clients dropped (queue full, expired, "
                 "too large)"),
                ("denied", "plexmq_tenant_acl_denied", "A tenant's PUBLISHes and deliveries the ACL did not allow"))
    for key, name, text in gauges:
        family = GaugeMetricFamily(name, text, labels=["tenant"])
        for tenant, numbers in tenants.items():
            family.add_metric([tenant], numbers[key])
        yield family
    for key, name, text in counters:
        counted = CounterMetricFamily(name, text, labels=["tenant"])
        for tenant, numbers in tenants.items():
            counted.add_metric([tenant], numbers[key])
        yield counted
    for key, name, text, label in (
            ("refused", "plexmq_tenant_refused", "A tenant's connections refused, by CONNACK reason", "reason"),
            ("limit_hits", "plexmq_tenant_limit_hits", "Times a tenant's limit refused, dropped or slowed something",
             "limit")):
        counted = CounterMetricFamily(name, text, labels=["tenant", label])
        for tenant, numbers in tenants.items():
            for which, count in sorted(numbers[key].items()):
                counted.add_metric([tenant, which], count)
        yield counted


def _in_order(item: tuple[str, dict]) -> tuple[str, int]:
    """Workers by node, then by number (`10` after `9`)."""
    node, _, number = item[0].rpartition("/")
    return node, int(number)

