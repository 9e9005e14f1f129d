"""One tenant's part of the router (docs/architecture.md, issue 23): its sessions, subscription trie,
retained messages, shared groups and match cache. Each tenant is a partition of its own, so a topic,
a client id or a `#` subscription never reaches across tenants, and nothing is prefixed with the
tenant's name. The default tenant ("") always exists; the router makes the others when a CONNECT or
the store names them.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from plexmq.router.retain import RetainedStore
from plexmq.trie import SubscriptionTrie

if TYPE_CHECKING:
    from plexmq.router.core import Targets
    from plexmq.router.sessions import Session
    from plexmq.router.shared import SharedGroup

class Tenant:
    __slots__ = ("name", "sessions", "trie", "retained", "groups", "cache", "limit_hits",
                 "received", "delivered")  # metrics (wave 2)

    def __init__(self, name: str) -> None:
        self.name = name
        self.sessions: dict[str, Session] = {}  # client id -> its session
        self.trie = SubscriptionTrie()  # keys: Sessions and SharedGroups
        self.retained = RetainedStore()
        self.groups: dict[str, SharedGroup] = {}  # "$share/{name}/{filter}" -> its group
        self.cache: dict[bytes, Targets] = {}  # topic -> its cached match (Router._match)
        self.limit_hits: Counter[str] = Counter()  # limit name -> times the router refused or dropped for it
        # metrics (wave 2): as the router's `received` and `delivered`, of this tenant's messages
        self.received = 0
        self.delivered = 0
