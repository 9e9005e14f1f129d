"""Alarms an operator must see (issue 25): messages dropped, a burst of failed logins, a node lost, a
worker restarted. Raised and cleared once a second from the figures `Stats.refresh` has just taken
(its snapshot), so they cost the router's loop no walk of its own, and read by the console's overview
(router/console/events.py) and by /metrics (`plexmq_alarm`) from that snapshot: one home for the rules.

Failed logins are the workers' (MQTT) and the web console's, which its HTTP threads hand over
(`console_login_failed`) and the next check counts with the rest, each address a source of its own.

Counters come from the workers' reports, which start again from zero when a worker restarts: each rule
takes a worker's rise against its own last report from the same process (`pid`), never the totals.

An admin acknowledges a raised alarm from the console (`acknowledge`: who and when are shown with it):
it stays raised, and listed, until its condition ends, as any other.

An alarm is the broker's (`tenant` None: what a broker admin sees, its details naming the tenants) or
one tenant's (what that tenant's admins see); the tenants' own are kept only with `metrics_tenants`,
which is what counts per tenant.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import asdict, dataclass

from prometheus_client.core import GaugeMetricFamily

DROPPED, LOGINS, NODE_LOST, RESTARTED = "dropped", "login_failures", "node_lost", "worker_restarted"
NAMES = (DROPPED, LOGINS, NODE_LOST, RESTARTED)
QUIET = 10.0  # seconds without a drop before a drop alarm clears
WINDOW, BURST = 10.0, 5  # more than BURST failed logins within WINDOW seconds is a burst
HOLD = 60.0  # seconds a restart stays raised (it is an event: no condition ends it)
KEEP = 50  # cleared alarms kept for the overview
NAMED = 5  # sources a burst of failed logins names, the most first (the console's may be many addresses)
Shown = dict[str | None, list[dict]]  # whose (None: the broker's) -> the alarms to show
LOGIN_REFUSALS = ("bad_user_name_or_password", "not_authorized")  # a tenant's refusals that are failed logins


@dataclass
class Alarm:
    name: str  # one of NAMES
    subject: str  # what it is about: a worker's label, a node, a tenant ("" : the broker as a whole)
    tenant: str | None  # whose admins see it (None: the broker's)
    what: str  # a line for people
    details: str
    raised: float  # Unix time
    cleared: float | None = None
    last: float = 0.0  # Unix time its condition last held
    acknowledged_by: str | None = None  # the console admin who acknowledged it (it stays raised until it clears)
    acknowledged: float | None = None  # Unix time


class Alarms:
    """The alarms raised now and the last KEEP cleared of each scope; `check` is called by the router's loop
    only, `console_login_failed` by any thread."""

    def __init__(self) -> None:
        self.raised: dict[tuple[str, str, str | None], Alarm] = {}
        self.cleared: dict[str | None, deque[dict]] = {}  # the broker's (None) and each tenant's, the last KEEP
        self._workers: dict[str, tuple[int, int, int]] = {}  # label -> (pid, dropped, auth_failures) last reported
        self._tenants: dict[str, tuple[int, int]] = {}  # tenant -> (dropped, failed logins) last summed
        self._routed = 0  # the router's own drops (its session queues) at the last check
        # (at, source: "worker W", "the console from A" or "", tenant, failed logins)
        self._failures: deque[tuple[float, str, str | None, int]] = deque()
        self._console: dict[tuple[str | None, str], int] = {}  # (tenant, address) -> failed console logins since the check
        self._lock = threading.Lock()  # of `_console`
        # a drop alarm's drops since it was raised: by source (worker, router) and by tenant
        self._since: dict[tuple[str, str, str | None], tuple[dict[str, int], dict[str, int]]] = {}

    def check(self, snapshot: dict) -> Shown:
        """Raise and clear from one snapshot of `Stats`; the alarms to show by whose they are (None: the
        broker's, else a tenant's), each a dict, those raised first, then the cleared, newest first."""
        now = snapshot["at"]
        self._restarts(now, snapshot["workers"])
        worker_drops, worker_failures = self._worker_rises(snapshot["workers"])
        drops = {f"worker {label}": n for label, n in worker_drops.items() if n}
        if snapshot["routed_dropped"] > self._routed:
            drops["the router's session queues"] = snapshot["routed_dropped"] - self._routed
        self._routed = snapshot["routed_dropped"]
        tenant_drops, tenant_failures = self._tenant_rises(snapshot["tenants"])
        self._dropped(now, None, drops, {_shown(name): n for name, n in tenant_drops.items() if n})
        for name, count in tenant_drops.items():
            if count:
                self._dropped(now, name, {_shown(name): count}, {})
        self._failures.extend((now, f"worker {label}", None, n) for label, n in worker_failures.items() if n)
        self._failures.extend((now, "", name, n) for name, n in tenant_failures.items() if n)
        with self._lock:
            console, self._console = self._console, {}
        for (whose, address), n in console.items():  # the broker's, and a tenant's own too
            self._failures.append((now, f"the console from {address}", None, n))
            if whose is not None:
                self._failures.append((now, "", whose, n))
        self._logins(now)
        for name, node in snapshot["nodes"].items():
            if node["state"] == "lost":
                self._hold(now, NODE_LOST, name, None, f"node {name} lost",
                           f"no worker of it is joined (last address {node['address']}): its clients are disconnected")
        self._clear(now)
        shown: Shown = {}
        for alarm in sorted(self.raised.values(), key=lambda a: -a.raised):
            shown.setdefault(alarm.tenant, []).append(_public(alarm))
        for scope, kept in self.cleared.items():
            shown.setdefault(scope, []).extend(reversed(kept))
        return shown

    def acknowledge(self, name: str, subject: str, tenant: str | None, raised: float, by: str, now: float) -> Alarm | None:
        """An admin has seen the raised alarm (`name`, `subject`) of `tenant` raised at `raised` (not
        another raised since with the same name); the loop's thread only (router/console/alarms.py asks
        it). The alarm, or None when no such one is raised now (it cleared)."""
        alarm = self.raised.get((name, subject, tenant))
        if alarm is None or alarm.raised != raised:
            return None
        alarm.acknowledged_by, alarm.acknowledged = by, now
        return alarm

    def console_login_failed(self, tenant: str | None, address: str) -> None:
        """A failed login to the web console from `address`, naming a tenant with admins (None: the
        broker's admins, or a tenant without any); any thread."""
        with self._lock:
            self._console[(tenant, address)] = self._console.get((tenant, address), 0) + 1

    def _worker_rises(self, workers: dict[str, dict]) -> tuple[dict[str, int], dict[str, int]]:
        """Each worker's drops and failed logins since its last report: a restarted one's from zero, one
        first seen (this router just started) none."""
        drops, failures = {}, {}
        for label, report in workers.items():
            first = (report["pid"], report["dropped"], report["auth_failures"])
            pid, before_drops, before_failures = self._workers.get(label, first)
            if pid != report["pid"]:
                before_drops = before_failures = 0
            drops[label] = max(0, report["dropped"] - before_drops)
            failures[label] = max(0, report["auth_failures"] - before_failures)
            self._workers[label] = (report["pid"], report["dropped"], report["auth_failures"])
        return drops, failures

    def _tenant_rises(self, tenants: dict[str, dict]) -> tuple[dict[str, int], dict[str, int]]:
        """Each tenant's drops and failed logins since the last check (summed over workers: a restarted
        worker's fall is taken as no rise)."""
        drops, failures = {}, {}
        for name, numbers in tenants.items():
            if not name:  # the default tenant's figures are the broker's, and it has no admins of its own
                continue
            failed = sum(numbers["refused"].get(reason, 0) for reason in LOGIN_REFUSALS)
            before = self._tenants.get(name, (numbers["dropped"], failed))
            drops[name], failures[name] = max(0, numbers["dropped"] - before[0]), max(0, failed - before[1])
            self._tenants[name] = (numbers["dropped"], failed)
        return drops, failures

    def _restarts(self, now: float, workers: dict[str, dict]) -> None:
        """A worker that reports with another process id than before was restarted (killed, crashed)."""
        for label, report in workers.items():
            before = self._workers.get(label)
            if before is not None and before[0] != report["pid"]:
                node = f" of node {report['node']}" if report.get("node") else ""
                self._raise(now, RESTARTED, label, None, f"worker {label}{node} restarted",
                            f"process {before[0]} ended; {report['pid']} took its place (its clients reconnect)")

    def _dropped(self, now: float, tenant: str | None, sources: dict[str, int], tenants: dict[str, int]) -> None:
        """Drops this second, by source (`sources`: a worker, the router; for a tenant's alarm the tenant)
        and, for the broker's alarm, by tenant: the alarm raised, or its counts grown."""
        if not sources:
            return
        key = (DROPPED, tenant or "", tenant)
        if key not in self.raised:
            self._since[key] = ({}, {})
        counts = self._since[key]
        for kept, new in zip(counts, (sources, tenants)):
            for name, count in new.items():
                kept[name] = kept.get(name, 0) + count
        total = sum(counts[0].values())
        if tenant is not None:
            self._hold(now, DROPPED, tenant, tenant, f"messages dropped in tenant {_shown(tenant)}",
                       f"{total} since raised (a subscriber's queue is full: max_queued_messages)")
            return
        where = ", ".join(f"{source}: {n}" for source, n in counts[0].items())
        by_tenant = "; tenants " + ", ".join(f"{name}: {n}" for name, n in counts[1].items()) if counts[1] else ""
        self._hold(now, DROPPED, "", None, "messages dropped",
                   f"{total} since raised: {where}{by_tenant} (a subscriber's queue is full: max_queued_messages)")

    def _logins(self, now: float) -> None:
        """More than BURST failed logins within WINDOW, the broker's (every worker) and each tenant's."""
        while self._failures and now - self._failures[0][0] > WINDOW:
            self._failures.popleft()
        broker: dict[str, int] = {}
        by_tenant: dict[str, int] = {}
        for _at, source, tenant, count in self._failures:
            if tenant is None:
                broker[source] = broker.get(source, 0) + count
            else:
                by_tenant[tenant] = by_tenant.get(tenant, 0) + count
        total = sum(broker.values())
        if total > BURST:
            sources = sorted(broker.items(), key=lambda item: -item[1])
            named = ", ".join(f"{source}: {n}" for source, n in sources[:NAMED])
            more = f" and {len(sources) - NAMED} more" if len(sources) > NAMED else ""
            self._hold(now, LOGINS, "", None, "a burst of failed logins",
                       f"{total} in the last {WINDOW:g} s: {named}{more}")
        for name, count in by_tenant.items():
            if count > BURST:
                self._hold(now, LOGINS, name, name, f"a burst of failed logins in tenant {_shown(name)}",
                           f"{count} in the last {WINDOW:g} s")

    def _hold(self, now: float, name: str, subject: str, tenant: str | None, what: str, details: str) -> None:
        """The condition holds this second: raised (if it was not) with these words."""
        alarm = self.raised.get((name, subject, tenant))
        if alarm is None:
            self._raise(now, name, subject, tenant, what, details)
        else:
            alarm.details, alarm.last = details, now

    def _raise(self, now: float, name: str, subject: str, tenant: str | None, what: str, details: str) -> None:
        alarm = self.raised.get((name, subject, tenant))
        if alarm is None:
            self.raised[(name, subject, tenant)] = Alarm(name, subject, tenant, what, details, now, last=now)
        else:  # an event again (a second restart): the same alarm, held longer
            alarm.what, alarm.details, alarm.last = what, details, now

    def _clear(self, now: float) -> None:
        """Clear each alarm whose condition ended: no drop for QUIET, no burst now, the node back, a
        restart HOLD old."""
        for key, alarm in list(self.raised.items()):
            after = {DROPPED: QUIET, RESTARTED: HOLD}.get(alarm.name, 0.0)
            if now - alarm.last > after:
                alarm.cleared = now
                del self.raised[key]
                self._since.pop(key, None)
                self.cleared.setdefault(alarm.tenant, deque(maxlen=KEEP)).append(_public(alarm))  # as it stays


def metric(shown: Shown) -> GaugeMetricFamily:
    """`plexmq_alarm{name}`: the broker's alarms raised now, by name (0: none), for an alert rule."""
    family = GaugeMetricFamily("plexmq_alarm", "The broker's alarms raised now, by name (the console's overview "
                               "lists them)", labels=["name"])
    raised = [alarm["name"] for alarm in shown.get(None, []) if alarm["cleared"] is None]
    for name in NAMES:
        family.add_metric([name], raised.count(name))
    return family


def _public(alarm: Alarm) -> dict:
    shown = asdict(alarm)
    del shown["last"]
    return shown


def _shown(tenant: str | None) -> str:
    return repr(tenant) if tenant else "(default)"
