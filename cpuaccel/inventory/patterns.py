"""Ansible's host ranges (``node[01:16]``) and host patterns (``--limit web:&rack1:!node3``).

Kept apart from the inventory loader: both are small languages of their own, and the
loader only needs their results.
"""

from __future__ import annotations

import fnmatch
import re
import string
from collections.abc import Callable, Mapping, Sequence

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


def split_limit(limit: str, host_names: Sequence[str] = ()) -> list[str]:
    """Split a host pattern into terms, on commas and on colons outside brackets.

    A comma-separated part that is itself a host name is kept whole, so hosts named
    after IPv6 addresses can still be selected.
    """
    hosts = set(host_names)
    terms: list[str] = []
    for part in limit.split(","):
        part = part.strip()
        if part in hosts or part[1:] in hosts:
            terms.append(part)
            continue
        depth, current = 0, ""
        for char in part:
            # Brackets (globs) and parentheses (regex groups like "(?:") may hold colons.
            depth += (char in "[(") - (char in "])")
            if char == ":" and depth <= 0:
                terms.append(current.strip())
                current = ""
            else:
                current += char
        terms.append(current.strip())
    return [term for term in terms if term]


def select_hosts(
    limit: str,
    host_names: Sequence[str],
    group_hosts: Mapping[str, Sequence[str]],
    *,
    source: str | None = None,
    hostnames: Callable[[], Mapping[str, Sequence[str]]] | None = None,
) -> list[str]:
    """The host names a --limit pattern selects, in inventory order.

    ``hostnames`` (called only for a term that matches no host or group) maps a node's
    own hostname to the inventory names it was recorded under: a plain term that is such
    a hostname selects those of them this inventory has.

    ``group_hosts`` maps every group to all its hosts, children included. As in Ansible,
    plain terms are united first, then ``&`` terms intersect and ``!`` terms exclude; a
    pattern of only ``&``/``!`` terms starts from all hosts. Unlike Ansible, which only
    warns, a term matching nothing is an error: a typo must not silently launch on the
    wrong set of nodes.
    """
    terms = split_limit(limit, host_names)
    if not terms:
        raise InventoryError(
            f"--limit {limit!r} is empty", source=source, hint=_groups_hint("", group_hosts)
        )
    plain = [t for t in terms if t[0] not in "&!"]
    ordered = (plain or ["all"]) + [t for t in terms if t[0] == "&"]
    ordered += [t for t in terms if t[0] == "!"]
    chosen: set[str] = set()
    for term in ordered:
        body = term[1:] if term[0] in "&!" else term
        matched = _match_term(body, host_names, group_hosts, limit, source)
        if not matched and hostnames is not None:
            matched = {name for name in hostnames().get(body, ()) if name in host_names}
        if not matched:
            names = [*group_hosts, *host_names]
            raise InventoryError(
                f"--limit {limit!r}: {body!r} matches no host or group",
                source=source,
                hint=_groups_hint(body, group_hosts, names),
            )
        if term[0] == "!":
            chosen -= matched
        elif term[0] == "&":
            chosen &= matched
        else:
            chosen |= matched
    selected = [name for name in host_names if name in chosen]
    if not selected:
        raise InventoryError(
            f"--limit {limit!r} selects no host: its terms exclude each other",
            source=source,
            hint=_groups_hint("", group_hosts),
        )
    return selected


def _match_term(
    body: str,
    host_names: Sequence[str],
    group_hosts: Mapping[str, Sequence[str]],
    limit: str,
    source: str | None,
) -> set[str]:
    if body in ("all", "*"):
        return set(host_names)
    if body.startswith("~"):
        try:
            regex = re.compile(body[1:])
        except re.error as exc:
            raise InventoryError(
                f"--limit {limit!r}: {body!r} is not a valid regular expression ({exc})",
                source=source,
                hint="after '~' write a Python regular expression, e.g. '~node0[1-4]'",
            ) from None
        # re.match, as Ansible does: the regex is anchored at the start of the name.
        return {name for name in host_names if regex.match(name)}
    if "*" in body or "?" in body:
        matched = {name for name in host_names if fnmatch.fnmatchcase(name, body)}
        for group, members in group_hosts.items():
            if fnmatch.fnmatchcase(group, body):
                matched.update(members)
        return matched
    if body in group_hosts:
        return set(group_hosts[body])
    return {body} if body in host_names else set()


def _groups_hint(
    body: str, group_hosts: Mapping[str, Sequence[str]], names: Sequence[str] = ()
) -> str:
    import difflib  # only for the hint on a pattern that matched nothing: off start-up

    close = difflib.get_close_matches(body, names, n=3) if body else []
    maybe = f"did you mean {', '.join(close)}? " if close else ""
    return (
        f"{maybe}use host names, group names, globs (node*), ~regex, &group or !host; "
        f"groups in the inventory: {', '.join(group_hosts)}"
    )
