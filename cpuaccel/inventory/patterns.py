"""Ansible's host ranges (``node[01:16]``) and host patterns (``--limit web:&rack1:!node3``).

Kept apart from the inventory loader: both are small languages of their own, and the
loader only needs their results.
"""

from __future__ import annotations

import fnmatch
import re
import string
from collections.abc import Callable, Mapping, Sequence

from cpuaccel import userregex
from cpuaccel.errors import InventoryError

_RANGE_HINT = "write a range as [START:END] or [START:END:STEP], e.g. node[01:16] or rack[a:d]"

# A whole key in brackets with "::" or several colons is an IPv6 address, not a range.
_IPV6_KEY = re.compile(r"^\[([0-9A-Fa-f:.]+)\](?::(\d+))?$")
# "name:port", where colons inside a range's brackets do not count.
_HOST_PORT_KEY = re.compile(r"^((?:[^:\[\]]|\[[^\[\]]*\])+):(\d+)$")
_BRACKETS = re.compile(r"\[([^\[\]]*)\]")
# Names one host key may stand for: a typo such as node[1:99999999] must be an error, not
# a hundred million hosts built in memory (Ansible has no bound and hangs).
MAX_RANGE_HOSTS = 10_000


def parse_host_key(key: str) -> tuple[list[str], int | None]:
    """The host names a key of ``hosts:`` stands for, and the port it names, if any.

    Ansible's YAML inventory accepts ``name:port`` and ``[ipv6]:port`` keys; honouring
    them keeps existing inventories working.
    """
    ipv6 = _IPV6_KEY.match(key)
    if ipv6 and ("::" in ipv6.group(1) or ipv6.group(1).count(":") >= 3):
        port = ipv6.group(2)
        return [ipv6.group(1)], int(port) if port else None
    with_port = _HOST_PORT_KEY.match(key)
    if with_port:
        return expand_host_pattern(with_port.group(1)), int(with_port.group(2))
    return expand_host_pattern(key), None


def expand_host_pattern(pattern: str) -> list[str]:
    """Expand Ansible's host ranges: ``node[01:03]`` -> node01, node02, node03.

    Zero padding of the start is kept, ``[1:10:2]`` takes a stride, ``[a:c]`` counts
    letters, and several ranges in one name multiply out, first range outermost.
    Raises InventoryError (without a source: the caller knows the file and line).
    """
    if "[" not in pattern and "]" not in pattern:
        return [pattern]
    found = _BRACKETS.search(pattern)
    head = pattern[: found.start()] if found else pattern
    if found is None or "[" in head or "]" in head:
        raise InventoryError(
            f"malformed host range in {pattern!r}: unbalanced '[' or ']'", hint=_RANGE_HINT
        )
    values = _range_values(found.group(1), pattern)
    tails = expand_host_pattern(pattern[found.end() :])
    if len(values) * len(tails) > MAX_RANGE_HOSTS:
        raise _too_many(pattern, len(values) * len(tails))
    return [head + value + tail for value in values for tail in tails]


def _too_many(pattern: str, count: int) -> InventoryError:
    return InventoryError(
        f"host range {pattern!r} expands to {count:,} names, more than {MAX_RANGE_HOSTS:,}",
        hint="check the bounds of the range: one key stands for at most "
        f"{MAX_RANGE_HOSTS:,} hosts; split a larger cluster into several keys",
    )


def _range_values(body: str, pattern: str) -> list[str]:
    bounds = body.split(":")
    if len(bounds) not in (2, 3):
        raise InventoryError(f"malformed host range [{body}] in {pattern!r}", hint=_RANGE_HINT)
    start, end = bounds[0] or "0", bounds[1]
    step_text = bounds[2] if len(bounds) == 3 else "1"
    if not step_text.isdigit() or int(step_text) == 0:
        raise InventoryError(
            f"malformed host range [{body}] in {pattern!r}: the step must be a positive integer",
            hint=_RANGE_HINT,
        )
    step = int(step_text)
    empty = InventoryError(
        f"empty host range [{body}] in {pattern!r}: {start} comes after {end}",
        hint=f"put the smaller bound first: [{end}:{start}{':' + step_text if step > 1 else ''}]",
    )
    if start.isdigit() and end.isdigit():
        if int(start) > int(end):
            raise empty
        width = len(start) if start.startswith("0") and len(start) > 1 else 0
        if width and len(end) != width:
            raise InventoryError(
                f"malformed host range [{body}] in {pattern!r}: a zero-padded start needs an "
                "end of the same width",
                hint=f"pad both bounds to one width, e.g. [{start}:{end.zfill(width)}]",
            )
        numbers = range(int(start), int(end) + 1, step)
        if len(numbers) > MAX_RANGE_HOSTS:
            raise _too_many(pattern, len(numbers))
        return [str(n).zfill(width) for n in numbers]
    letters = string.ascii_letters
    if len(start) == 1 and len(end) == 1 and start in letters and end in letters:
        if letters.index(start) > letters.index(end):
            raise empty
        return list(letters[letters.index(start) : letters.index(end) + 1 : step])
    raise InventoryError(
        f"malformed host range [{body}] in {pattern!r}: bounds must be two numbers or two letters",
        hint=_RANGE_HINT,
    )


# ---------------------------------------------------------------- host patterns
# The rules are those of Ansible's InventoryManager (lib/ansible/inventory/manager.py),
# so that a pattern selects here the hosts it selects in Ansible:
#
# - A pattern holding a comma is split on commas alone (``web:!db,x`` is the two terms
#   ``web:!db`` and ``x``). One without is kept whole when it reads as one address (an
#   IPv6 address, ``name:port``, a name with ``[1:3]`` ranges), else split on colons and
#   whitespace outside brackets.
# - Plain terms are united first, then ``&`` terms intersect and ``!`` terms exclude,
#   whatever the order written; with no plain term the pattern starts from ``all``.
# - A term that is a host's name is that host. Else it is a glob (``fnmatch``, with
#   ``*``, ``?`` and ``[...]``), or a regular expression after ``~`` (``re.match``:
#   anchored at the start), matched against the group names, each matching group giving
#   its hosts, and against the host names too when no group matched or the term holds
#   one of ``~ . ? * [``.
# - A term may end in a subscript: ``[i]`` (negative from the end), ``[i:j]`` (both
#   ends included), ``[i:]``; it picks among the term's hosts in their order.
# - The hosts come out in the order the terms gave them, each once. A --limit filters
#   the hosts of ``all``, so that its selection keeps the inventory's order; ``@FILE``
#   in a --limit stands for the file's lines, each one term.
#
# Where Ansible only warns (a term that matches nothing) or goes on without a term (an
# empty group, an empty slice), cpuaccel refuses: a typo must not launch on the wrong
# set of nodes. So are the forms Ansible fails on, drops characters of (a bracket that
# closes nothing) or leaves to templating, each with its own message.

# Ansible's names for this machine, which it adds as an implicit host when asked.
IMPLICIT_LOCALHOST = ("localhost", "127.0.0.1", "::1")
_FORMS_HINT = (
    "use host or group names, globs (node*), ~regex, subscripts (web[0], web[1:3]), "
    "&group to intersect, !group to exclude, @FILE for a file of terms"
)
_SUBSCRIPT_HINT = (
    "subscripts count from 0: web[0] is the group's first host, web[-1] its last, "
    "web[1:3] its hosts 1 to 3 (both included), web[2:] those from 2 on"
)
# Words of a pattern without a comma: runs of characters other than whitespace, ':' and
# brackets, and whole [...] expressions.
_WORD = re.compile(r"(?:[^\s:\[\]]|\[[^\]]*\])+")
# A range in an address: [a:f] or [01:20], with an optional :step.
_RANGE = r"\[(?:[a-z]:[a-z]|[0-9]+:[0-9]+)(?::[0-9]+)?\]"
_LABEL = rf"(?:\w|{_RANGE})(?:[\w-]|{_RANGE})*(?<![_-])"
_ADDRESS_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*", re.IGNORECASE)
_HEX_RANGE = re.compile(r"\[[0-9a-f]+:[0-9a-f]+(?::[0-9]+)?\]", re.IGNORECASE)
_HEX = re.compile(r"[0-9a-f]{1,4}", re.IGNORECASE)
_PORT_BRACKETED = re.compile(r"\[(.+)\]:[0-9]+")
_PORT = re.compile(r"((?:[^:\[\]]|\[[^\]]*\])*):[0-9]+")
# The heads an IPv4 address may follow inside an IPv6 one.
_V4_HEADS = ("::", "::ffff:", "0:0:0:0:0:0:", "0:0:0:0:0:ffff:")
# A term's subscript: [i], [-i], [i:j], [i:] (and the old [i-j]).
_SUBSCRIPT = re.compile(r"(.+)\[(?:(-?[0-9]+)|([0-9]+)([:-])([0-9]*))\]")


def split_host_pattern(pattern: str) -> list[str]:
    """The terms of a host pattern, split as Ansible splits them (see above)."""
    if "," in pattern:
        parts = pattern.split(",")
    elif _one_address(pattern):
        parts = [pattern]
    else:
        parts = _WORD.findall(pattern)
    return [part.strip() for part in parts if part.strip()]


def _terms(pattern: str, what: str, source: str | None) -> list[str]:
    """The terms of a pattern. Refused: ``{{ }}`` (no pattern is templated here), and a
    bracket that opens or closes nothing where colons split (Ansible drops it, and
    reads what is left)."""
    if "{{" in pattern or "{%" in pattern:
        raise InventoryError(
            f"{what}: variables ({{{{ }}}}) in a host pattern are not templated",
            source=source,
            hint="write the group and host names themselves (Ansible templates a pattern "
            "only in a play's hosts:, and never a --limit)",
        )
    if "," not in pattern and not _paired(pattern):
        raise _unpaired(what, source)
    return split_host_pattern(pattern)


def _paired(text: str) -> bool:
    """Whether each '[' is closed by a ']' before the next '[' opens (the brackets of a
    subscript, a glob's class or a range), so that no bracket is read as a literal, and
    the patterns below look at each character a bounded number of times."""
    inside = False
    for char in text:
        if char == "[":
            if inside:
                return False
            inside = True
        elif char == "]":
            if not inside:
                return False
            inside = False
    return not inside


def _unpaired(what: str, source: str | None) -> InventoryError:
    return InventoryError(
        f"{what}: a '[' or ']' that opens or closes nothing",
        source=source,
        hint="a '[' opens a subscript (web[0]) or a glob's class (node0[!1]) and needs "
        "its ']'; a regular expression is kept whole, brackets and ':' included, in a "
        "pattern holding a comma: end it with one ('~node0[1-3](a|b),')",
    )


def _one_address(text: str) -> bool:
    """Whether ``text`` reads as one host address, ranges allowed: a name or IPv4
    address with an optional :port, an IPv6 address, or either in brackets with a
    :port. Such a pattern is one term, its colons not separators."""
    if not _paired(text):
        return False  # no form of an address holds such brackets
    for with_port in (_PORT_BRACKETED, _PORT):
        found = with_port.fullmatch(text)
        if found:
            text = found.group(1)
    return _ADDRESS_NAME.fullmatch(text) is not None or _ipv6(text)


def _ipv6(text: str) -> bool:
    # A range stands for one group of hex digits: "fffe" is one, and none of the
    # literal groups ("0", "ffff") of the IPv4 forms below.
    text = _HEX_RANGE.sub("fffe", text)
    if "." in text:
        head, _, v4 = text.rpartition(":")
        groups = v4.split(".")
        return (
            len(groups) == 4
            and all(_HEX.fullmatch(g) for g in groups)
            and (head + ":").lower() in _V4_HEADS
        )
    if "::" in text:
        left, _, right = text.partition("::")
        before, after = left.split(":") if left else [], right.split(":") if right else []
        if not all(_HEX.fullmatch(g) for g in before + after):
            return False
        if before and after:
            return len(before) + len(after) <= 7
        return len(before) <= 6 and len(after) <= 6
    groups = text.split(":")
    return len(groups) == 8 and all(_HEX.fullmatch(g) for g in groups)


def order_patterns(terms: Sequence[str]) -> list[str]:
    """Plain terms first (``all`` when there is none), then ``&`` terms, then ``!``."""
    plain = [t for t in terms if t and t[0] not in "&!"]
    return (
        (plain or ["all"])
        + [t for t in terms if t and t[0] == "&"]
        + [t for t in terms if t and t[0] == "!"]
    )


def _split_subscript(term: str) -> tuple[str, tuple[int, int | None] | None]:
    """A term without its subscript, and the subscript as (start, end): end None for
    one host, -1 for "to the last". A regular expression has none."""
    found = None if term.startswith("~") else _SUBSCRIPT.fullmatch(term)
    if found is None:
        return term, None
    expr, index, start, _, end = found.groups()
    if index is not None:
        return expr, (_number(index), None)
    return expr, (_number(start), _number(end) if end else -1)


def _number(digits: str) -> int:
    # Past 18 digits no list is that long: the same slice or IndexError, and no
    # conversion of thousands of digits.
    if len(digits.lstrip("-")) > 18:
        return -(10**18) if digits.startswith("-") else 10**18
    return int(digits)


def _apply_subscript(hosts: list[str], subscript: tuple[int, int | None]) -> list[str]:
    """Ansible's reading: [i:j] includes j; an end of 0 (as [2:0]) is read as [i]."""
    start, end = subscript
    if end:
        return hosts[start : (len(hosts) - 1 if end == -1 else end) + 1]
    return [hosts[start]]


class _Patterns:
    """One inventory's hosts and groups, matched against the terms of one pattern."""

    def __init__(
        self,
        what: str,
        host_names: Sequence[str],
        group_hosts: Mapping[str, Sequence[str]],
        source: str | None,
        hostnames: Callable[[], Mapping[str, Sequence[str]]] | None,
    ) -> None:
        self.what = what
        self.host_names = list(host_names)
        self.known = set(host_names)
        self.group_hosts = group_hosts
        self.source = source
        self.hostnames = hostnames
        self._matched: dict[str, list[str]] = {}

    def error(self, message: str, hint: str) -> InventoryError:
        return InventoryError(f"{self.what}: {message}", source=self.source, hint=hint)

    def evaluate(self, terms: Sequence[str]) -> list[str]:
        """The hosts ``terms`` select, in Ansible's order for them."""
        chosen: list[str] = []
        for term in order_patterns(terms):
            if term in self.known:
                chosen.append(term)
                continue
            matched = self.match(term)
            if term[0] == "!":
                dropped = set(matched)
                chosen = [name for name in chosen if name not in dropped]
            elif term[0] == "&":
                kept = set(matched)
                chosen = [name for name in chosen if name in kept]
            else:
                chosen += matched
        return list(dict.fromkeys(chosen))

    def match(self, term: str) -> list[str]:
        """The hosts one term stands for, its ``&`` or ``!`` aside."""
        body = term[1:] if term[0] in "&!" else term
        if body not in self._matched:
            self._matched[body] = self._match(body)
        return self._matched[body]

    def _match(self, body: str) -> list[str]:
        if not body:
            raise self.error(
                "'&' or '!' stands alone: it names no host or group",
                "write the group or host right after it, e.g. web:!atlanta or web:&staging",
            )
        if body[0] != "~" and not _paired(body):
            raise _unpaired(self.what, self.source)
        expr, subscript = _split_subscript(body)
        groups = self._names_matching(list(self.group_hosts), expr)
        found = [name for group in groups for name in self.group_hosts[group]]
        if not groups or expr[0] == "~" or any(c in expr for c in ".?*["):
            found += self._names_matching(self.host_names, expr)
        if not found and not groups and self.hostnames is not None:
            found = [n for n in self.hostnames().get(expr, ()) if n in self.known]
        if not found:
            raise self._nothing(body, expr, groups)
        if subscript is None:
            return found
        try:
            picked = _apply_subscript(found, subscript)
        except IndexError:
            raise self.error(
                f"{body!r}: {expr!r} has {len(found)} host{'s' * (len(found) != 1)}, "
                f"so no host [{subscript[0]}]",
                _SUBSCRIPT_HINT,
            ) from None
        if not picked:
            raise self.error(
                f"{body!r} selects no host: {expr!r} has {len(found)} "
                f"host{'s' * (len(found) != 1)}",
                _SUBSCRIPT_HINT,
            )
        return picked

    def _nothing(self, body: str, expr: str, groups: list[str]) -> InventoryError:
        if groups:
            return self.error(
                f"{body!r} selects no host: group{'s' * (len(groups) > 1)} "
                f"{', '.join(groups)} {'have' if len(groups) > 1 else 'has'} none",
                "add hosts to the group, or leave it out of the pattern",
            )
        if expr in IMPLICIT_LOCALHOST:
            return self.error(
                f"{body!r} matches no host: the inventory has no {expr} (Ansible would "
                "add its implicit localhost; cpuaccel runs only on hosts an inventory lists)",
                "list localhost in the inventory (localhost ansible_connection=local), "
                "or leave out -i to run on this machine alone",
            )
        names = [*self.group_hosts, *self.host_names]
        hint = _groups_hint(expr, self.group_hosts, names)
        if body != expr:
            hint = (
                f"{body} is read as a subscript of {expr!r} (its hosts by position), not "
                "as a range of host names: for node01 to node03 write ~node0[1-3]$; " + hint
            )
        elif ":" in expr and not _one_address(expr):
            hint = (
                "a pattern holding a comma is split on its commas alone, and this term "
                "holds a ':': separate every term with commas (web,db,&staging,!atlanta); " + hint
            )
        return self.error(f"{body!r} matches no host or group", hint)

    def _names_matching(self, names: list[str], expr: str) -> list[str]:
        """The names a glob or (after '~') a regular expression matches from the start."""
        if not expr.startswith("~"):
            glob = re.compile(fnmatch.translate(expr))
            return [name for name in names if glob.match(name)]
        try:
            re.compile(expr[1:])
        except (re.error, RecursionError, OverflowError) as exc:
            raise self.error(
                f"{expr!r} is not a valid regular expression ({exc})",
                "after '~' write a Python regular expression, e.g. '~node0[1-4]'; in a "
                "pattern without a comma ':' separates terms, so end a regex holding ':' "
                "with a comma: '~(?:web|db)1,'",
            ) from None
        try:
            flags = userregex.match(expr[1:], names, userregex.SECONDS)
        except userregex.RegexRefused as exc:
            why = f"took more than {userregex.SECONDS:g} s" if exc.kind == "late" else str(exc)
            raise self.error(
                f"the regular expression {expr!r} {why} on {len(names):,} names",
                "rewrite the pattern so that it cannot backtrack: no repetition inside "
                "repetition ('a+$', not '(a+)+$'), and no alternatives that match the same text",
            ) from None
        return [name for name, hit in zip(names, flags, strict=True) if hit]


def select_hosts(
    limit: str,
    host_names: Sequence[str],
    group_hosts: Mapping[str, Sequence[str]],
    *,
    source: str | None = None,
    hostnames: Callable[[], Mapping[str, Sequence[str]]] | None = None,
) -> list[str]:
    """The host names a --limit pattern selects, in the order of ``all``: Ansible's
    ``--limit``, which filters the hosts of the play (here every host of the inventory).

    ``host_names``: the inventory's hosts in the order they were first listed.
    ``group_hosts``: every group's hosts, children included, in Ansible's orders (its
    groups as Ansible holds them, each group's hosts as ``group.get_hosts()`` lists them;
    "all" among them). Its values are read only for the groups a term matches.
    ``hostnames`` (called only for a term that matches no host or group) maps a node's
    own hostname to the inventory names it was recorded under: a term that is such a
    hostname selects those of them this inventory has.
    """
    what = f"--limit {limit!r}"
    terms: list[str] = []
    for term in _terms(limit, what, source):
        terms += _limit_file(term[1:], what, source) if term[0] == "@" else [term]
    if not terms:
        raise InventoryError(f"{what} is empty", source=source, hint=_groups_hint("", group_hosts))
    patterns = _Patterns(what, host_names, group_hosts, source, hostnames)
    chosen = set(patterns.evaluate(terms))
    selected = [name for name in patterns.evaluate(["all"]) if name in chosen]
    if not selected:
        raise _excluding_each_other(what, source, group_hosts)
    return selected


def pattern_hosts(
    pattern: str,
    host_names: Sequence[str],
    group_hosts: Mapping[str, Sequence[str]],
    *,
    source: str | None = None,
) -> list[str]:
    """The host names a host pattern selects in the order Ansible gives them for it
    (``ansible PATTERN``, a play's ``hosts:``): each term's hosts in turn, a group's in
    ``group.get_hosts()`` order. Arguments as for :func:`select_hosts`."""
    what = f"pattern {pattern!r}"
    terms = _terms(pattern, what, source)
    if not terms:
        raise InventoryError(f"{what} is empty", source=source, hint=_FORMS_HINT)
    selected = _Patterns(what, host_names, group_hosts, source, None).evaluate(terms)
    if not selected:
        raise _excluding_each_other(what, source, group_hosts)
    return selected


def _excluding_each_other(
    what: str, source: str | None, group_hosts: Mapping[str, Sequence[str]]
) -> InventoryError:
    """A pattern whose terms left no host between them."""
    return InventoryError(
        f"{what} selects no host: its terms exclude each other",
        source=source,
        hint=_groups_hint("", group_hosts),
    )


def _limit_file(path: str, what: str, source: str | None) -> list[str]:
    """``--limit @FILE``: each line of the file is one term (Ansible's retry files list a
    host a line); blank lines are skipped."""
    from cpuaccel.sourcefile import read_source

    text = read_source(
        path,
        InventoryError,
        f"{what}: limit file",
        "give @FILE the path of a file of host names or patterns, one a line",
    )
    return [line.strip() for line in text.split("\n") if line.strip()]


def _groups_hint(
    body: str, group_hosts: Mapping[str, Sequence[str]], names: Sequence[str] = ()
) -> str:
    import difflib  # only for the hint on a pattern that matched nothing: off start-up

    close = difflib.get_close_matches(body, names, n=3) if body else []
    maybe = f"did you mean {', '.join(close)}? " if close else ""
    groups = [g for g in group_hosts if g != "ungrouped"]
    return f"{maybe}{_FORMS_HINT}; groups in the inventory: {', '.join(groups)}"
