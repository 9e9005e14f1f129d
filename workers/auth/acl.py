"""The ACL file: who may publish to and subscribe to which topics, in mosquitto's syntax.

    # comment
    topic read public/#              before any `user` line: rules for clients without a user name
    user alice                       the `topic` lines that follow are alice's
    topic readwrite alice/#
    topic deny alice/secret
    client sensor-7                  the `topic` lines that follow are for this client id
    topic write sensors/7/#
    pattern readwrite devices/%u/#   anywhere: for everyone, %u the user name, %c the client id

A `topic` or `pattern` line without an access (`topic a/b`) means readwrite; a filter with spaces
needs the access spelled out. A connection gets its user's (or the anonymous) rules, its client
id's rules and every pattern. A deny rule that matches wins over any allow; nothing matching is a
deny, as in mosquitto with an ACL file.

Patterns must not let a client name its way into another's topics: an allow pattern whose %u or %c
value contains `+`, `#` or `/` matches nothing, and patterns with %u do not apply to a client that
has no user name. A deny pattern is filled in as it is (a wildcard only widens what it denies).

Read access is judged for every message delivered (workers/worker.py: `Worker._withheld`), as
mosquitto does, so a SUBSCRIBE is granted when the user may read some topic under its filter
(`can_subscribe`: `#` with one topic denied is the commonest ACL) and only what it may read arrives
(`can_read`). A subscription that one read rule covers whole and no deny rule can touch
(`reads_all`) needs no check per message; the connection decides that at SUBSCRIBE and whenever its
rules change (`Connection.judge_reads`).

The same rules can live in a database table instead (workers.auth.database): one row per `topic` or
`pattern` line, read through AclBuilder, so both sources mean exactly the same.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from plexmq.mqtt.topics import SHARED_PREFIX, matches, valid_filter

READ, WRITE = 1, 2
ACCESS = {"read": READ, "write": WRITE, "readwrite": READ | WRITE, "deny": 0}
KINDS = ("anonymous", "user", "client", "pattern")  # whose rule it is: a table row's `kind`
CACHE_SIZE = 64  # answers remembered per connection and direction; the oldest goes first
DELIVERY_CACHE_SIZE = 1024  # topics delivered to a checked connection: a subscriber of many topics

_PLACEHOLDER = re.compile(r"%[uc]")
_UNSAFE = ("+", "#", "/")


class AclError(ValueError):
    """One line that says what is wrong and where: `file:line: reason`."""


def covers(rule: str, topic_filter: str) -> bool:
    """True when every topic that `topic_filter` matches is also matched by `rule` (both valid filters)."""
    r_levels = rule.split("/")
    f_levels = topic_filter.split("/")
    if r_levels[0] in ("+", "#") and f_levels[0].startswith("$"):  # wildcards do not reach $ topics
        return False
    for i, r in enumerate(r_levels):
        if r == "#":
            return True
        if i >= len(f_levels) or f_levels[i] == "#":
            return False
        if r != "+" and r != f_levels[i]:
            return False
    return len(r_levels) == len(f_levels)


def meet(a: str, b: str) -> str:
    """The filter of the topics both overlapping valid filters match (`a/+` and `+/b`: `a/b`)."""
    a_levels = a.split("/")
    b_levels = b.split("/")
    levels: list[str] = []
    for i, x in enumerate(a_levels):
        if x == "#":
            return "/".join(levels + b_levels[i:])
        y = b_levels[i]
        if y == "#":
            return "/".join(levels + a_levels[i:])
        levels.append(y if x == "+" else x)
    return "/".join(levels)


def overlaps(a: str, b: str) -> bool:
    """True when some topic is matched by both valid filters."""
    a_levels = a.split("/")
    b_levels = b.split("/")
    a0, b0 = a_levels[0], b_levels[0]
    if a0 in ("+", "#") and b0.startswith("$") or b0 in ("+", "#") and a0.startswith("$"):
        return False
    for i in range(max(len(a_levels), len(b_levels))):
        x = a_levels[i] if i < len(a_levels) else None
        y = b_levels[i] if i < len(b_levels) else None
        if x == "#" or y == "#":
            return True
        if x is None or y is None:
            return False
        if x != y and x != "+" and y != "+":
            return False
    return True


# a block's rules by what they do: (deny, read, write) filters
Rules = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]
NO_RULES: Rules = ((), (), ())


@dataclass(slots=True)
class _Block:
    """A block's rules while the file is read."""

    deny: list[str] = field(default_factory=list)
    read: list[str] = field(default_factory=list)
    write: list[str] = field(default_factory=list)

    def add(self, access: int, topic_filter: str) -> None:
        if not access:
            self.deny.append(topic_filter)
        if access & READ:
            self.read.append(topic_filter)
        if access & WRITE:
            self.write.append(topic_filter)

    def rules(self) -> Rules:
        return tuple(self.deny), tuple(self.read), tuple(self.write)


class Checker:
    """One connection's rules and the answers it has already given (a few dict lookups per packet).

    The rule tuples are shared between connections where they can be, and the caches are made on
    first use, so an idle connection pays little for its checker.
    """

    __slots__ = ("deny", "read", "write", "_subscribe_cache", "_read_cache", "_write_cache")

    def __init__(self, rules: Rules) -> None:
        self.deny, self.read, self.write = rules
        self._subscribe_cache: dict[str, bool] | None = None
        self._read_cache: dict[bytes, bool] | None = None
        self._write_cache: dict[str, bool] | None = None

    def can_subscribe(self, topic_filter: str) -> bool:
        """May the client subscribe to this filter: is some topic under it readable? (What it may
        not read is withheld at delivery.) A read rule's part of the filter that one deny rule
        covers whole gives nothing."""
        cache = self._subscribe_cache
        if cache is None:
            cache = self._subscribe_cache = {}
        allowed = cache.get(topic_filter)
        if allowed is None:
            allowed = any(overlaps(rule, topic_filter) and not self._denied(meet(rule, topic_filter))
                          for rule in self.read)
            _remember(cache, topic_filter, allowed, CACHE_SIZE)
        return allowed

    def reads_all(self, topic_filter: str) -> bool:
        """Is every topic under this filter readable, whatever its name? Then what the
        subscription brings needs no check per message."""
        return (not any(overlaps(rule, topic_filter) for rule in self.deny)
                and any(covers(rule, topic_filter) for rule in self.read))

    def can_read(self, topic: bytes) -> bool:
        """May a message to this topic name be delivered to the client?"""
        cache = self._read_cache
        if cache is None:
            cache = self._read_cache = {}
        allowed = cache.get(topic)
        if allowed is None:
            name = topic.decode()
            allowed = (not any(matches(rule, name) for rule in self.deny)
                       and any(matches(rule, name) for rule in self.read))
            _remember(cache, topic, allowed, DELIVERY_CACHE_SIZE)
        return allowed

    def can_write(self, topic: str) -> bool:
        """May the client publish to this topic name?"""
        cache = self._write_cache
        if cache is None:
            cache = self._write_cache = {}
        allowed = cache.get(topic)
        if allowed is None:
            allowed = (not any(matches(rule, topic) for rule in self.deny)
                       and any(matches(rule, topic) for rule in self.write))
            _remember(cache, topic, allowed, CACHE_SIZE)
        return allowed

    def _denied(self, topic_filter: str) -> bool:
        """Does one deny rule reach every topic of this filter?"""
        return any(covers(rule, topic_filter) for rule in self.deny)


def may_publish(checker: Checker | None, topic: str) -> bool:
    """May a client publish to (or leave its will on) this topic name; `checker` None: no ACL.

    `$SYS` is the broker's: a client writes there only where a write rule of its ACL names it (a rule
    starting with `$`: wildcards never reach `$` topics [MQTT-4.7.2-1]), so that without an ACL nobody
    can spoof it. Another `$` topic is any client's, as in mosquitto (Paho's interoperability suite
    publishes to one), though `#` in an ACL does not reach it either. A `$share/` name reaches
    nobody whatever the ACL says (a filter so named is a shared subscription [MQTT-4.8.2-1])."""
    if topic[:1] == "$":
        if topic.startswith(SHARED_PREFIX):
            return False
        if topic == "$SYS" or topic.startswith("$SYS/"):
            return checker is not None and checker.can_write(topic)
    return checker is None or checker.can_write(topic)


def _remember(cache: dict, key: str | bytes, allowed: bool, size: int) -> None:
    if len(cache) >= size:
        del cache[next(iter(cache))]
    cache[key] = allowed


def _join(a: Rules, b: Rules) -> Rules:
    return a[0] + b[0], a[1] + b[1], a[2] + b[2]  # adding () returns the other tuple itself


class AclBuilder:
    """The rules of an ACL file or table while they are read: one `add` per `topic` or `pattern` line,
    or per table row (the file's blocks are the table's `kind` and `name` columns)."""

    __slots__ = ("anonymous", "users", "clients", "patterns")

    def __init__(self) -> None:
        self.anonymous = _Block()
        self.users: dict[str, _Block] = {}
        self.clients: dict[str, _Block] = {}
        self.patterns: list[tuple[int, str, frozenset[str]]] = []

    def add(self, kind: str, name: str, access_name: str, topic_filter: str) -> None:
        """One rule of `kind` anonymous, user or client (`name` says which one) or pattern; a
        ValueError says what is wrong with it."""
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r} (anonymous, user, client or pattern)")
        if bool(name) != (kind in ("user", "client")):
            raise ValueError(f"{kind} without a name" if not name else f"{kind} rule with a name ({name!r})")
        if access_name not in ACCESS:
            raise ValueError(f"unknown access {access_name!r} (read, write, readwrite or deny)")
        checked = _PLACEHOLDER.sub("x", topic_filter) if kind == "pattern" else topic_filter
        if not valid_filter(checked):
            raise ValueError(f"invalid topic filter {topic_filter!r}")
        access = ACCESS[access_name]
        if kind == "pattern":
            self.patterns.append((access, topic_filter, frozenset(_PLACEHOLDER.findall(topic_filter))))
        elif kind == "anonymous":
            self.anonymous.add(access, topic_filter)
        else:
            (self.users if kind == "user" else self.clients).setdefault(name, _Block()).add(access, topic_filter)

    def build(self, source: str) -> AclFile:
        return AclFile(source, self.anonymous.rules(), {name: b.rules() for name, b in self.users.items()},
                       {name: b.rules() for name, b in self.clients.items()}, self.patterns)


class AclFile:
    """The parsed rules of one ACL file (or table: `path` names it); `load` again (on SIGHUP) and
    hand out new checkers."""

    __slots__ = ("path", "anonymous", "users", "clients", "patterns")

    def __init__(self, path: str, anonymous: Rules, users: dict[str, Rules], clients: dict[str, Rules],
                 patterns: list[tuple[int, str, frozenset[str]]]) -> None:
        self.path = path
        self.anonymous = anonymous
        self.users = users
        self.clients = clients
        self.patterns = patterns  # (access, filter with %u and %c, the placeholders it uses)

    def same_rules(self, other: AclFile) -> bool:
        """Whether both give every connection the same rules (a table read again, unchanged)."""
        return (self.anonymous, self.users, self.clients, self.patterns) == (
            other.anonymous, other.users, other.clients, other.patterns)

    @classmethod
    def load(cls, path: str) -> AclFile:
        """Read and check every line; AclError (`file:line: reason`) for the first bad one."""
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as exc:
            raise AclError(f"{path}: {exc.strerror}") from None
        rules = AclBuilder()
        kind, name = "anonymous", ""  # whose `topic` lines come next
        for number, data in enumerate(raw.splitlines(), 1):
            try:
                words = data.decode().split(None, 1)
                if not words or words[0].startswith("#"):
                    continue
                keyword, rest = words[0], words[1].strip() if len(words) > 1 else ""
                if keyword in ("user", "client"):
                    if not rest:
                        raise ValueError(f"{keyword} without a name")
                    kind, name = keyword, rest
                elif keyword == "topic":
                    rules.add(kind, name, *_access_and_filter(keyword, rest))
                elif keyword == "pattern":
                    rules.add("pattern", "", *_access_and_filter(keyword, rest))
                else:
                    raise ValueError(f"unknown keyword {keyword!r} (user, client, topic or pattern)")
            except UnicodeDecodeError:
                raise AclError(f"{path}:{number}: not UTF-8") from None
            except ValueError as exc:
                raise AclError(f"{path}:{number}: {exc}") from None
        return rules.build(path)

    def checker(self, username: str | None, client_id: str) -> Checker:
        """The rules for one connection: its user's (or the anonymous ones), its client id's, the patterns."""
        rules = self.anonymous if username is None else self.users.get(username, NO_RULES)
        rules = _join(rules, self.clients.get(client_id, NO_RULES))
        if self.patterns:
            rules = _join(rules, self._patterns(username, client_id))
        return Checker(rules)

    def _patterns(self, username: str | None, client_id: str) -> Rules:
        block = _Block()
        values = {"%u": username or "", "%c": client_id}
        unsafe = {key for key, value in values.items() if any(c in value for c in _UNSAFE)}
        for access, pattern, used in self.patterns:
            if username is None and "%u" in used:
                continue
            if access and used & unsafe:
                continue  # an allow rule must not reach another client's topics
            # one pass, so a user name containing "%c" is not filled in again
            block.add(access, _PLACEHOLDER.sub(lambda m: values[m.group()], pattern))
        return block.rules()


def _access_and_filter(keyword: str, rest: str) -> tuple[str, str]:
    """The access and filter of a `topic` or `pattern` line; mosquitto reads one word as a readwrite filter."""
    words = rest.split(None, 1)
    if not words:
        raise ValueError(f"{keyword} without a topic filter")
    return ("readwrite", words[0]) if len(words) == 1 else (words[0], words[1].strip())
