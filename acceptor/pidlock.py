"""A lock file that says which process holds a directory (the data dir, the run dir): flock on a
file that holds the holder's pid. The kernel drops the lock when the process ends, however it ends,
so a kill -9 leaves no stale claim, and whoever finds the lock free knows the directory's holder is
gone."""

from __future__ import annotations

import fcntl
import os


class Held(Exception):
    """The lock is another process's: its pid, as it wrote it."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


def take(path: str) -> int:
    """Hold the lock at `path` for this process's life; its descriptor, or Held. A new lock file
    appears already held (linked into place from a file of our own), so that nobody who finds it
    free can take it for a dead holder's while we are still taking it."""
    part = f"{path}.{os.getpid()}"
    fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a file of our own: nobody else holds it
    try:
        os.link(part, path)
    except FileExistsError:
        os.close(fd)
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "not yet written"
            os.close(fd)
            raise Held(holder) from None
    finally:
        os.unlink(part)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def holder(path: str) -> str | None:
    """The pid of the live process that holds the lock at `path` (as it wrote it), or None: no lock
    file, or nobody holds it (its holder died). OSError when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.read(fd, 32).decode(errors="replace").strip() or "not yet written"
    finally:
        os.close(fd)  # and with it any lock it got
    return None
