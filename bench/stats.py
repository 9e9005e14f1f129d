"""Latency histograms that merge across processes, and their percentiles.

A histogram is a dict {microseconds: count}: exact below 1 ms, 10 µs steps below 100 ms, 1 ms steps
above, so it stays a few thousand keys however many messages it counts and the generator processes
can ship it to the controller in one message.
"""

from __future__ import annotations

Histogram = dict[int, int]


def bucket(latency_us: int) -> int:
    """The key a latency is counted under (the hot path inlines the same two comparisons)."""
    if latency_us >= 1000:
        latency_us = latency_us // 10 * 10 if latency_us < 100_000 else latency_us // 1000 * 1000
    return latency_us


def merge(into: Histogram, other: Histogram) -> Histogram:
    for key, count in other.items():
        into[key] = into.get(key, 0) + count
    return into


def percentiles(hist: Histogram, points: tuple[float, ...] = (50, 90, 99, 99.9)) -> dict[str, float]:
    """{'p50': ms, ..., 'max': ms, 'mean': ms, 'samples': n}; empty histogram gives zeros."""
    total = sum(hist.values())
    result: dict[str, float] = {f"p{p:g}": 0.0 for p in points}
    result.update(max=0.0, mean=0.0, samples=total)
    if not total:
        return result
    keys = sorted(hist)
    targets = sorted((p, max(1, round(total * p / 100))) for p in points)
    seen = 0
    t = 0
    for key in keys:
        seen += hist[key]
        while t < len(targets) and seen >= targets[t][1]:
            result[f"p{targets[t][0]:g}"] = key / 1000
            t += 1
    result["max"] = keys[-1] / 1000
    result["mean"] = sum(k * c for k, c in hist.items()) / total / 1000
    return result
