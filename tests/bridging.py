"""Helpers of the bridge tests (tests/test_bridges.py, tests/test_bridges_netns.py): a plexmq with a
config of its own, and waiting for a bridge's links to be up. The `brokers` fixture (tests/conftest.py)
stops what `serve` started."""

from __future__ import annotations

from pathlib import Path

from tests.cli import write
from tests.conftest import Broker, wait_for


def serve(brokers: list[Broker], tmp_path: Path, text: str, name: str = "a") -> Broker:
    """A plexmq with the config `text` (and a run dir of its own, for `plexmq bridges --config`)."""
    path = write(tmp_path, f'run_dir = "{tmp_path / (name + "-run")}"\n' + text, f"{name}.toml")
    b = Broker(tmp_path / f"{name}.log", ["--config", str(path), "--workers", "1"])
    brokers.append(b)
    return b


def bridged(b: Broker, name: str = "cloud", times: int = 1) -> None:
    """Until both of the bridge's links have been up `times` times, subscriptions in place."""
    wait_for(lambda: all(b.output().count(f"bridge {name}: {side} up") >= times for side in ("local", "remote")), 30,
             f"bridge {name} to be up ({times})")
