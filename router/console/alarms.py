"""The overview's alarms acknowledged (router/ops/alarms.py raises and clears them): `POST
/api/alarms/acknowledge`, body {"name": N, "subject": S, "raised": T} naming one raised alarm as the
overview lists it. A broker admin acknowledges the broker's alarms, a tenant admin its tenant's (the
ones each overview shows). The alarms are the loop's: an ask marks it there, and the overview's next
event shows who and when. Audited (router/ops/audit.py)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from plexmq.router.asks import Ask, ask
from plexmq.router.console.http import Page, Reply, Routes, json_body, text
from plexmq.router.ops import audit

if TYPE_CHECKING:
    from plexmq.router.console.app import Console
    from plexmq.router.console.auth import Session
    from plexmq.router.core import Router
    from plexmq.router.ops.alarms import Alarm, Alarms

log = logging.getLogger("plexmq.router")


class Acknowledge(Ask):
    """Mark a raised alarm acknowledged by `by`; `found`: the alarm, None when it is not raised now."""

    def __init__(self, alarms: Alarms, name: str, subject: str, tenant: str | None, raised: float, by: str) -> None:
        super().__init__()
        self.alarms = alarms
        self.key = (name, subject, tenant, raised)
        self.by = by
        self.found: Alarm | None = None

    def start(self, router: Router) -> None:
        self.found = self.alarms.acknowledge(*self.key, self.by, time.time())
        self.done.set()


def acknowledge(console: Console, environ: dict, session: Session) -> Reply:
    """POST /api/alarms/acknowledge: 200 acknowledged, 404 when no such alarm is raised (it cleared)."""
    body = json_body(environ)
    body = body if isinstance(body, dict) else {}
    name, subject, raised = body.get("name"), body.get("subject"), body.get("raised")
    if not isinstance(name, str) or not isinstance(subject, str) or not isinstance(raised, int | float) \
            or isinstance(raised, bool):
        return text("400 Bad Request", 'the body is {"name": "NAME", "subject": "SUBJECT", "raised": TIME}')
    asked = Acknowledge(console.stats.alarms, name, subject, session.tenant, float(raised), session.user)
    if not ask(console.asks, asked):
        return text("503 Service Unavailable", "the router did not answer in time")
    found = asked.found
    address = environ.get("REMOTE_ADDR", "")
    target = f"{name} {subject}".strip()
    audit.record(console.asks, session.user, address, audit.ALARM_ACK, session.tenant or "", target,
                 "acknowledged" if found is not None else "not raised")
    if found is None:
        return text("404 Not Found", f"no alarm {target} raised now: it has cleared")
    log.info("console: %r from %s acknowledged the alarm %r", session.user, address, found.what)
    return text("200 OK", f"acknowledged: {found.what}")


PAGES: list[Page] = []
ROUTES: Routes = {("POST", "/api/alarms/acknowledge"): acknowledge}
