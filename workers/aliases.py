"""Broker→client topic aliases of a 5.0 connection: which alias a PUBLISH to a topic is sent with.
The write path (workers/outbound.py) asks `choose` before it writes and calls `note` once it has
written a packet that names its topic, so the mapping is always the one of the packets on the wire,
in their order (a packet that is not written sets no alias).

Policy: while the client's Topic Alias Maximum leaves a free alias, a topic gets one the first time it
is sent (its name plus the alias; from then on an empty name plus the alias). When all are taken, a
new topic is sent with its name and no alias, and remembered as a miss; if it misses again before
`send_alias_max` other misses have passed, it takes the alias of the least recently used topic. A
topic seen once never displaces a busy one, and a set of topics cycling just beyond the maximum
does not make every packet carry name and alias (plain LRU would: 11% more topic bytes than no
aliases at all). Simulated over topic streams (zipf, busy topics among one-shot ones, shifting hot
sets, cycles; numbers in docs/architecture.md section 9), it sends fewer topic bytes than LRU on
every stream, and than first-come-keeps-it (never reassign) on all but a fixed set of topics just
beyond the maximum, and never more than no aliases. Topics shorter than 4 bytes are never aliased:
an empty name plus the 3-byte property is no smaller.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from plexmq.workers.negotiated import Negotiated

ALIASES_MAX = 1024  # the most aliases one connection is sent, whatever it allows: bounds the topics kept
_SHORTEST = 4  # the shortest topic name an alias makes smaller


def choose(negotiated: Negotiated, topic: bytes) -> int:
    """How a PUBLISH to `topic` is sent: -n uses alias n (an empty topic name), n sets alias n (the
    name and the alias), 0 names the topic without an alias. Only the topic's recency changes here;
    a new alias or a miss counts once `note` says the packet was written."""
    sent = negotiated.sent_aliases
    alias = sent.pop(topic, 0)
    if alias:
        sent[topic] = alias  # now the most recently used: last in the dict's order
        return -alias
    if len(topic) < _SHORTEST:
        return 0
    if len(sent) < negotiated.send_alias_max:
        return len(sent) + 1
    if topic in negotiated.alias_misses:
        return sent[next(iter(sent))]  # the least recently used topic's
    return 0


def note(negotiated: Negotiated, topic: bytes, chosen: int) -> None:
    """A PUBLISH to `topic` that names it was written with alias `chosen` (from `choose`, or 0)."""
    sent = negotiated.sent_aliases
    if chosen:
        if len(sent) >= negotiated.send_alias_max:
            del sent[next(iter(sent))]  # the topic `choose` took the alias from
            del negotiated.alias_misses[topic]
        sent[topic] = chosen
    elif len(topic) >= _SHORTEST:
        misses = negotiated.alias_misses
        if len(misses) >= negotiated.send_alias_max:
            misses.clear()
        misses[topic] = None
