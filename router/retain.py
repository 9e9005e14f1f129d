"""Retained messages: the last retained PUBLISH of each topic, sent to new subscribers."""

from __future__ import annotations

from typing import Iterator

from workers.mqtt.topics import matches


class RetainedStore:
    __slots__ = ("messages",)

    def __init__(self) -> None:
        self.messages: dict[str, tuple[bytes, int]] = {}

    def put(self, topic: str, payload: bytes, qos: int) -> None:
        """Replace the topic's retained message; an empty payload clears it (MQTT-3.3.1-10)."""
        if payload:
            self.messages[topic] = (payload, qos)
        else:
            self.messages.pop(topic, None)

    def matching(self, topic_filter: str) -> Iterator[tuple[str, bytes, int]]:
        """The retained (topic, payload, qos) a new subscription to `topic_filter` receives."""
        if "+" not in topic_filter and "#" not in topic_filter:
            found = self.messages.get(topic_filter)
            if found is not None:
                yield topic_filter, found[0], found[1]
            return
        for topic, (payload, qos) in self.messages.items():
            if matches(topic_filter, topic):
                yield topic, payload, qos

    def __len__(self) -> int:
        return len(self.messages)
