"""A bridge's topic rules: which filter a rule subscribes to on one side, and the topic a message
takes on the other (`strip` removed from its start, then `prefix` added; `rewrite = "FROM=TO"` is
`strip = FROM, prefix = TO`). Pure functions of the config: the acceptor checks the rules with
`parse` at startup, the bridge process maps topics with `Rule.topic`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from plexmq.mqtt.topics import matches, topic_name_error, valid_filter

KEYS = {"filter": str, "prefix": str, "strip": str, "rewrite": str, "qos": int, "retain": bool}


@dataclass(frozen=True, slots=True)
class Rule:
    filter: str  # subscribed on the side the messages come from
    prefix: str = ""
    strip: str = ""
    qos: int = 1  # the subscription's QoS: a message goes on at the lower of it and its own
    retain: bool = True  # pass the retain flag on (false: every message goes on without it)

    def topic(self, topic: str) -> str:
        """The topic `topic` takes on the other side."""
        if self.strip and topic.startswith(self.strip):
            topic = topic[len(self.strip):]
        return self.prefix + topic


def parse(table: Any) -> Rule:
    """The rule of one `{filter = ..., ...}` table; ValueError (what is wrong) when it is not one."""
    if not isinstance(table, dict):
        raise ValueError("must be a table like {filter = \"sensors/#\", prefix = \"site1/\", qos = 1}")
    for key, value in table.items():
        kind = KEYS.get(key)
        if kind is None:
            raise ValueError(f"unknown key {key!r} (one of {', '.join(KEYS)})")
        if not isinstance(value, kind) or kind is int and isinstance(value, bool):
            raise ValueError(f"{key} must be {kind.__name__}, not {value!r}")
    found = dict(table)
    if "filter" not in found or not valid_filter(found["filter"]) or found["filter"].startswith("$share/"):
        raise ValueError(f"filter must be a topic filter (no shared subscription), not {found.get('filter')!r}")
    if found.get("qos", 1) not in (0, 1, 2):
        raise ValueError(f"qos must be 0, 1 or 2, not {found['qos']!r}")
    rewrite = found.pop("rewrite", None)
    if rewrite is not None:
        if "prefix" in found or "strip" in found:
            raise ValueError("rewrite is strip and prefix in one: set it or them, not both")
        if rewrite.count("=") != 1:
            raise ValueError(f'rewrite must be "FROM=TO" (a topic starting with FROM gets TO instead), not {rewrite!r}')
        found["strip"], found["prefix"] = rewrite.split("=")
    for key in ("prefix", "strip"):
        if "+" in found.get(key, "") or "#" in found.get(key, "") or "\0" in found.get(key, ""):
            raise ValueError(f"{key} must not hold '+', '#' or U+0000, not {found[key]!r}")
    rule = Rule(**found)
    literal = rule.filter.split("+")[0].split("#")[0]  # what every topic the filter matches starts with
    if rule.strip and not literal.startswith(rule.strip):
        raise ValueError(f"strip {rule.strip!r}: not every topic of filter {rule.filter!r} starts with it")
    return rule


def first(rules: tuple[Rule, ...], topic: str) -> Rule | None:
    """The first rule whose filter matches `topic`; its topic on the other side must be a valid name
    (a strip that leaves nothing does not)."""
    for rule in rules:
        if matches(rule.filter, topic):
            return rule if topic_name_error(rule.topic(topic)) is None else None
    return None
