"""Shared subscriptions (`$share/{name}/{filter}`, MQTT 5.0 section 4.8.2, also for 3.1.1 clients):
each message matching the filter goes to one member of the group, chosen by the router.

A group is one key in the subscription trie (beside sessions), so matching a topic finds it once
however many members it has. Which member gets a message is decided per message, from the members'
state at that moment: an online member if there is one (round robin, random or sticky, the
`shared_subscription_strategy` key), else a persistent member, whose session keeps it until it comes
back (under its usual queue limits). Retained messages are never sent to a shared subscription.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from plexmq.router.sessions import Session

STRATEGIES = ("round_robin", "random", "sticky")


class SharedGroup:
    """The members of one share name and filter, with their grants (plexmq/grants.py)."""

    __slots__ = ("name", "filter", "members", "order", "turn", "strategy")

    def __init__(self, name: str, topic_filter: str, strategy: str) -> None:
        self.name = name
        self.filter = topic_filter
        self.members: dict[Session, int] = {}
        self.order: list[Session] = []  # the members in the order they joined: the round
        self.turn = 0  # where the next round robin pick starts; sticky: the member picked last
        self.strategy = strategy

    def join(self, session: Session, grant: int) -> None:
        if session not in self.members:
            self.order.append(session)
        self.members[session] = grant

    def leave(self, session: Session) -> None:
        if self.members.pop(session, None) is not None:
            at = self.order.index(session)
            del self.order[at]
            if at < self.turn:
                self.turn -= 1

    def pick(self, exclude: Session | None = None, online_only: bool = False) -> tuple[Session, int] | None:
        """The member for the next message and its grant: online members first, then (unless
        `online_only`) a persistent one that is offline; None when no member can take it."""
        order = self.order
        count = len(order)
        if not count:
            return None
        if self.strategy == "random":
            online = [s for s in order if s.worker is not None and s is not exclude]
            if online:
                chosen = random.choice(online)
                return chosen, self.members[chosen]
        else:
            start = self.turn % count
            for step in range(count):
                at = (start + step) % count
                session = order[at]
                if session.worker is not None and session is not exclude:
                    # sticky stays on the member until it cannot take messages; round robin moves on
                    self.turn = at if self.strategy == "sticky" else at + 1
                    return session, self.members[session]
        if online_only:
            return None
        start = self.turn % count
        for step in range(count):  # every member is offline: a persistent one keeps it
            at = (start + step) % count
            session = order[at]
            if session.persistent and session is not exclude:
                self.turn = at + 1
                return session, self.members[session]
        return None
