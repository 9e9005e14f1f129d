"""Retained messages: the last retained PUBLISH of each topic, sent to new subscribers, with its MQTT 5
properties and its expiry (time.time() second, 0: never): an expired one is never sent."""

from __future__ import annotations

from collections.abc import Iterator

from plexmq.mqtt.topics import matches

# payload, qos, properties (as plexmq/wire.py carries them), expiry
Retained = tuple[bytes, int, bytes, int]


class RetainedStore:
    __slots__ = ("messages",)

    def __init__(self) -> None:
        self.messages: dict[str, Retained] = {}

    def put(self, topic: str, payload: bytes, qos: int, props: bytes = b"", expiry: int = 0) -> None:
        """Replace the topic's retained message; an empty payload clears it (MQTT-3.3.1-10)."""
        if payload:
            self.messages[topic] = (payload, qos, props, expiry)
        else:
            self.messages.pop(topic, None)

    def matching(self, topic_filter: str, now: float) -> Iterator[tuple[str, Retained]]:
        """The retained messages, not expired at `now`, a new subscription to `topic_filter` receives."""
        if "+" not in topic_filter and "#" not in topic_filter:
            found = self.messages.get(topic_filter)
            if found is not None and not (found[3] and found[3] <= now):
                yield topic_filter, found
            return
        for topic, found in self.messages.items():
            if matches(topic_filter, topic) and not (found[3] and found[3] <= now):
                yield topic, found

    def expire(self, now: float) -> list[str]:
        """Remove the messages expired at `now`; their topics."""
        gone = [topic for topic, found in self.messages.items() if found[3] and found[3] <= now]
        for topic in gone:
            del self.messages[topic]
        return gone

    def __len__(self) -> int:
        return len(self.messages)
