"""A subscription as the router keeps it: one int, the "grant", so that the trie, the sessions and the
store hold what they held for 3.1.1 (the granted QoS) and a 3.1.1 subscription stays that QoS.

    bits 0-1   granted QoS
    bit 2      no local (MQTT 5): not sent back to the session that published it
    bit 3      retain as published (MQTT 5): the retain flag kept on live deliveries
    bits 4-5   retain handling (MQTT 5): 0 send retained at subscribe, 1 only for a new subscription, 2 never
    bit 7      set only in a refusal: the value is then the SUBACK reason code (0x80 and up)
    bits 8-    the subscription identifier (MQTT 5; 0: none)

Only bits 0-3 and the identifier change how a message is routed; a grant without them is "plain"
(< 4) and takes the fast paths. Retain handling matters only when the subscription is made.
"""

from __future__ import annotations

import functools

from plexmq.mqtt import properties

NO_LOCAL = 0x04
RETAIN_AS_PUBLISHED = 0x08
RETAIN_HANDLING = 0x30
REFUSED = 0x80
ID_SHIFT = 8

# what a message to a subscriber with several matching subscriptions is matched with: one grant, or
# (when any of them is not plain) the tuple of all of them
Matched = int | tuple[int, ...]


def make(options: int, identifier: int = 0) -> int:
    """The grant of a subscription: the SUBSCRIBE's options byte and its subscription identifier."""
    return options | identifier << ID_SHIFT


def refused(grant: int) -> bool:
    return bool(grant & REFUSED)


def suback_code(grant: int) -> int:
    """What the SUBACK says for it: the granted QoS, or the refusal's reason code."""
    return grant if grant & REFUSED else grant & 3


def routing(grant: int) -> int:
    """The part of a grant that routing looks at (retain handling left out)."""
    return grant & ~RETAIN_HANDLING


def merge(old: Matched, new: int) -> Matched:
    """Two subscriptions of one session match a topic: the higher QoS when both are plain, else both kept."""
    if new < 4 and old.__class__ is int and old < 4:
        return new if new > old else old
    # (`__class__ is`, cheaper than isinstance here, leaves a tuple subclass possible in the else)
    return (*old, new) if old.__class__ is tuple else (old, new)  # type: ignore[return-value]  # old: an int there


def resolve(matched: Matched, qos: int, retain: bool, own: bool) -> tuple[int, bool, bytes] | None:
    """How a message at `qos` goes to a subscriber whose subscriptions matched as `matched`: (QoS,
    retain flag, its subscription identifier properties), or None when none of them takes it (no
    local, and `own`: the subscriber published it). One PUBLISH carries every identifier [MQTT-3.3.4-3]."""
    grants: tuple[int, ...] = matched if matched.__class__ is tuple else (matched,)  # type: ignore[assignment]  # as in merge
    best = -1
    keep_retain = False
    ids = b""
    for grant in grants:
        if own and grant & NO_LOCAL:
            continue  # [MQTT-3.8.3-3]
        if grant & 3 > best:
            best = grant & 3
        keep_retain = keep_retain or bool(grant & RETAIN_AS_PUBLISHED)
        identifier = grant >> ID_SHIFT
        if identifier:
            ids += identifier_property(identifier)
    if best < 0:
        return None
    return min(best, qos), retain and keep_retain, ids


@functools.lru_cache(maxsize=4096)
def identifier_property(identifier: int) -> bytes:
    """A Subscription Identifier property entry, as a PUBLISH carries it (made once per identifier:
    it is asked for on every delivery to a subscriber that has one)."""
    return properties.encode_entries({properties.SUBSCRIPTION_IDENTIFIER: identifier})


def sends_retained(grant: int, new: bool) -> bool:
    """Whether retained messages go out when this subscription is made (retain handling)."""
    handling = grant & RETAIN_HANDLING
    return handling == 0 or handling == 0x10 and new
