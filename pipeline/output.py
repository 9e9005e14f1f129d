"""A job's `--out` directory, written so that a run that stops half-way leaves nothing that looks complete."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPORT = "report.html"


@contextmanager
def staged(out: str) -> Iterator[str]:
    """A new hidden directory inside `out` (created if missing) for the job's tables and report.html.

    When the job is done they move into `out`, replacing an earlier run's: its report.html first goes,
    and the new one comes last, so a report.html stands only beside the tables it describes. The
    hidden directory goes whatever happens (a failure, Ctrl-C), with the names in it that start with
    `.` (a job's scratch copies). What else `out` holds stays."""
    final = Path(out)
    final.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".partial-", dir=final))
    try:
        yield str(work)
        (final / REPORT).unlink(missing_ok=True)
        for entry in sorted(work.iterdir(), key=lambda p: p.name == REPORT):
            if not entry.name.startswith("."):
                target = final / entry.name
                if target.is_dir():
                    shutil.rmtree(target)
                os.replace(entry, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
