"""Tests for plexmq/trie.py (the subscription index) and plexmq/mqtt/topics.py (the MQTT 3.1.1 topic rules)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plexmq import grants
from plexmq.mqtt.topics import matches, topic_name_error, valid_filter
from plexmq.trie import SubscriptionTrie

# (filter, topic, expected)
MATCH_TABLE = [
    # exact
    ("a", "a", True),
    ("a", "b", False),
    ("a/b", "a/b", True),
    ("a/b", "a", False),
    ("a", "a/b", False),
    ("a/b/c", "a/b/c", True),
    ("a/b/c", "a/b/d", False),
    # case sensitive, spaces are characters
    ("A", "a", False),
    ("a b", "a b", True),
    # "+" is exactly one level
    ("+", "a", True),
    ("+", "a/b", False),
    ("a/+", "a/b", True),
    ("a/+", "a", False),
    ("a/+", "a/b/c", False),
    ("a/+/c", "a/b/c", True),
    ("a/+/c", "a/b/d", False),
    ("+/+", "a/b", True),
    ("+/b", "a/b", True),
    ("+/+/+", "a/b", False),
    # "#" matches the parent and everything below
    ("#", "a", True),
    ("#", "a/b/c", True),
    ("a/#", "a", True),
    ("a/#", "a/b", True),
    ("a/#", "a/b/c", True),
    ("a/#", "b", False),
    ("a/#", "ab", False),
    ("a/b/#", "a", False),
    ("a/b/#", "a/b", True),
    ("a/+/#", "a", False),
    ("a/+/#", "a/b", True),
    ("a/+/#", "a/b/c/d", True),
    ("+/#", "a", True),
    # empty levels are real levels
    ("a//b", "a//b", True),
    ("a//b", "a/b", False),
    ("a/+/b", "a//b", True),
    ("/a", "/a", True),
    ("/a", "a", False),
    ("+/a", "/a", True),
    ("/+", "/a", True),
    ("/+", "/", True),
    ("+", "", True),  # not a valid topic name, but "+" matches the one empty level
    ("+/+", "/", True),
    ("a/", "a/", True),
    ("a/", "a", False),
    ("a/+", "a/", True),
    ("#", "/", True),
    ("/#", "/", True),
    ("/#", "/a/b", True),
    ("/#", "a", False),
    ("a/#", "a/", True),
    ("//", "//", True),
    ("+/+/+", "//", True),
    # "$" topics escape first-level wildcards
    ("#", "$SYS", False),
    ("#", "$SYS/x", False),
    ("+", "$SYS", False),
    ("+/x", "$SYS/x", False),
    ("+/#", "$SYS/x", False),
    ("$SYS/#", "$SYS/x", True),
    ("$SYS/#", "$SYS", True),
    ("$SYS/+", "$SYS/x", True),
    ("$SYS/x", "$SYS/x", True),
    ("$SYS/+/c", "$SYS/b/c", True),
    ("#", "$", False),
    ("$", "$", True),
    ("#", "a/$b", True),  # only the FIRST character of the topic counts
    ("a/+", "a/$b", True),
    ("a/#", "a/$b", True),
    ("#", "x$", True),
]


@pytest.mark.parametrize("topic_filter,topic,expected", MATCH_TABLE)
def test_match_table(topic_filter: str, topic: str, expected: bool) -> None:
    assert valid_filter(topic_filter)
    assert matches(topic_filter, topic) is expected
    trie = SubscriptionTrie()
    trie.add(topic_filter, "k", 1)
    assert (trie.match(topic) == {"k": 1}) is expected
    if not expected:
        assert trie.match(topic) == {}


def test_match_table_all_in_one_trie() -> None:
    """All table filters in one trie at once (each its own key): match agrees with `matches` row by row."""
    trie = SubscriptionTrie()
    filters = sorted({f for f, _, _ in MATCH_TABLE})
    for f in filters:
        assert trie.add(f, f, 0)
    for _, topic, _ in MATCH_TABLE:
        assert set(trie.match(topic)) == {f for f in filters if matches(f, topic)}


def test_empty_trie() -> None:
    trie = SubscriptionTrie()
    assert len(trie) == 0
    assert trie.match("a/b") == {}
    assert trie.node_count() == 1


def test_overlapping_filters_of_one_key_give_max_qos() -> None:
    trie = SubscriptionTrie()
    trie.add("a/+", "c1", 0)
    trie.add("a/#", "c1", 2)
    trie.add("a/b", "c1", 1)
    assert trie.match("a/b") == {"c1": 2}
    assert trie.match("a") == {"c1": 2}
    assert trie.match("a/c") == {"c1": 2}
    assert len(trie) == 3

    trie.remove("a/#", "c1")
    assert trie.match("a/b") == {"c1": 1}
    assert trie.match("a/c") == {"c1": 0}
    assert trie.match("a") == {}

    # max is independent of the order in which matches are found
    trie2 = SubscriptionTrie()
    trie2.add("#", "c", 1)
    trie2.add("x/y", "c", 0)
    trie2.add("+/y", "c", 2)
    assert trie2.match("x/y") == {"c": 2}


def test_grants_with_options_or_identifiers_are_all_kept() -> None:
    """MQTT 5 subscriptions (plexmq/grants.py) of one key that match one topic: every grant when any
    is not plain, so that routing can apply each one's options and carry each identifier."""
    trie = SubscriptionTrie()
    with_id = grants.make(1, 7)
    no_local = grants.make(2 | grants.NO_LOCAL)
    trie.add("a/+", "c", with_id)
    trie.add("a/#", "c", 0)
    assert sorted(trie.match("a/b")["c"]) == [0, with_id]  # type: ignore[arg-type]  # both kept: a tuple
    trie.add("a/b", "c", no_local)
    assert sorted(trie.match("a/b")["c"]) == [0, no_local, with_id]  # type: ignore[arg-type]  # as above
    assert trie.match("a") == {"c": 0}
    assert grants.resolve(trie.match("a/b")["c"], 2, True, own=True) == (1, False, b"\x0b\x07")
    assert grants.resolve(trie.match("a/b")["c"], 2, True, own=False) == (2, False, b"\x0b\x07")
    assert grants.resolve(no_local, 1, False, own=True) is None
    assert grants.resolve(grants.make(1 | grants.RETAIN_AS_PUBLISHED), 2, True, own=False) == (1, True, b"")


def test_several_keys() -> None:
    trie = SubscriptionTrie()
    trie.add("sensors/+/temp", "alice", 1)
    trie.add("sensors/#", "bob", 0)
    trie.add("sensors/kitchen/temp", "carol", 2)
    trie.add("sensors/kitchen/temp", "alice", 0)
    trie.add("other", "dave", 1)
    assert trie.match("sensors/kitchen/temp") == {"alice": 1, "bob": 0, "carol": 2}
    assert trie.match("sensors/hall/temp") == {"alice": 1, "bob": 0}
    assert trie.match("sensors") == {"bob": 0}
    assert trie.match("other") == {"dave": 1}
    assert trie.match("nothing") == {}
    assert len(trie) == 5


def test_any_hashable_key() -> None:
    trie = SubscriptionTrie()
    trie.add("a", ("worker-1", 17), 1)
    trie.add("a", 42, 2)
    trie.add("a", frozenset({"x"}), 0)
    assert trie.match("a") == {("worker-1", 17): 1, 42: 2, frozenset({"x"}): 0}


def test_replace_qos() -> None:
    trie = SubscriptionTrie()
    assert trie.add("a/b", "k", 0) is True
    assert trie.add("a/b", "k", 2) is False
    assert len(trie) == 1
    assert trie.match("a/b") == {"k": 2}
    assert trie.add("a/b", "k", 1) is False
    assert trie.match("a/b") == {"k": 1}
    assert len(trie) == 1


def test_unsubscribe_one_of_two_overlapping_filters() -> None:
    trie = SubscriptionTrie()
    trie.add("a/+", "k", 1)
    trie.add("a/b", "k", 2)
    assert trie.remove("a/b", "k") is True
    assert trie.match("a/b") == {"k": 1}
    assert len(trie) == 1
    assert trie.remove("a/b", "k") is False
    assert trie.remove("a/+", "k") is True
    assert trie.match("a/b") == {}
    assert len(trie) == 0


def test_remove_leaves_other_keys_and_filters() -> None:
    trie = SubscriptionTrie()
    trie.add("a/b", "k1", 0)
    trie.add("a/b", "k2", 1)
    trie.add("a/b/c", "k1", 2)
    assert trie.remove("a/b", "k1")
    assert trie.match("a/b") == {"k2": 1}
    assert trie.match("a/b/c") == {"k1": 2}
    assert trie.remove("a/b", "k2")
    assert trie.match("a/b") == {}
    assert trie.match("a/b/c") == {"k1": 2}  # the node under the emptied one survives


def test_remove_missing() -> None:
    trie = SubscriptionTrie()
    assert trie.remove("a", "k") is False
    trie.add("a/b", "k", 1)
    assert trie.remove("a", "k") is False  # an interior node, no subscription there
    assert trie.remove("a/b/c", "k") is False  # below a leaf
    assert trie.remove("a/b", "other") is False
    assert trie.remove("x/y", "k") is False
    assert len(trie) == 1
    assert trie.node_count() == 3


def test_pruning() -> None:
    trie = SubscriptionTrie()
    filters = ["a/b/c", "a/b", "a/+/c", "a/#", "#", "+", "/x", "a//b", "$SYS/#", "a/b/c/d/e/f"]
    for i, f in enumerate(filters):
        trie.add(f, "k", i % 3)
        trie.add(f, "j", 1)
    assert trie.node_count() > 1
    for f in filters:
        assert trie.remove(f, "k")
    assert trie.node_count() > 1
    for f in reversed(filters):
        assert trie.remove(f, "j")
    assert len(trie) == 0
    assert trie.node_count() == 1
    assert trie.match("a/b/c") == {}


def test_partial_pruning_keeps_shared_prefix() -> None:
    trie = SubscriptionTrie()
    trie.add("a/b/c/d", "k", 0)
    trie.add("a/x", "k", 0)
    assert trie.node_count() == 1 + 5  # root, a, b, c, d, x
    trie.remove("a/b/c/d", "k")
    assert trie.node_count() == 1 + 2  # root, a, x
    assert trie.match("a/x") == {"k": 0}


def test_churn_does_not_grow() -> None:
    trie = SubscriptionTrie()
    trie.add("keep/this", "k", 0)
    base = trie.node_count()
    for i in range(500):
        trie.add(f"clients/{i}/cmd/#", i, 1)
        trie.add(f"clients/{i}/+", i, 0)
        trie.remove(f"clients/{i}/cmd/#", i)
        trie.remove(f"clients/{i}/+", i)
    assert trie.node_count() == base
    assert len(trie) == 1


def test_deep_topic_does_not_recurse() -> None:
    trie = SubscriptionTrie()
    deep = "/".join(["x"] * 5000)
    trie.add("#", "all", 0)
    trie.add(deep, "exact", 1)
    trie.add("x/+/#", "wild", 2)
    assert trie.match(deep) == {"all": 0, "exact": 1, "wild": 2}
    slashes = "/" * 5000
    assert trie.match(slashes) == {"all": 0}
    assert trie.remove(deep, "exact")
    assert trie.node_count() == 1 + 1 + 3  # root, "#", x, +, #


def test_many_subscriptions() -> None:
    trie = SubscriptionTrie()
    for i in range(2000):
        trie.add(f"devices/{i}/cmd", i, i % 3)
    trie.add("devices/+/cmd", "monitor", 0)
    trie.add("devices/#", "archive", 2)
    assert len(trie) == 2002
    assert trie.match("devices/1234/cmd") == {1234: 1, "monitor": 0, "archive": 2}
    assert trie.match("devices/99999/cmd") == {"monitor": 0, "archive": 2}


# --- randomized: the trie agrees with brute force over plexmq.mqtt.topics.matches ---------------------------

_FILTER_LEVEL = st.sampled_from(["a", "b", "", "$a", "+", "#"])
_TOPIC_LEVEL = st.sampled_from(["a", "b", "", "$a", "$"])

_filters = st.lists(_FILTER_LEVEL, min_size=1, max_size=4).map("/".join).filter(valid_filter)
_topics = st.lists(_TOPIC_LEVEL, min_size=1, max_size=5).map("/".join)
_keys = st.integers(min_value=0, max_value=3)
_qos = st.integers(min_value=0, max_value=2)
_ops = st.lists(st.tuples(st.booleans(), _filters, _keys, _qos), max_size=40)


def _brute_force(subs: dict[tuple[str, int], int], topic: str) -> dict[int, int]:
    result: dict[int, int] = {}
    for (f, key), qos in subs.items():
        if matches(f, topic) and qos > result.get(key, -1):
            result[key] = qos
    return result


@settings(max_examples=300, deadline=None)
@given(ops=_ops, topics=st.lists(_topics, min_size=1, max_size=10))
def test_random_against_brute_force(ops, topics) -> None:
    trie = SubscriptionTrie()
    model: dict[tuple[str, int], int] = {}
    for is_add, f, key, qos in ops:
        if is_add:
            new = (f, key) not in model
            assert trie.add(f, key, qos) is new
            model[(f, key)] = qos
        else:
            existed = (f, key) in model
            assert trie.remove(f, key) is existed
            model.pop((f, key), None)
        assert len(trie) == len(model)
    for topic in topics:
        assert trie.match(topic) == _brute_force(model, topic)
    for f, key in list(model):
        assert trie.remove(f, key)
    assert len(trie) == 0
    assert trie.node_count() == 1


# --- plexmq/mqtt/topics.py ----------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "topic_filter,valid",
    [
        ("a/+/b", True),
        ("#", True),
        ("+", True),
        ("a/#", True),
        ("+/+", True),
        ("/", True),
        ("a//b", True),
        ("/#", True),
        ("+/#", True),
        ("$SYS/#", True),
        ("a#", False),
        ("a/#/b", False),
        ("#/a", False),
        ("##", False),
        ("a+", False),
        ("a/b+", False),
        ("++", False),
        ("", False),
        ("+a", False),
        ("a\x00b", False),
    ],
)
def test_valid_filter(topic_filter: str, valid: bool) -> None:
    assert valid_filter(topic_filter) is valid


@pytest.mark.parametrize(
    "topic,ok",
    [
        ("a", True),
        ("a/b/c", True),
        ("/", True),
        ("a//b", True),
        ("$SYS/x", True),
        (" ", True),
        ("", False),
        ("a/+", False),
        ("+", False),
        ("a/#", False),
        ("#", False),
        ("a+b", False),
        ("a#b", False),
        ("a\x00b", False),
    ],
)
def test_topic_name_error(topic: str, ok: bool) -> None:
    err = topic_name_error(topic)
    if ok:
        assert err is None
    else:
        assert isinstance(err, str) and err


def test_filters_lists_each_filter_with_its_keys() -> None:
    t = SubscriptionTrie()
    for topic_filter, key in (("a/b", 1), ("a/b", 2), ("a", 3), ("/", 4), ("#", 5), ("a//+", 6)):
        t.add(topic_filter, key, 0)
    t.remove("a", 3)
    assert sorted(t.filters()) == [("#", 1), ("/", 1), ("a//+", 1), ("a/b", 2)]
