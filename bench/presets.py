"""The named scenarios of the broker's performance targets (bench/RESULTS.md), so compare, sweep,
`plexmq bench` and RESULTS.md mean the same runs.

Each preset is a set of Options fields plus what the comparison shows for it (the key metrics); a
group names the presets of one table (`light`: the light-load table), so one `--scenarios` runs the whole table.
"""

from __future__ import annotations

from dataclasses import replace

from plexmq.bench.plan import Options, with_defaults

PRESETS: dict[str, dict] = {
    "fanin0": {"scenario": "fanin", "pubs": 100, "subs": 1, "qos": 0, "rate": 0.0},
    "fanin1": {"scenario": "fanin", "pubs": 100, "subs": 1, "qos": 1, "window": 10, "rate": 0.0},
    "fanout0": {"scenario": "fanout", "pubs": 1, "subs": 1000, "qos": 0, "rate": 0.0},
    "fanout1": {"scenario": "fanout", "pubs": 1, "subs": 1000, "qos": 1, "window": 10, "rate": 0.0},
    "lat0": {"scenario": "fanin", "pubs": 100, "subs": 1, "qos": 0, "rate": 100.0},
    "connstorm": {"scenario": "conn", "clients": 10_000, "conn_rate": 0.0, "duration": 3.0, "keepalive": 60},
    "p2p1": {"scenario": "p2p", "clients": 100, "qos": 1, "window": 10, "rate": 0.0},
    "idle100k": {"scenario": "conn", "clients": 100_000, "duration": 60.0, "keepalive": 30},
    # the light load (the `light` group), at mqload's sizes: many clients sending a little each, CPU-s over 15 s
    "p2p2k0": {"scenario": "p2p", "clients": 2000, "qos": 0, "rate": 5.0, "duration": 15.0},
    "p2p2k1": {"scenario": "p2p", "clients": 2000, "qos": 1, "window": 10, "rate": 5.0, "duration": 15.0},
    "p2p9k1": {"scenario": "p2p", "clients": 9000, "qos": 1, "window": 10, "rate": 2.0, "duration": 15.0},
    "connstorm15k": {"scenario": "conn", "clients": 15_000, "conn_rate": 0.0, "duration": 3.0, "keepalive": 60},
}
DEFAULT = ("fanin0", "fanin1", "fanout0", "lat0", "connstorm")
# plexmq --workers a preset is stated with (the light-load table); the others take compare's --workers
WORKERS = {"connstorm15k": 2, "idle100k": 8}
GROUPS = {"light": ("lat0", "p2p2k0", "p2p2k1", "p2p9k1", "connstorm15k", "idle100k", "fanin1")}  # the light-load table

# (label, result key or latency percentile, digits) shown per scenario kind
METRICS = {
    "pubsub": [("msgs/s out", "msgs_out_per_s", 0), ("msgs/s in", "msgs_in_per_s", 0), ("lost", "lost", 0),
               ("latency p50 ms", "p50", 3), ("latency p99 ms", "p99", 3), ("broker cpu %", "broker_cpu_pct", 0),
               ("broker cpu s", "broker_cpu_s", 2), ("generator cpu %", "generator_cpu_pct", 0),
               ("broker rss MB", "broker_rss_mb", 0)],
    "conn": [("connected", "connected", 0), ("connect/s", "connect_rate", 0), ("failed", "connect_failed", 0),
             ("broker cpu % connecting", "broker_connect_cpu_pct", 0),
             ("broker cpu µs/connect", "broker_connect_us", 0),
             ("  acceptor µs/connect", "acceptor_connect_us", 1), ("  router µs/connect", "router_connect_us", 1),
             ("  workers µs/connect", "workers_connect_us", 1),
             ("generator cpu % connecting", "generator_connect_cpu_pct", 0),
             ("dropped", "dropped", 0), ("KB/conn (rss)", "rss_per_conn_kb", 2), ("broker rss MB", "broker_rss_mb", 0),
             ("broker cpu % holding", "broker_cpu_pct", 0)],
}


def expand(names: str) -> list[str]:
    """Comma-separated preset and group names as the presets they stand for, in order, each once."""
    out: list[str] = []
    for name in names.split(","):
        for preset in GROUPS.get(name, (name,)):
            if preset not in PRESETS:
                raise KeyError(f"unknown scenario {preset!r}: one of {', '.join([*PRESETS, *GROUPS])}")
            if preset not in out:
                out.append(preset)
    return out


def options(name: str, duration: float | None = None, **override: object) -> Options:
    """The Options of a preset with overrides (None values ignored); `duration` applies to the
    publishing scenarios only, the conn presets keep their hold time."""
    if name not in PRESETS:
        raise KeyError(f"unknown scenario {name!r}: one of {', '.join(PRESETS)}")
    fields = dict(PRESETS[name])
    if duration is not None and fields["scenario"] != "conn":
        fields["duration"] = duration
    fields.update({k: v for k, v in override.items() if v is not None and k != "scenario"})
    return with_defaults(replace(Options(scenario=fields.pop("scenario")), **fields))


def metric(result: dict, key: str) -> float | None:
    if key in ("p50", "p90", "p99", "p99.9", "max"):
        return result["latency_ms"][key]
    return result.get(key)
