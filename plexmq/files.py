"""The files that hold clients' messages (the store, the archive) are the broker's user's alone,
whatever the umask: its data dir 0700 and its files 0600, as mosquitto writes its store. The archive
may be shared with one group (`archive.group`, for the people who analyse it): 0750 and 0640, owned
by that group.
"""

from __future__ import annotations

import errno
import grp
import os
import stat


def private_dir(path: str) -> int:
    """Create `path` (and its parents) 0700, or take other users' access away from an existing one;
    its mode before (0 when it is new), so that the caller can say it changed."""
    try:
        found = os.stat(path).st_mode
    except FileNotFoundError:
        os.makedirs(path, mode=0o700)
        os.chmod(path, 0o700)  # the umask may have taken more away
        return 0
    if not stat.S_ISDIR(found):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
    before = stat.S_IMODE(found)
    if before & 0o077:
        os.chmod(path, before & 0o700)
    return before


def private_file(path: str) -> None:
    """Create `path` 0600, or make an existing one so (SQLite gives its -wal and -shm the mode of the
    database file: made private before it opens it, they are too)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def others_may_read(path: str) -> int:
    """The file's mode when users other than its owner and group may read or write it, else 0."""
    found = stat.S_IMODE(os.stat(path).st_mode)
    return found if found & 0o006 else 0


class Access:
    """Who besides the broker's user may read a tree of files: nobody, or the members of `group`."""

    __slots__ = ("gid", "file_mode", "dir_mode")

    def __init__(self, group: str = "") -> None:
        """KeyError when `group` is not a group of this host."""
        self.gid = grp.getgrnam(group).gr_gid if group else -1
        self.file_mode = 0o640 if group else 0o600
        self.dir_mode = 0o750 if group else 0o700

    def make_dir(self, path: str) -> None:
        """Create `path` and its missing parents with this access (existing ones are left alone,
        but the last, which is given it)."""
        os.makedirs(path, mode=self.dir_mode, exist_ok=True)
        os.chmod(path, self.dir_mode)
        if self.gid >= 0:
            os.chown(path, -1, self.gid)

    def own(self, fd: int) -> None:
        """Give an open file this access."""
        if self.gid >= 0:
            os.fchown(fd, -1, self.gid)
        os.fchmod(fd, self.file_mode)
