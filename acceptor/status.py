"""`plexmq status`: a live table of the broker's processes, read from its Prometheus endpoint; with
`--tenant NAME`, that tenant's figures instead (its `plexmq_tenant_*` series)."""

from __future__ import annotations

import argparse
import sys
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from plexmq.acceptor import endpoint

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    text = urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    return {dict(labels)[label]: value for (metric, labels), value in samples.items() if metric == name}


def table(now: Samples, before: Samples | None, seconds: float) -> str:
    """The processes with CPU, RSS and clients, then the totals (clients by MQTT version) and message rates."""
    cpu = _by_label(now, "plexmq_process_cpu_percent", "process")
    rss: dict[str, tuple[str, float]] = {}  # process -> (pid, bytes)
    for (metric, labels), value in now.items():
        if metric == "plexmq_process_rss_bytes":
            rss[dict(labels)["process"]] = (dict(labels)["pid"], value)
    clients = {f"worker-{w}": v for w, v in _by_label(now, "plexmq_clients_connected", "worker").items()}
    lines = [f"{'process':<12} {'pid':>8} {'cpu %':>7} {'rss MB':>8} {'clients':>8}"]
    for name in sorted(cpu, key=lambda n: (not n.startswith("acceptor"), not n.startswith("router"), n)):
        count = f"{clients[name]:.0f}" if name in clients else ""
        pid, size = rss.get(name, ("", 0.0))
        lines.append(f"{name:<12} {pid:>8} {cpu[name]:>7.1f} {size / 1e6:>8.1f} {count:>8}")

    def rate(name: str) -> str:
        if before is None or seconds <= 0:
            return "-"
        return f"{(now.get((name, ()), 0) - before.get((name, ()), 0)) / seconds:,.0f}/s"

    protocols = ", ".join(f"{name}: {count:,.0f}" for name, count in
                          _by_label(now, "plexmq_clients_protocol", "protocol").items())
    lines.append(f"clients {sum(clients.values()):,.0f} ({protocols})   "
                 f"sessions {now.get(('plexmq_sessions', ()), 0):,.0f}   "
                 f"subscriptions {now.get(('plexmq_subscriptions', ()), 0):,.0f}   "
                 f"in {rate('plexmq_messages_received_total')}   out {rate('plexmq_messages_sent_total')}")
    nodes = {dict(labels)["node"]: (dict(labels)["address"], value) for (metric, labels), value in now.items()
             if metric == "plexmq_node_up"}
    if nodes:  # a router with nodes on other hosts
        workers = _by_label(now, "plexmq_node_workers", "node")
        node_clients = _by_label(now, "plexmq_node_clients", "node")
        lines.append(f"{'node':<16} {'address':<20} {'link':<5} {'workers':>7} {'clients':>8}")
        for name, (address, up) in sorted(nodes.items()):
            lines.append(f"{name:<16} {address:<20} {'up' if up else 'lost':<5} {workers.get(name, 0):>7.0f} "
                         f"{node_clients.get(name, 0):>8.0f}")
    routers = router_line(now)
    if routers:
        lines.append(routers)
    return "\n".join(lines)


def router_line(now: Samples) -> str | None:
    """With a PostgreSQL store (standby routers): `router: a active, epoch 3, since ...; standby b (seen
    0.2s ago)`; None without (no lease: nothing to say)."""
    epochs = _by_label(now, "plexmq_router_epoch", "name")
    if not epochs:
        return None
    name, epoch = next(iter(epochs.items()))
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now.get(
        ("plexmq_router_active_since_seconds", (("name", name),)), 0.0)))
    parts = [f"router: {name} active, epoch {epoch:.0f}, since {since}"]
    seen = _by_label(now, "plexmq_router_member_seen_seconds", "name")
    for (metric, labels), up in sorted(now.items()):
        member = dict(labels)
        if metric == "plexmq_router_member_up" and member["name"] != name:
            gone = "" if up or member["state"] == "gone" else ", gone"  # silent, or an active whose epoch passed
            parts.append(f"{member['state']} {member['name']} (seen {seen.get(member['name'], 0):.1f}s ago{gone})")
    return "; ".join(parts)


def tenant_table(now: Samples, before: Samples | None, seconds: float, tenant: str) -> str | None:
    """One tenant's figures: what it holds, its messages and bytes (totals, and rates once two scrapes
    are known), drops, denials, refusals by reason and limit hits by limit; None when the broker serves
    no series of that tenant (no such tenant, or metrics_tenants = false)."""
    mine = [(metric, dict(labels), value) for (metric, labels), value in now.items()
            if metric.startswith("plexmq_tenant_") and dict(labels).get("tenant") == tenant]
    if not mine:
        return None

    def value(name: str) -> float:
        return now.get((name, (("tenant", tenant),)), 0.0)

    def total(name: str) -> str:
        text = f"{value(name):,.0f}"
        if before is not None and seconds > 0:
            text += f" ({(value(name) - before.get((name, (('tenant', tenant),)), 0.0)) / seconds:,.0f}/s)"
        return text

    def by(name: str, label: str) -> str:
        found = sorted((labels[label], count) for metric, labels, count in mine if metric == name)
        return ", ".join(f"{which}: {count:,.0f}" for which, count in found) or "none"

    return "\n".join([
        f"tenant {tenant or '(default)'}",
        f"clients {value('plexmq_tenant_connections'):,.0f}   sessions {value('plexmq_tenant_sessions'):,.0f}   "
        f"subscriptions {value('plexmq_tenant_subscriptions'):,.0f}   "
        f"retained {value('plexmq_tenant_retained_messages'):,.0f}   "
        f"queued {value('plexmq_tenant_queued_messages'):,.0f}",
        f"messages in {total('plexmq_tenant_messages_received_total')}   "
        f"out {total('plexmq_tenant_messages_sent_total')}",
        f"bytes in {total('plexmq_tenant_bytes_received_total')}   out {total('plexmq_tenant_bytes_sent_total')}",
        f"dropped {value('plexmq_tenant_dropped_total'):,.0f}   acl denied {value('plexmq_tenant_acl_denied_total'):,.0f}",
        f"refused: {by('plexmq_tenant_refused_total', 'reason')}",
        f"limit hits: {by('plexmq_tenant_limit_hits_total', 'limit')}",
    ])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="plexmq status", description="A live table of a running broker.")
    endpoint.add_arguments(parser)
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default 2)")
    parser.add_argument("--once", action="store_true", help="print one table and exit")
    parser.add_argument("--tenant", metavar="NAME", help='that tenant\'s figures instead ("": the default tenant)')
    args = parser.parse_args(argv)
    try:
        url = endpoint.find(args).url
    except endpoint.Refused as exc:
        print(f"plexmq status: {exc}", file=sys.stderr)
        return 1
    before: Samples | None = None
    then = time.monotonic()
    try:
        while True:
            try:
                now = scrape(url)
            except (urllib.error.URLError, OSError) as exc:
                print(f"plexmq status: cannot read {url}/metrics: {getattr(exc, 'reason', exc)}", file=sys.stderr)
                return 1
            moment = time.monotonic()
            if args.tenant is None:
                text = table(now, before, moment - then)
            else:
                found = tenant_table(now, before, moment - then, args.tenant)
                if found is None:
                    print(f"plexmq status: no figures of tenant {args.tenant!r} (no such tenant, or metrics_tenants = "
                          "false)", file=sys.stderr)
                    return 1
                text = found
            if args.once:
                print(text)
                return 0
            print("\033[H\033[J" + text, flush=True)
            before, then = now, moment
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0
