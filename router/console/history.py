"""The overview's history (router/ops/history.py keeps it): `GET /api/history`, read once when the
overview loads, which draws it and then goes on with the live events (router/console/events.py).

A broker admin's only: the series are the broker's and its workers'; a tenant admin's overview is
of its tenant's figures, which are kept live only (an empty history: its charts start at the page's load).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plexmq.router.console.http import Page, Reply, Routes, json

if TYPE_CHECKING:
    from plexmq.router.console.app import Console
    from plexmq.router.console.auth import Session


def history(console: Console, environ: dict, session: Session) -> Reply:
    """GET /api/history: {"broker": {"seconds": {"at": [...], SERIES: [...]}, "minutes": {...}},
    "workers": {label: the same, of "cpu" and "rss"}}; {} for a tenant admin."""
    return json(console.stats.history.copy() if session.tenant is None else {})


PAGES: list[Page] = []
ROUTES: Routes = {("GET", "/api/history"): history}
