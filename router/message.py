"""A message as the router keeps it: the retained message of a topic, and (as `router/outbox.py:
Pending`) a copy waiting in a persistent session's outbox.

One value with its fields in one order, so that what is kept, stored and sent again is the same
thing everywhere. The per-message routing path (`Router.route`) still takes the fields themselves,
in this order: it builds no object for a message that is only passed on.
"""

from __future__ import annotations


class Message:
    """`props`: the MQTT 5 properties as they travel (plexmq/wire.py); `expires_at`: the time.time()
    second the message expires at (0: never), an absolute deadline (a relative interval is `expiry`)."""

    __slots__ = ("topic", "payload", "qos", "retain", "props", "expires_at")

    def __init__(self, topic: bytes, payload: bytes, qos: int, retain: bool, props: bytes = b"",
                 expires_at: int = 0) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.props = props
        self.expires_at = expires_at
