"""Retained messages: the last retained PUBLISH of each topic, sent to new subscribers, with its MQTT 5
properties and its deadline (`Message.expires_at`): an expired one is never sent."""

from __future__ import annotations

from collections.abc import Iterator

from plexmq.mqtt.topics import matches
from plexmq.router.message import Message


class RetainedStore:
    __slots__ = ("messages", "bytes")

    def __init__(self) -> None:
        self.messages: dict[str, Message] = {}
        self.bytes = 0  # bytes `messages` hold: topics, payloads, properties (a tenant's max_retained_bytes)

    def load(self, messages: dict[str, Message]) -> None:
        """The messages a restarted router's store kept."""
        self.messages = messages
        self.bytes = sum(_size(message) for message in messages.values())

    def put(self, topic: str, message: Message) -> None:
        """Replace the topic's retained message; an empty payload clears it (MQTT-3.3.1-10)."""
        old = self.messages.get(topic)
        if old is not None:
            self.bytes -= _size(old)
        if message.payload:
            self.messages[topic] = message
            self.bytes += _size(message)
        elif old is not None:
            del self.messages[topic]

    def refuses(self, topic: str, size: int, most: int, most_bytes: int) -> str | None:
        """The limit (max_retained_messages, max_retained_bytes; 0: none) a retained message of `size`
        bytes (topic, payload and properties; 0: it clears) on `topic` would pass, or None: clearing
        always fits, and replacing one counts what it frees."""
        if not size:
            return None
        old = self.messages.get(topic)
        if old is None and most and len(self.messages) >= most:
            return "max_retained_messages"
        if most_bytes and self.bytes - (_size(old) if old is not None else 0) + size > most_bytes:
            return "max_retained_bytes"
        return None

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
            self.bytes -= _size(self.messages.pop(topic))
        return gone

    def __len__(self) -> int:
        return len(self.messages)


def retained_size(topic: bytes, payload: bytes, props: bytes) -> int:
    """What a retained message holds, as max_retained_bytes counts it (0: an empty payload, which clears)."""
    return len(topic) + len(payload) + len(props) if payload else 0


def _size(message: Message) -> int:
    return retained_size(message.topic, message.payload, message.props)
