"""The run's report: one flat dict (the `--json` document) and the summary table people read.

Accounting: every subscriber should get every message of the publishers it listens to, so
expected = sent x subscribers-per-message; lost = expected - (received - duplicated). A message that
arrives after a later one of the same publisher fills a gap and counts as reordered, not lost.
"""

from __future__ import annotations

from plexmq.bench import stats, wire
from plexmq.bench.plan import Options

KEYS = (  # the JSON document always has these
    "scenario", "broker", "run_id", "protocol", "qos", "size", "rate", "window", "e2e_window", "duration", "pubs",
    "subs", "clients", "procs", "connections", "connected", "connect_failed", "dropped", "connect_s", "connect_rate",
    "sent", "acked", "received", "expected", "lost", "duplicated", "reordered", "foreign", "e2e_resets",
    "msgs_in_per_s", "msgs_out_per_s", "latency_ms", "pings", "pongs", "errors", "protocol_errors",
    "broker_cpu_pct", "broker_cpu_s", "broker_rss_mb", "broker_rss_idle_mb", "rss_per_conn_kb", "broker_procs",
    "generator_cpu_pct", "broker_connect_cpu_pct", "broker_connect_us", "generator_connect_cpu_pct", "notes", "ok")


def build(opts: Options, finals: dict[int, tuple[dict, dict]], extras: list[dict], *, notes: list[str], run_id: int,
          fd_limit: int, broker_cpu_pct: float | None, broker_cpu_s: float | None,
          generator_cpu_pct: float | None, rss_idle: int,
          rss_run: int, broker_rows: list[dict], monitored: bool, broker_connect_cpu_pct: float | None,
          generator_connect_cpu_pct: float | None) -> dict:
    tot: dict[str, int] = {}
    for counters, _ in finals.values():
        for key, value in counters.items():
            if key in ("t_first_ns",):
                continue
            if key == "t_ready_ns":
                tot[key] = max(tot.get(key, 0), value)
            elif key in ("recv_at_end", "sent_at_end"):
                tot[key] = tot.get(key, 0) + max(value, 0)
            else:
                tot[key] = tot.get(key, 0) + value
    firsts = [c["t_first_ns"] for c, _ in finals.values() if c["t_first_ns"]]
    hist: stats.Histogram = {}
    errors: dict[str, int] = {}
    all_notes = list(notes)
    for extra in extras:
        stats.merge(hist, extra["hist"])
        for key, n in extra["errors"].items():
            errors[key] = errors.get(key, 0) + n
        all_notes += [n for n in extra["notes"] if n not in all_notes]
    pubsub = opts.scenario != "conn"
    fan = max(opts.fan(), 1) if pubsub else 0
    sent, received, dups = tot.get("sent", 0), tot.get("received", 0), tot.get("dups", 0)
    expected = sent * fan
    connect_s = (tot["t_ready_ns"] - min(firsts)) / 1e9 if firsts and tot.get("t_ready_ns") else 0.0
    connected = tot.get("connected", 0)
    duration = opts.duration
    peak_rss = max((sum(r["rss_bytes"] for r in broker_rows if r["t_s"] == t)
                    for t in {r["t_s"] for r in broker_rows}), default=rss_run)
    result = {
        "scenario": opts.scenario, "broker": f"{opts.host}:{opts.port}", "run_id": f"{run_id:08x}",
        "protocol": wire.NAMES[opts.protocol], "qos": opts.qos, "size": opts.size, "rate": opts.rate,
        "window": opts.window,
        "e2e_window": opts.e2e_window if opts.rate == 0 and pubsub else 0, "duration": duration,
        "pubs": opts.pubs, "subs": opts.subs, "persistent_subs": opts.persistent_subs,
        "persistent_conns": opts.persistent_conns, "clients": opts.clients,
        "procs": opts.procs,
        "connections": opts.connections, "connected": connected, "connect_failed": tot.get("failed", 0)
        + tot.get("not_attempted", 0), "dropped": tot.get("dropped", 0),
        "connect_s": round(connect_s, 3), "connect_rate": round(connected / connect_s) if connect_s else 0,
        "sent": sent, "acked": tot.get("acked", 0), "received": received, "expected": expected,
        "lost": max(expected - (received - dups), 0), "duplicated": dups, "reordered": tot.get("reordered", 0),
        "foreign": tot.get("foreign", 0), "e2e_resets": tot.get("e2e_resets", 0),
        "msgs_in_per_s": round(tot.get("sent_at_end", 0) / duration) if pubsub and duration else 0,
        "msgs_out_per_s": round(tot.get("recv_at_end", 0) / duration) if pubsub and duration else 0,
        "latency_ms": stats.percentiles(hist), "pings": tot.get("pings", 0), "pongs": tot.get("pongs", 0),
        "errors": errors, "protocol_errors": tot.get("protocol_errors", 0),
        "broker_cpu_pct": round(broker_cpu_pct, 1) if broker_cpu_pct is not None else None,
        "broker_cpu_s": round(broker_cpu_s, 3) if broker_cpu_s is not None else None,  # all its processes, in the window
        "broker_rss_mb": round(peak_rss / 2**20, 1) if monitored else None,
        "broker_rss_idle_mb": round(rss_idle / 2**20, 1) if monitored else None,
        "rss_per_conn_kb": round((rss_run - rss_idle) / connected / 1024, 2) if monitored and connected else None,
        "broker_procs": len({r["pid"] for r in broker_rows}) if monitored else None,
        "generator_cpu_pct": round(generator_cpu_pct, 1) if generator_cpu_pct is not None else None,
        "broker_connect_cpu_pct": _round(broker_connect_cpu_pct),
        "broker_connect_us": per_connect_us(broker_connect_cpu_pct, connected / connect_s if connect_s else 0),
        "generator_connect_cpu_pct": _round(generator_connect_cpu_pct),
        "fd_limit": fd_limit,
        "notes": all_notes,
    }
    refused = sum(n for k, n in errors.items() if k in ("closed_by_broker", "ECONNRESET", "ECONNREFUSED"))
    if refused and connected:
        all_notes.append(f"LIMIT?: the broker refused or closed {refused:,} connections while {connected:,} "
                         "were open: a per-process open-file limit of the broker? (see its log)")
    result["ok"] = (result["connect_failed"] == 0 and result["dropped"] == 0 and result["protocol_errors"] == 0
                    and (opts.qos == 0 or result["lost"] == 0))
    return result


def per_connect_us(cpu_pct: float | None, connect_rate: float) -> float | None:
    """Broker CPU microseconds per connection made, from its CPU % (of one core) while connecting."""
    return None if cpu_pct is None or not connect_rate else round(cpu_pct / 100 / connect_rate * 1e6, 1)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _n(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.2f}{unit}"
    return f"{int(value):,}{unit}"


def table(r: dict) -> str:
    """The human summary of one run."""
    lat = r["latency_ms"]
    rows = [("scenario", (f"{r['scenario']} mqtt={r['protocol']} qos={r['qos']} size={r['size']}B"
             f" rate={_n(r['rate'])}/s window={r['window']} e2e={r['e2e_window']} duration={_n(r['duration'])}s"
             f" procs={r['procs']}"
             + (" persistent-subs" if r.get("persistent_subs") else "")
             + (" persistent-conns" if r.get("persistent_conns") else ""))),
            ("broker", r["broker"]),
            ("connections", (f"{_n(r['connected'])}/{_n(r['connections'])} in {r['connect_s']:.3f} s"
             f" = {_n(r['connect_rate'])}/s, failed {_n(r['connect_failed'])}, dropped {_n(r['dropped'])}"
             f" (cpu while connecting: broker {_n(r['broker_connect_cpu_pct'], '%')},"
             f" generator {_n(r['generator_connect_cpu_pct'], '%')})"))]
    if r["scenario"] != "conn":
        rows += [("messages", (f"sent {_n(r['sent'])}  received {_n(r['received'])} of {_n(r['expected'])}"
                  f"  lost {_n(r['lost'])}  duplicated {_n(r['duplicated'])}  reordered {_n(r['reordered'])}")),
                 ("throughput", f"in {_n(r['msgs_in_per_s'])} msgs/s  out {_n(r['msgs_out_per_s'])} msgs/s"),
                 ("latency ms", (f"p50 {lat['p50']:.3f}  p90 {lat['p90']:.3f}  p99 {lat['p99']:.3f}"
                  f"  p99.9 {lat['p99.9']:.3f}  max {lat['max']:.3f}  ({_n(lat['samples'])} samples)"))]
    else:
        rows.append(("keepalive", f"pings {_n(r['pings'])} pongs {_n(r['pongs'])}"))
    rows += [("broker", (f"cpu {_n(r['broker_cpu_pct'], '%')} ({_n(r['broker_cpu_s'], ' s')})"
                         f"  rss {_n(r['broker_rss_mb'], ' MB')}"
              f" (idle {_n(r['broker_rss_idle_mb'], ' MB')}, {_n(r['rss_per_conn_kb'], ' KB')}/conn,"
              f" {_n(r['broker_procs'])} processes)")),
             ("generator", f"cpu {_n(r['generator_cpu_pct'], '%')} over {r['procs']} processes"),
             ("errors", ", ".join(f"{k} {v:,}" for k, v in sorted(r["errors"].items())) or "none")]
    rows += [("note", n) for n in r["notes"]]
    rows.append(("result", "OK" if r["ok"] else "NOT OK"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
