"""Retained messages: the last retained PUBLISH of each topic, sent to new subscribers, with its MQTT 5
properties and its deadline (`Message.expires_at`): an expired one is never sent."""

from __future__ import annotations

from collections.abc import Iterator

from plexmq.mqtt.topics import matches
from plexmq.router.message import Message


class RetainedStore:
    __slots__ = ("messages",)

    def __init__(self) -> None:
        self.messages: dict[str, Message] = {}

    def put(self, topic: str, message: Message) -> None:
        """Replace the topic's retained message; an empty payload clears it (MQTT-3.3.1-10)."""
        if message.payload:
            self.messages[topic] = message
        else:
            self.messages.pop(topic, None)

    def matching(self, topic_filter: str, now: float) -> Iterator[tuple[str, Message]]:
        """The retained messages, not expired at `now`, a new subscription to `topic_filter` receives."""
        if "+" not in topic_filter and "#" not in topic_filter:
            found = self.messages.get(topic_filter)
            if found is not None and not (found.expires_at and found.expires_at <= now):
                yield topic_filter, found
            return
        for topic, found in self.messages.items():
            if matches(topic_filter, topic) and not (found.expires_at and found.expires_at <= now):
                yield topic, found

    def expire(self, now: float) -> list[str]:
        """Remove the messages expired at `now`; their topics."""
        gone = [topic for topic, found in self.messages.items() if found.expires_at and found.expires_at <= now]
        for topic in gone:
            del self.messages[topic]
        return gone

    def __len__(self) -> int:
        return len(self.messages)
