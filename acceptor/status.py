"""`plexmq status`: a live table of the broker's processes, read from its Prometheus endpoint."""

from __future__ import annotations

import argparse
import sys
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

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
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="plexmq status", description="A live table of a running broker.")
    parser.add_argument("--metrics", default="http://127.0.0.1:9883", metavar="URL",
                        help="the broker's metrics endpoint (default http://127.0.0.1:9883)")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default 2)")
    parser.add_argument("--once", action="store_true", help="print one table and exit")
    args = parser.parse_args(argv)
    before: Samples | None = None
    then = time.monotonic()
    try:
        while True:
            try:
                now = scrape(args.metrics)
            except (urllib.error.URLError, OSError) as exc:
                print(f"plexmq status: cannot read {args.metrics}/metrics: {getattr(exc, 'reason', exc)}", file=sys.stderr)
                return 1
            moment = time.monotonic()
            text = table(now, before, moment - then)
            if args.once:
                print(text)
                return 0
            print("\033[H\033[J" + text, flush=True)
            before, then = now, moment
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0
