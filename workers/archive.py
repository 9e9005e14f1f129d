"""The traffic archive writer that each worker runs on its hot path (format: `archive_format`).

Why it is shaped this way: the worker hands over a `Run` per client read (the PUBLISH packets as
received, plus what they share: receive time, client id, username), and the runs are written as one
chunk once `CHUNK_BYTES` are pending (or whatever arrived in `WRITE_SECONDS` at light load), so the
archive costs one list append per read and one `write` per chunk, nothing per message. Each worker writes its own files,
so there are no locks between processes.

Tenants: each tenant's segments go to its own tree, `dir/tenant=NAME/` (`tenant_dir`), so that a
tenant's archive can be handed to that tenant alone; the default tenant's stay in `dir` itself, where a
broker without tenants writes them. The caller names the tenant per run; a chunk and a segment hold
one tenant's runs only. Choosing a tenant's pending list is one dict lookup per read.

Files: a segment being written lives in its tree's `_writing/` as `.part` (Spark skips `_`-prefixed
directories and the pipeline reads only `.seg`), and sealing renames it into the tree's
`date=YYYY-MM-DD/hour=HH/`. A segment holds one UTC hour (of its records' receive times) and is
sealed when it reaches `roll_bytes`, is `roll_seconds` old, at the hour boundary and on `close`. There
is no fsync (it would stall the event loop): after a crash a segment may end in a torn chunk, which
readers skip and count, and a restarted worker seals the `.part` files its predecessor left behind.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path

from plexmq.archive_format import (
    HOUR_US,
    SEGMENT_SUFFIX,
    Run,
    encode_chunk,
    partition,
    segment_header,
    tenant_dir,
)
from plexmq.files import Access
from plexmq.mqtt.topics import matches

CHUNK_BYTES = 128 << 10  # packet bytes per chunk under load: large enough to amortise, small enough for the cache
WRITE_SECONDS = 1.0  # at light load, records wait at most this long in memory (lost if the worker dies)
STAGING = "_writing"
PART_SUFFIX = ".part"

log = logging.getLogger(__name__)


@dataclass
class _Open:
    """The segment being written."""

    fd: int
    part: Path
    final: Path
    hour: int  # receive hour (recv_us // HOUR_US) of every record in it
    size: int  # bytes of chunks written
    seal_at: float  # time.monotonic() at which roll_seconds is reached


@dataclass
class _Tree:
    """One tenant's part of the archive: its directory and the segment it is writing, if any."""

    root: Path
    open: _Open | None = None

    @property
    def staging(self) -> Path:
        return self.root / STAGING


class ArchiveWriter:
    """Appends one worker's archived PUBLISH records to its rolling segment files, a tree per tenant."""

    def __init__(
        self, directory: str, worker_id: int, filters: list[str], roll_bytes: int, roll_seconds: float,
        access: Access | None = None,
    ) -> None:
        """`access`: who else may read the files (default: nobody)."""
        self._root = Path(directory)
        self._access = access = access or Access()
        access.make_dir(str(self._root / STAGING))
        self._worker_id = worker_id
        self._filters = tuple(filters)
        self._roll_bytes = roll_bytes
        self._roll_seconds = roll_seconds
        self._pending: dict[str, list[Run]] = {}  # tenant -> its runs not yet written
        self._pending_bytes = 0
        self._written_at = -math.inf  # time.monotonic() of the last chunk written
        self._trees: dict[str, _Tree] = {"": _Tree(self._root)}
        self._seal_at = math.inf  # the earliest seal_at of the open segments
        self._opened = 0
        self._failing = False
        self.dropped_bytes = 0  # packet bytes lost to write errors (a full disk must not stop the broker)
        self._seal_leftovers()

    def set_filters(self, filters: list[str]) -> None:
        """New topic filters (SIGHUP); the worker forgets the answers it cached for the old ones."""
        self._filters = tuple(filters)

    def wants(self, topic: bytes) -> bool:
        """Whether PUBLISHes to `topic` (UTF-8, as received) are archived; the worker caches the answer."""
        name = topic.decode()
        return any(matches(f, name) for f in self._filters)

    def append(self, tenant: str, run: Run) -> None:
        """Queue a run of records of `tenant` ("": the default tenant); its payloads must be immutable
        bytes (kept until the chunk is written)."""
        runs = self._pending.get(tenant)
        if runs is None:
            runs = self._pending[tenant] = []
        runs.append(run)
        self._pending_bytes += len(run[2])

    def flush(self) -> None:
        """Write a chunk per tenant when enough is pending, and seal the segments that are old enough.

        Call it once per event-loop turn, and also now and then when idle (e.g. from the keepalive
        sweep) so that idle segments get sealed; with nothing to do it reads the clock and returns.
        """
        if self._pending_bytes < CHUNK_BYTES:
            now = time.monotonic()
            if not self._pending or now - self._written_at < WRITE_SECONDS:
                if now >= self._seal_at:
                    self._seal_old(now)
                return
        self._write_pending()

    def close(self) -> None:
        """Write what is pending and seal the segments (worker shutdown)."""
        if self._pending:
            self._write_pending()
        for tree in self._trees.values():
            if tree.open is not None:
                self._seal(tree)

    def _write_pending(self) -> None:
        pending, self._pending = self._pending, {}
        self._pending_bytes = 0
        self._written_at = time.monotonic()
        for tenant, runs in pending.items():
            tree = self._trees.get(tenant) or self._tree(tenant)
            if runs[0][0] // HOUR_US == runs[-1][0] // HOUR_US:
                self._write_hour(tree, runs[0][0] // HOUR_US, runs)
            else:  # the chunk spans an hour boundary
                for hour, group in groupby(runs, key=lambda run: run[0] // HOUR_US):
                    self._write_hour(tree, hour, list(group))
        if self._written_at >= self._seal_at:
            self._seal_old(self._written_at)

    def _tree(self, tenant: str) -> _Tree:
        """A named tenant's tree, the first time this writer writes for it."""
        tree = self._trees[tenant] = _Tree(self._root / tenant_dir(tenant))
        try:
            self._access.make_dir(str(tree.root))
            self._access.make_dir(str(tree.staging))
        except OSError as e:  # its first segment's open fails too, and counts the dropped bytes
            self._error(e)
        return tree

    def _write_hour(self, tree: _Tree, hour: int, runs: list[Run]) -> None:
        if tree.open is not None and tree.open.hour != hour:
            self._seal(tree)
        try:
            segment = tree.open or self._start(tree, hour, runs[0][0])
            chunk = encode_chunk(runs)
            os.writev(segment.fd, chunk)
        except OSError as e:
            self.dropped_bytes += sum(len(run[2]) for run in runs)
            self._error(e)
            if tree.open is not None:  # a failed write may have left a torn chunk: end the segment there
                self._seal(tree)
            return
        self._failing = False
        segment.size += len(chunk[0]) + len(chunk[1])
        if segment.size >= self._roll_bytes:
            self._seal(tree)

    def _start(self, tree: _Tree, hour: int, first_us: int) -> _Open:
        self._opened += 1
        name = f"w{self._worker_id}-{first_us}-{os.getpid()}-{self._opened}"
        part = tree.staging / (name + PART_SUFFIX)
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, self._access.file_mode)
        self._access.own(fd)
        seal_at = time.monotonic() + self._roll_seconds
        tree.open = _Open(fd, part, tree.root / partition(first_us) / (name + SEGMENT_SUFFIX), hour, 0, seal_at)
        self._seal_at = min(self._seal_at, seal_at)
        os.write(fd, segment_header(self._worker_id))
        return tree.open

    def _seal_old(self, now: float) -> None:
        """Seal the segments that are `roll_seconds` old, and note when the next one will be."""
        self._seal_at = math.inf
        for tree in self._trees.values():
            if tree.open is not None:
                if now >= tree.open.seal_at:
                    self._seal(tree)
                else:
                    self._seal_at = min(self._seal_at, tree.open.seal_at)

    def _seal(self, tree: _Tree) -> None:
        assert tree.open is not None
        segment, tree.open = tree.open, None
        try:
            os.close(segment.fd)
            if segment.size == 0:  # its first chunk could not be written
                os.unlink(segment.part)
                return
            self._make_partition(segment.final.parent)
            os.rename(segment.part, segment.final)
        except OSError as e:  # the .part stays behind and is sealed when the worker restarts
            self._error(e)

    def _make_partition(self, hour_dir: Path) -> None:
        """`date=.../hour=...`, both levels with the archive's access."""
        if not hour_dir.is_dir():
            self._access.make_dir(str(hour_dir.parent))
            self._access.make_dir(str(hour_dir))

    def _error(self, e: OSError) -> None:
        """Log the first of a run of write errors."""
        if not self._failing:
            log.error("archive: worker %d cannot write to %s: %s", self._worker_id, self._root, e)
        self._failing = True

    def _seal_leftovers(self) -> None:
        """Seal the `.part` files a crashed writer with this worker id left, in every tenant's tree
        (one live writer per id)."""
        header = len(segment_header(self._worker_id))
        pattern = f"w{self._worker_id}-*{PART_SUFFIX}"
        for part in [*self._root.glob(f"{STAGING}/{pattern}"), *self._root.glob(f"{tenant_dir('*')}/{STAGING}/{pattern}")]:
            if part.stat().st_size <= header:
                part.unlink()
                continue
            first_us = int(part.name.split("-")[1])
            final = part.parent.parent / partition(first_us) / (part.stem + SEGMENT_SUFFIX)
            self._make_partition(final.parent)
            os.rename(part, final)
