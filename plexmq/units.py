"""Durations as people write them in config files and on command lines: `90`, `90s`, `10m`, `2h`, `30d`;
and counts as people read them in a log (`1 worker`, `2 workers`)."""

from __future__ import annotations

import re

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds; ValueError with the accepted forms when `text` is not a duration."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd]?)", text.strip())
    if match is None:
        raise ValueError(f"not a duration: {text!r} (e.g. 30s, 10m, 2h, 30d)")
    return float(match[1]) * _UNITS[match[2] or "s"]


def counted(count: int, noun: str) -> str:
    """`1 worker`, `2 workers`: the count and its noun, plural unless it is one."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
