"""Topic names and topic filters: the MQTT 3.1.1 rules (section 4.7) and MQTT 5.0's shared
subscriptions (section 4.8.2) in one place.

Workers use these to refuse bad PUBLISH topics and SUBSCRIBE filters before anything reaches the
router; the router's trie and the archive filters use `matches` semantics.
"""

from __future__ import annotations


def topic_name_error(topic: str) -> str | None:
    """Why `topic` cannot be a PUBLISH topic name, or None when it can."""
    if not topic:
        return "empty topic name"
    if "+" in topic or "#" in topic:
        return "wildcard in topic name"
    if "\x00" in topic:
        return "U+0000 in topic name"
    return None


def valid_filter(topic_filter: str) -> bool:
    """True when `topic_filter` is a valid subscription filter (`+` a whole level, `#` last and whole)."""
    if not topic_filter or "\x00" in topic_filter:
        return False
    levels = topic_filter.split("/")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != last):
            return False
        if "+" in level and level != "+":
            return False
    return True


SHARED_PREFIX = "$share/"  # a shared subscription's filter starts so


def shared(topic_filter: str) -> tuple[str, str] | None:
    """(share name, topic filter) of a `$share/{name}/{filter}` subscription; None for any other filter."""
    if not topic_filter.startswith(SHARED_PREFIX):
        return None
    name, _slash, inner = topic_filter[len(SHARED_PREFIX):].partition("/")
    return name, inner


def subscribed(topic_filter: str) -> str:
    """The filter that topics are matched against: a shared subscription's own filter."""
    share = shared(topic_filter)
    return topic_filter if share is None else share[1]


def valid_subscription(topic_filter: str) -> bool:
    """`valid_filter`, and for a shared subscription a share name of one level without wildcards
    followed by a valid filter [MQTT-4.8.2-1, MQTT-4.8.2-2]."""
    share = shared(topic_filter)
    if share is None:
        return valid_filter(topic_filter)
    name, inner = share
    return bool(name) and "+" not in name and "#" not in name and valid_filter(inner)


def matches(topic_filter: str, topic: str) -> bool:
    """True when the valid filter matches the topic name; `$` topics escape first-level wildcards."""
    f_levels = topic_filter.split("/")
    t_levels = topic.split("/")
    if topic.startswith("$") and f_levels[0] in ("+", "#"):
        return False
    for i, f in enumerate(f_levels):
        if f == "#":
            return True
        if i >= len(t_levels):
            return False
        if f != "+" and f != t_levels[i]:
            return False
    return len(f_levels) == len(t_levels)
