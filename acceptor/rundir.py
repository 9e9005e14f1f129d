"""The run dir (`run_dir`, mode 0700): the router's ipc:// socket, the children's `config.json` and the
admin token `admin-PORT.token`. The acceptor holds its lock (`LOCK_FILE`, acceptor/pidlock.py) for
its life, so what a broker killed with -9 left there is told from a live broker's: the next start
removes it (`claim`: in the run dir it was given; `sweep`: the temporary ones of this user's dead
brokers), and `plexmq status` and `clients` do not take it for a live broker's (`holder`)."""

from __future__ import annotations

import fnmatch
import logging
import os
import shutil
import tempfile

from plexmq.acceptor import pidlock
from plexmq.files import private_dir

log = logging.getLogger("plexmq.acceptor")

LOCK_FILE = "run.lock"
PREFIX = "plexmq-"  # a run dir of the broker's own (run_dir = ""): PREFIX and mkdtemp's 8 characters
# what a broker puts there (peer-w<id>.sock: each worker's inbox from the others of its host, workers/host_links.py;
# peer-w<id>.ipc in versions before the link PROTOCOL 10)
OURS = ("config.json", "config.json.part", "router.ipc", "peer-w*.sock", "peer-w*.ipc", "admin-*.token", "admin-*.token.part")


class RunDirError(Exception):
    """The run dir cannot be had: one line naming it."""


def claim(run_dir: str) -> int:
    """Make `run_dir` (0700) and hold it for this broker's life; the lock's descriptor. What a dead
    broker left there is removed, and said; RunDirError when another broker holds it."""
    try:
        private_dir(run_dir)
        fd = pidlock.take(os.path.join(run_dir, LOCK_FILE))
    except pidlock.Held as held:
        raise RunDirError(f"run dir {run_dir}: in use by another broker (pid {held.holder})") from None
    except OSError as exc:
        raise RunDirError(f"run dir {run_dir}: {exc.strerror}") from None
    left = leftovers(run_dir)
    if left:
        log.warning("run dir %s: removed what a broker that did not stop left there: %s", run_dir, ", ".join(left))
        release(run_dir)
    return fd


def leftovers(run_dir: str) -> list[str]:
    """The files of a broker in `run_dir` (the lock apart)."""
    return sorted(name for name in os.listdir(run_dir) if any(fnmatch.fnmatch(name, pattern) for pattern in OURS))


def release(run_dir: str) -> None:
    """Remove a broker's files from `run_dir`, a directory it was given (one of its own goes whole)."""
    for name in leftovers(run_dir):
        try:
            os.unlink(os.path.join(run_dir, name))
        except FileNotFoundError:
            pass


def make_temporary() -> tuple[str, int]:
    """A new run dir of this broker's own, held; before it, the ones of this user's brokers that died
    without removing theirs are removed (`sweep`)."""
    sweep(tempfile.gettempdir())
    run_dir = tempfile.mkdtemp(prefix=PREFIX)
    return run_dir, claim(run_dir)


def sweep(parent: str) -> None:
    """Remove the temporary run dirs in `parent` that this user's brokers left when they were killed:
    each one whose lock nobody holds (taken while it is removed, so a broker starting meanwhile
    cannot have it; one without a lock is left alone: a broker may be making it)."""
    for name in os.listdir(parent):
        path = os.path.join(parent, name)
        if not (name.startswith(PREFIX) and len(name) == len(PREFIX) + 8) or not os.path.isdir(path):
            continue
        try:
            if os.stat(path).st_uid != os.getuid() or not os.path.exists(os.path.join(path, LOCK_FILE)):
                continue
            fd = pidlock.take(os.path.join(path, LOCK_FILE))
        except (pidlock.Held, OSError):
            continue
        try:
            shutil.rmtree(path, ignore_errors=True)
            log.info("removed the run dir %s of a broker that did not stop", path)
        finally:
            os.close(fd)


def holder(run_dir: str) -> str | None:
    """The pid of the live broker that holds `run_dir`, or None (none, or it died); OSError when the
    run dir cannot be read (another user's)."""
    return pidlock.holder(os.path.join(run_dir, LOCK_FILE))
