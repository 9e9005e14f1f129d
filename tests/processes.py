"""The broker's processes as the process and durability tests watch them: a broker in a session of
its own (or under prlimit), its descendants, whether one is still alive."""

from __future__ import annotations

from pathlib import Path

import orjson
import psutil

from plexmq.process import CONFIG_ENV
from tests.conftest import Broker


def alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (an orphan's zombie may linger if PID 1 does not reap)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def descendants(b: Broker) -> list[psutil.Process]:
    try:
        return psutil.Process(b.proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


class OwnBroker(Broker):
    """A broker in its own session (a terminal's process group) or under `prlimit`."""

    def __init__(self, log_path: Path, args: list[str], *, session: bool = False,
                 nofile: tuple[int, int] | None = None) -> None:
        prefix = ("prlimit", f"--nofile={nofile[0]}:{nofile[1]}") if nofile else ()
        super().__init__(log_path, args, prefix=prefix, new_session=session)


def config_of(proc: psutil.Process | None) -> dict:
    """The config a router or worker started with: the file its CONFIG_ENV names (as the acceptor
    last wrote it)."""
    assert proc is not None, "no such process"
    with open(orjson.loads(proc.environ()[CONFIG_ENV])["config_path"], "rb") as f:
        return orjson.loads(f.read())
