"""Versions and requirements as pip reads them (PEP 440, PEP 508), for the pip module's
"already satisfied" check without running pip."""

from __future__ import annotations

import os

from cpuaccel.node.common import normalise
from cpuaccel.node.moduleutil import Fail, expand

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cpuaccel.node.moduleutil import Reply, Version


_VERSION = (
    r"v?(?:(\d+)!)?(\d+(?:\.\d+)*)"  # epoch, release
    r"(?:[-_.]?(a|b|c|rc|alpha|beta|pre|preview)[-_.]?(\d*))?"  # pre-release
    r"(?:-(\d+)|[-_.]?(post|rev|r)[-_.]?(\d*))?"  # post-release
    r"(?:[-_.]?(dev)[-_.]?(\d*))?"  # development release
    r"(?:\+([a-z0-9]+(?:[-_.][a-z0-9]+)*))?"  # local label
)
_PRE = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}


def parse_version(text: str) -> Version | None:
    """(epoch, release, pre, post, dev, local) of a PEP 440 version; None if it is not one."""
    import re  # already loaded by json: costs nothing

    m = re.fullmatch(_VERSION, text.strip().lower())
    if m is None:
        return None
    g = m.groups()
    pre = (_PRE[g[2]], int(g[3] or 0)) if g[2] else None
    post = int(g[4] or g[6] or 0) if g[4] or g[5] else None
    dev = int(g[8] or 0) if g[7] else None
    local = tuple(
        (1, int(p), "") if p.isdigit() else (0, 0, p) for p in re.split(r"[-_.]", g[9] or "") if p
    )  # numeric parts sort after alphanumeric ones
    return (int(g[0] or 0), tuple(int(p) for p in g[1].split(".")), pre, post, dev, local)


def _key(v: Version, local: bool = True) -> tuple[Any, ...]:
    """A sort key with PEP 440's order: 1.0.dev0 < 1.0a1 < 1.0 < 1.0+x < 1.0.post1."""
    epoch, release, pre, post, dev, loc = v
    while len(release) > 1 and release[-1] == 0:  # 1.0 == 1.0.0
        release = release[:-1]
    if pre is None:
        pre = (-1, 0) if post is None and dev is not None else (3, 0)
    return (
        epoch,
        release,
        pre,
        -1 if post is None else post,
        (1, 0) if dev is None else (0, dev),
        loc if local else (),
    )


def _is_pre(v: Version) -> bool:
    return v[2] is not None or v[4] is not None


def _prefix_match(v: Version, epoch: int, prefix: tuple[int, ...]) -> bool:
    release = v[1] + (0,) * max(0, len(prefix) - len(v[1]))
    return bool(v[0] == epoch and release[: len(prefix)] == prefix)


def version_matches(version: str, op: str, spec: str) -> bool:
    """Whether an installed version satisfies one specifier, as pip decides it (an
    installed pre-release counts, and a local label is ignored unless the spec has one)."""
    if op == "===":
        return version.strip().lower() == spec.strip().lower()
    v = parse_version(version)
    if v is None:  # not a PEP 440 version: pip ≥ 24.1 matches it with nothing either
        return False
    if spec.endswith(".*"):
        s = parse_version(spec[:-2])
        assert s is not None and op in ("==", "!=")
        return _prefix_match(v, s[0], s[1]) == (op == "==")
    s = parse_version(spec)
    assert s is not None
    if op in ("==", "!="):
        return (_key(v, local=bool(s[5])) == _key(s)) == (op == "==")
    have, want = _key(v, local=False), _key(s)
    same_base = have[:2] == want[:2]
    if op == "<=":
        return have <= want
    if op == ">=":
        return have >= want
    if op == "<":  # 2.0rc1 is not < 2.0
        return have < want and not (same_base and _is_pre(v) and not _is_pre(s))
    if op == ">":  # 2.0.post1 and 2.0+x are not > 2.0
        return have > want and not (same_base and (v[5] or (v[3] is not None and s[3] is None)))
    if op == "~=":
        return have >= want and _prefix_match(v, s[0], s[1][:-1])
    raise ValueError(f"unknown operator {op}")


# ---------------------------------------------------------------- pip: requirements


def parse_requirement(text: str) -> Reply:
    """What a requirement asks for: ``name`` (normalised, or None), ``specs`` [(op,
    version)], ``exact`` (a wheel file's version), ``arg`` (for pip's command line) and
    ``known``: False when only pip can tell (a VCS URL, a source tree, bad syntax)."""
    import re

    text = text.strip()
    body = text.split(";", 1)[0].strip()  # environment markers: assumed true
    req: Reply = {"text": text, "arg": text, "name": None, "specs": [], "exact": None}
    req["known"] = False
    m = re.fullmatch(r"([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(\[[^\]]*\])?\s*(.*)", body)
    rest = m.group(3).strip() if m else ""
    path_like = "/" in body or ":" in body or body.endswith((".whl", ".zip", ".tar.gz", ".tgz"))
    if m and rest.startswith("@"):  # name @ url (PEP 508)
        req["name"], location = normalise(m.group(1)), rest[1:].strip()
    elif m and not path_like:
        specs = []
        inner = rest.strip("()").strip()  # name (>=1,<2) is the old form of name>=1,<2
        for part in inner.split(",") if inner else []:
            sm = re.fullmatch(r"\s*(~=|===|==|!=|<=|>=|<|>)\s*([^\s]+)\s*", part)
            if sm is None:
                return req
            op, version = sm.groups()
            wild = version.endswith(".*")
            parsed = parse_version(version[:-2] if wild else version)
            if op != "===" and (
                parsed is None
                or (wild and (op not in ("==", "!=") or parsed[2:] != (None, None, None, ())))
                or (op == "~=" and len(parsed[1]) < 2)
            ):
                return req
            specs.append((op, version))
        req.update(name=normalise(m.group(1)), specs=specs, known=True)
        return req
    else:
        location = body
        if location.startswith("~"):  # pip does not expand ~ itself
            req["arg"] = text.replace(location, expand(location), 1)
    if location.endswith(".whl"):  # name-version(-build)-python-abi-platform.whl
        if location.startswith("file:"):
            from urllib.parse import unquote, urlsplit

            location = unquote(urlsplit(location).path)
        parts = os.path.basename(location)[:-4].split("-")
        if len(parts) in (5, 6) and parse_version(parts[1]) is not None:
            req.update(name=normalise(parts[0]), exact=parts[1], known=True)
    return req


def read_requirements(path: str, depth: int = 0) -> list[str]:
    """The requirements of a requirements file, nested ``-r`` files included. Its option
    lines are left to pip: the file is handed to pip whole."""
    import re

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise Fail(f"cannot read the requirements file {path}: {exc.strerror}") from None
    found = []
    for raw in text.replace("\\\n", "").splitlines():
        line = re.sub(r"(^|\s)#.*", "", raw).strip()
        nested = re.match(r"(-r|--requirement)[=\s]*(\S+)", line)
        if nested and depth < 10:
            found += read_requirements(
                os.path.join(os.path.dirname(path), nested.group(2)), depth + 1
            )
        elif line and (not line.startswith("-") or line.startswith(("-e", "--editable"))):
            found.append(line.split(" --", 1)[0].strip())  # minus options such as --hash
    return found


def satisfied(req: Reply, versions: dict[str, str]) -> bool:
    have = versions.get(req["name"] or "")
    if not req["known"] or have is None:
        return False
    if req["exact"] is not None:  # a wheel file: only its own version will do
        a, b = parse_version(have), parse_version(req["exact"])
        return have == req["exact"] if a is None or b is None else _key(a) == _key(b)
    return all(version_matches(have, op, spec) for op, spec in req["specs"])
