"""The router's subscription index: a trie of topic filters (MQTT 3.1.1 section 4.7).

Each trie level is one topic level; the wildcards `+` and `#` are stored as ordinary child keys, which is
safe because topic names never contain them (workers refuse such PUBLISH topics with
`plexmq.mqtt.topics.topic_name_error`, and filters are checked with `plexmq.mqtt.topics.valid_filter` before they
get here). `plexmq.mqtt.topics.matches` is the reference semantics; the trie must agree with it.

Matching walks the topic level by level, keeping the frontier of nodes whose filter prefix matches the
topic so far (literal child and `+` child of each), and collects the subscribers of every `#` child met on
the way. It is iterative, so a topic with thousands of levels cannot exhaust the recursion limit.

Memory: a node is a two-slot object whose dicts are created only when needed (`None` otherwise), and
nodes left without children or subscribers are pruned on removal, so churn does not grow the trie.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator

from plexmq.grants import Matched, merge

__all__ = ["SubscriptionTrie"]


class _Node:
    __slots__ = ("children", "subs")

    def __init__(self) -> None:
        self.children: dict[str, _Node] | None = None  # level -> child ("+" and "#" included)
        self.subs: dict[Hashable, int] | None = None  # key -> grant of the filter ending here (plexmq/grants.py)


def _collect(subs: dict[Hashable, int], result: dict[Hashable, Matched]) -> None:
    """Merge `subs` into `result`: per key the highest QoS, or every grant when one is not plain
    (plexmq/grants.py)."""
    if not result:
        result.update(subs)
        return
    get = result.get
    for key, grant in subs.items():
        old = get(key)
        result[key] = grant if old is None else merge(old, grant)


class SubscriptionTrie:
    """The subscription index of the router: topic filters with + and # -> subscribers (any hashable key) with their grant."""

    __slots__ = ("_root", "_count")

    def __init__(self) -> None:
        self._root = _Node()
        self._count = 0

    def __len__(self) -> int:
        """The number of (filter, key) subscriptions."""
        return self._count

    def has_first_level(self, level: str) -> bool:
        """Whether some filter begins with the literal level `level`: for a `$` level (`$SYS`) that is
        whether any filter can match its topics at all, since `+` and `#` never match them (pruning
        keeps the answer exact)."""
        children = self._root.children
        return children is not None and level in children

    def add(self, topic_filter: str, key: Hashable, grant: int) -> bool:
        """Subscribe `key` to the (valid) `topic_filter` with `grant` (its granted QoS for 3.1.1).

        True when the subscription is new, False when it replaced the QoS of an existing (filter, key).
        """
        node = self._root
        for level in topic_filter.split("/"):
            children = node.children
            if children is None:
                children = node.children = {}
            child = children.get(level)
            if child is None:
                child = children[level] = _Node()
            node = child
        subs = node.subs
        if subs is None:
            node.subs = {key: grant}
        else:
            old = subs.get(key)
            if old is not None:
                subs[key] = grant
                return False
            subs[key] = grant
        self._count += 1
        return True

    def remove(self, topic_filter: str, key: Hashable) -> bool:
        """Unsubscribe `key` from `topic_filter`; True when that subscription existed.

        Nodes left with neither children nor subscribers are pruned.
        """
        path: list[tuple[_Node, str]] = []  # (parent, level) down to the filter's node
        node = self._root
        for level in topic_filter.split("/"):
            children = node.children
            if children is None:
                return False
            child = children.get(level)
            if child is None:
                return False
            path.append((node, level))
            node = child
        subs = node.subs
        if subs is None or key not in subs:
            return False
        del subs[key]
        if not subs:
            node.subs = None
            # prune upwards while the node is empty
            for parent, level in reversed(path):
                if node.subs is not None or node.children is not None:
                    break
                children = parent.children
                del children[level]  # type: ignore[union-attr]  # a node on the path has children
                if not children:
                    parent.children = None
                node = parent
        self._count -= 1
        return True

    def match(self, topic: str) -> dict[Hashable, Matched]:
        """Every key with a filter matching the topic name -> the highest QoS granted among those filters
        (plain grants), or all of their grants (plexmq/grants.py)."""
        result: dict[Hashable, Matched] = {}
        children = self._root.children
        if children is None:
            return result
        levels = topic.split("/")

        # First level: topics starting with "$" escape filters whose first level is "+" or "#".
        first = levels[0]
        nodes: list[_Node] = []
        if topic[:1] != "$":
            wild = children.get("#")
            if wild is not None and wild.subs:
                _collect(wild.subs, result)
            wild = children.get("+")
            if wild is not None:
                nodes.append(wild)
        child = children.get(first)
        if child is not None:
            nodes.append(child)

        for i in range(1, len(levels)):
            if not nodes:
                return result
            level = levels[i]
            nxt: list[_Node] = []
            for node in nodes:
                children = node.children
                if children is None:
                    continue
                wild = children.get("#")
                if wild is not None and wild.subs:
                    _collect(wild.subs, result)
                wild = children.get("+")
                if wild is not None:
                    nxt.append(wild)
                child = children.get(level)
                if child is not None:
                    nxt.append(child)
            nodes = nxt

        # Topic exhausted: filters ending here match, and so does a "#" below them ("a/#" matches "a").
        for node in nodes:
            if node.subs:
                _collect(node.subs, result)
            children = node.children
            if children is not None:
                wild = children.get("#")
                if wild is not None and wild.subs:
                    _collect(wild.subs, result)
        return result

    def filters(self) -> Iterator[tuple[str, int]]:
        """Each filter with its number of keys, depth first (the console's busiest filters: the caller
        takes as many as it may look at)."""
        stack = [(level, node) for level, node in (self._root.children or {}).items()]
        while stack:
            path, node = stack.pop()
            if node.subs:
                yield path, len(node.subs)
            if node.children:
                stack.extend((f"{path}/{level}", child) for level, child in node.children.items())

    def node_count(self) -> int:
        """Introspection for tests and stats: the number of trie nodes, the root included (O(nodes))."""
        count = 0
        stack = [self._root]
        while stack:
            node = stack.pop()
            count += 1
            if node.children:
                stack.extend(node.children.values())
        return count
