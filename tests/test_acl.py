"""The ACL file (`workers.auth.acl`): mosquitto's syntax, who gets which rules, deny winning, patterns that
cannot be abused through a user name or client id, and SUBSCRIBE filters granted when some topic under
them is readable, topics judged at delivery."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plexmq.mqtt.topics import matches
from plexmq.workers.auth import acl as acl_module
from plexmq.workers.auth.acl import AclError, AclFile, covers, may_publish, overlaps


def load(tmp_path: Path, text: str) -> AclFile:
    path = tmp_path / "acl"
    path.write_text(text)
    return AclFile.load(str(path))


EXAMPLE = """\
# anonymous clients
topic read public/#

user alice
topic readwrite alice/#
topic deny alice/secret
topic write shared/in

user bob
topic shared/#

client sensor-7
topic write sensors/7/#

pattern readwrite devices/%u/#
pattern read status/%c
pattern write clients/%c/out
"""


# ------------------------------------------------------------------------------------ who gets which rules


def test_user_rules_apply_to_that_user_only(tmp_path: Path) -> None:
    acl = load(tmp_path, EXAMPLE)
    alice = acl.checker("alice", "a1")
    assert alice.can_read(b"alice/x") and alice.can_write("alice/x/y") and alice.can_write("alice")
    assert alice.can_write("shared/in") and not alice.can_read(b"shared/in")  # write only
    assert not alice.can_read(b"public/news")  # the anonymous rules are not alice's
    bob = acl.checker("bob", "b1")
    assert bob.can_read(b"shared/in") and bob.can_write("shared/x")  # one word: readwrite
    assert not bob.can_read(b"alice/x") and not bob.can_write("alice/x")
    assert not acl.checker("carol", "c1").can_read(b"shared/in")  # not in the file: nothing but patterns


def test_rules_before_any_user_are_for_anonymous_clients(tmp_path: Path) -> None:
    acl = load(tmp_path, EXAMPLE)
    anonymous = acl.checker(None, "anon")
    assert anonymous.can_read(b"public/news") and anonymous.reads_all("public/#")
    assert not anonymous.can_write("public/news")
    assert not anonymous.can_read(b"alice/x")
    assert not acl.checker("", "anon").can_read(b"public/news")  # an empty user name is still a user name


def test_client_blocks_apply_by_client_id(tmp_path: Path) -> None:
    acl = load(tmp_path, EXAMPLE)
    assert acl.checker(None, "sensor-7").can_write("sensors/7/temp")
    assert acl.checker("bob", "sensor-7").can_write("sensors/7/temp")  # with the user's rules
    assert acl.checker("bob", "sensor-7").can_write("shared/x")
    assert not acl.checker("bob", "sensor-8").can_write("sensors/7/temp")
    assert not acl.checker(None, "sensor-7").can_read(b"sensors/7/temp")


def test_nothing_matching_is_denied(tmp_path: Path) -> None:
    acl = load(tmp_path, "user alice\ntopic read a/b\n")
    alice = acl.checker("alice", "c")
    assert alice.can_read(b"a/b")
    assert not alice.can_write("a/b") and not alice.can_read(b"a/c") and not alice.can_read(b"a/b/c")
    empty = load(tmp_path, "# nothing\n")
    assert not empty.checker(None, "c").can_read(b"x") and not empty.checker("u", "c").can_write("x")


def test_dollar_topics_need_a_rule_that_names_them(tmp_path: Path) -> None:
    acl = load(tmp_path, "user admin\ntopic read #\ntopic read $SYS/broker/#\nuser other\ntopic read +/broker/#\n")
    admin = acl.checker("admin", "c")
    assert admin.can_read(b"anything/at/all") and admin.reads_all("#")
    assert admin.can_read(b"$SYS/broker/load") and admin.reads_all("$SYS/broker/#")
    assert not admin.can_read(b"$SYS/other")
    assert not acl.checker("other", "c").can_read(b"$SYS/broker/load")


def test_a_client_publishes_to_sys_only_where_a_write_rule_names_it(tmp_path: Path) -> None:
    assert may_publish(None, "a/b") and may_publish(None, "$app/x")  # no ACL: everything but the below
    assert not may_publish(None, "$SYS/broker/load") and not may_publish(None, "$SYS")
    assert not may_publish(None, "$share/g/t")
    acl = load(tmp_path, "topic readwrite #\ntopic write $app/#\ntopic read $SYS/#\ntopic write $share/#\n")
    checker = acl.checker(None, "c")
    assert may_publish(checker, "a/b") and may_publish(checker, "$app/x")
    assert not may_publish(checker, "$SYS/broker/load")  # `#` does not reach it, and read is not write
    assert not may_publish(checker, "$other/x")  # no rule names it: `#` does not reach a `$` topic
    assert not may_publish(checker, "$share/g/t")  # a name nobody can subscribe to, whatever the ACL says


# ------------------------------------------------------------------------------------ deny wins


def test_deny_wins_over_allow_wherever_it_comes_from(tmp_path: Path) -> None:
    acl = load(tmp_path, EXAMPLE + "pattern deny devices/%u/locked\nclient a1\ntopic deny shared/#\n")
    alice = acl.checker("alice", "a1")
    assert not alice.can_read(b"alice/secret") and not alice.can_write("alice/secret")
    assert alice.can_write("alice/secret/deeper")  # `alice/secret` denies that topic only
    assert not alice.can_write("shared/in")  # a client rule denies what a user rule allows
    assert alice.can_write("devices/alice/open") and not alice.can_write("devices/alice/locked")
    assert acl.checker("alice", "a2").can_write("shared/in")


def test_deny_order_in_the_file_does_not_matter(tmp_path: Path) -> None:
    first = load(tmp_path, "user u\ntopic deny a/b\ntopic readwrite a/#\n").checker("u", "c")
    second = load(tmp_path, "user u\ntopic readwrite a/#\ntopic deny a/b\n").checker("u", "c")
    for checker in (first, second):
        assert not checker.can_write("a/b") and checker.can_write("a/c")


# ------------------------------------------------------------------------------------ patterns


def test_patterns_fill_in_user_name_and_client_id(tmp_path: Path) -> None:
    acl = load(tmp_path, EXAMPLE)
    carol = acl.checker("carol", "phone")
    assert carol.can_write("devices/carol/x") and carol.reads_all("devices/carol/#")
    assert not carol.can_write("devices/dave/x") and not carol.reads_all("devices/+/x") and carol.can_subscribe("devices/+/x")
    assert carol.can_read(b"status/phone") and not carol.can_write("status/phone")
    assert carol.can_write("clients/phone/out") and not carol.can_write("clients/tablet/out")


def test_patterns_with_user_name_skip_anonymous_clients(tmp_path: Path) -> None:
    acl = load(tmp_path, EXAMPLE)
    anonymous = acl.checker(None, "phone")
    assert not anonymous.can_write("devices//x") and not anonymous.can_write("devices/None/x")
    assert anonymous.can_read(b"status/phone")  # %c still applies


@pytest.mark.parametrize("username, client_id", [
    ("+", "c"), ("#", "c"), ("a/b", "c"), ("u", "+"), ("u", "#"), ("u", "x/y"),
])
def test_wildcards_in_names_cannot_reach_other_clients(tmp_path: Path, username: str, client_id: str) -> None:
    acl = load(tmp_path, "pattern readwrite devices/%u/#\npattern readwrite clients/%c/#\n")
    checker = acl.checker(username, client_id)
    for topic in ("devices/a/b/x", "devices/other/x", "clients/x/y/z", "clients/other/z"):
        assert not checker.can_write(topic) and not checker.can_read(topic.encode()), topic
    assert not checker.reads_all("devices/#") and not checker.reads_all("clients/#")
    safe = "devices/u/x" if username == "u" else "clients/c/x"  # the other placeholder still works
    assert checker.can_write(safe)


def test_a_deny_pattern_still_denies_for_wildcard_names(tmp_path: Path) -> None:
    acl = load(tmp_path, "topic readwrite open/#\nuser +\ntopic readwrite open/#\npattern deny open/%u\n")
    checker = acl.checker("+", "c")
    assert not checker.can_write("open/x")  # filled in as it is, the deny widens: fail closed
    assert acl.checker(None, "c").can_write("open/x")


def test_placeholders_are_filled_in_one_pass(tmp_path: Path) -> None:
    acl = load(tmp_path, "pattern readwrite devices/%u/#\n")
    checker = acl.checker("%c", "bob")  # must not become devices/bob/#
    assert not checker.can_write("devices/bob/x")
    assert checker.can_write("devices/%c/x")
    partial = load(tmp_path, "pattern read in/%u-%c\n").checker("u", "c")
    assert partial.can_read(b"in/u-c") and not partial.can_read(b"in/u-d")


# ------------------------------------------------------------------------------------ subscriptions


def test_a_filter_needs_no_check_per_message_when_read_rules_cover_it(tmp_path: Path) -> None:
    acl = load(tmp_path, "user u\ntopic read a/#\ntopic read b/+\ntopic read c/+/d\n")
    checker = acl.checker("u", "c")
    for whole in ("a/#", "a", "a/b/+", "a/+/#", "a/b/c", "b/+", "b/x", "c/+/d", "c/x/d"):
        assert checker.reads_all(whole) and checker.can_subscribe(whole), whole
    for partly in ("#", "+/b", "+/#", "b/#", "c/+/+", "c/#"):  # some topic under them is readable
        assert not checker.reads_all(partly) and checker.can_subscribe(partly), partly
    for refused in ("b", "b/x/y", "b/+/+", "c/x/y", "x/#", "$SYS/#"):  # none is
        assert not checker.can_subscribe(refused), refused


def test_everything_except_a_denied_topic(tmp_path: Path) -> None:
    """The commonest ACL: `#` is granted, and only the denied topic is withheld at delivery."""
    checker = load(tmp_path, "topic readwrite #\ntopic deny test/nosubscribe\n").checker(None, "c")
    for granted in ("#", "+/+", "test/#", "test/+"):
        assert checker.can_subscribe(granted) and not checker.reads_all(granted), granted
    assert checker.reads_all("other/#") and checker.reads_all("test/nosubscribe/deeper")
    assert not checker.can_subscribe("test/nosubscribe")
    assert not checker.can_read(b"test/nosubscribe") and checker.can_read(b"test/other")


def test_a_deny_refuses_only_filters_it_covers_whole(tmp_path: Path) -> None:
    acl = load(tmp_path, "user u\ntopic read a/#\ntopic deny a/secret\ntopic deny a/+/private\ntopic deny b/+\n"
                         "topic read b/x\n")
    checker = acl.checker("u", "c")
    for refused in ("a/secret", "a/+/private", "a/x/private", "b/x", "b/+"):
        assert not checker.can_subscribe(refused), refused
    for partly in ("a/#", "a/+", "a/x/+", "a/+/#"):
        assert checker.can_subscribe(partly) and not checker.reads_all(partly), partly
    for whole in ("a/public", "a/secret/x", "a/x/public", "a/+/public", "a/x/private/more", "a"):
        assert checker.reads_all(whole), whole
    assert not checker.can_read(b"a/secret") and not checker.can_read(b"a/x/private") and checker.can_read(b"a/x")


def test_answers_are_cached_in_a_bounded_dict(tmp_path: Path) -> None:
    checker = load(tmp_path, "topic readwrite a/#\n").checker(None, "c")
    for i in range(acl_module.CACHE_SIZE * 3):
        assert checker.can_read(f"a/{i}".encode()) and checker.can_write(f"a/{i}")
        assert not checker.can_write(f"b/{i}")
    assert len(checker._read_cache or {}) == acl_module.CACHE_SIZE * 3  # up to DELIVERY_CACHE_SIZE
    assert len(checker._write_cache or {}) == acl_module.CACHE_SIZE
    assert checker.can_read(b"a/0") and not checker.can_write("b/0")  # evicted, asked again


def test_connections_without_patterns_share_the_rule_tuples(tmp_path: Path) -> None:
    acl = load(tmp_path, "user u\ntopic read a/#\n")
    one, two = acl.checker("u", "c1"), acl.checker("u", "c2")
    assert one.read is two.read and one.read == ("a/#",)


# ------------------------------------------------------------------------------------ the file


def test_syntax_mosquitto_accepts(tmp_path: Path) -> None:
    acl = load(tmp_path, "  # indented comment\n\nuser  alice smith \ntopic\tread\tspaced name/#\ntopic  deny  x\r\n")
    checker = acl.checker("alice smith", "c")
    assert checker.can_read(b"spaced name/x") and not checker.can_write("spaced name/x")
    assert not checker.can_read(b"x")


@pytest.mark.parametrize("line, reason", [
    ("bogus a/b", "unknown keyword 'bogus'"),
    ("topic", "topic without a topic filter"),
    ("pattern", "pattern without a topic filter"),
    ("topic readonly a/b", "unknown access 'readonly'"),
    ("topic read a/#/b", "invalid topic filter 'a/#/b'"),
    ("topic read a+/b", "invalid topic filter 'a+/b'"),
    ("pattern read %u#", "invalid topic filter '%u#'"),
    ("user", "user without a name"),
    ("client   ", "client without a name"),
])
def test_malformed_lines_name_file_and_line(tmp_path: Path, line: str, reason: str) -> None:
    path = tmp_path / "acl"
    path.write_text(f"# header\nuser ok\n{line}\n")
    with pytest.raises(AclError) as info:
        AclFile.load(str(path))
    assert str(info.value) == f"{path}:3: {reason}" or str(info.value).startswith(f"{path}:3: {reason} ")
    assert isinstance(info.value, ValueError)


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(AclError, match="No such file"):
        AclFile.load(str(tmp_path / "missing"))
    path = tmp_path / "acl"
    path.write_bytes(b"user \xff\n")
    with pytest.raises(AclError, match=f"^{path}:1: not UTF-8$"):
        AclFile.load(str(path))


# ------------------------------------------------------------------------------------ covers and overlaps

LEVEL = st.sampled_from(["a", "b", "", "$x"])
FILTER_LEVEL = st.sampled_from(["a", "b", "", "$x", "+"])


@st.composite
def topic_filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(FILTER_LEVEL, min_size=1, max_size=4))
    if draw(st.booleans()):
        levels.append("#")
    return "/".join(levels)


topics = st.lists(LEVEL, min_size=1, max_size=5).map("/".join)


@given(topic_filters(), topics)
def test_on_topic_names_covers_and_overlaps_are_matches(rule: str, topic: str) -> None:
    assert covers(rule, topic) == matches(rule, topic)
    assert overlaps(rule, topic) == overlaps(topic, rule) == matches(rule, topic)


@given(topic_filters(), topic_filters(), st.data())
def test_covers_and_overlaps_agree_with_the_topics_a_filter_matches(a: str, b: str, data: st.DataObject) -> None:
    assert covers(a, a) and overlaps(a, b) == overlaps(b, a)
    for _ in range(10):  # topics that b matches, made from b
        levels: list[str] = []
        for level in b.split("/"):
            if level == "#":
                levels += data.draw(st.lists(LEVEL, max_size=2))
            else:
                levels.append(data.draw(LEVEL) if level == "+" else level)
        topic = "/".join(levels)
        if topic and matches(b, topic):
            if covers(a, b):
                assert matches(a, topic)
            if matches(a, topic):
                assert overlaps(a, b)
