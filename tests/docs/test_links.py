"""The documentation holds together: links resolve, every verb has its page, the README
stays short.

- Every relative link (and image) in README.md and docs/*.md names a file or folder of
  this repository; a link with an ``#anchor`` into a Markdown file names one of its
  headings, slugged as GitHub slugs them.
- Every verb of the CLI (``cpuaccel.cli.main.VERBS``) has a ``## `cpuaccel VERB` ``
  section in docs/cli.md, and that section links to a page of docs/ that describes the
  verb (the page, or the linked section of it, says ``cpuaccel VERB``). A verb added to
  VERBS without docs fails here; so does a section left behind for a verb removed.
- Every verb is in the README's table of verbs.
- README.md is at most 400 lines.

Plain files only: no cluster, no network.
"""

from __future__ import annotations

import re
import unicodedata
from functools import cache
from pathlib import Path

import pytest

from cpuaccel.cli.main import VERBS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CLI = DOCS / "cli.md"
MAX_README_LINES = 400

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target "title") and ![alt](target); the text may hold one level of brackets.
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)"
)
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HTML_ANCHOR = re.compile(r"<a\s+[^>]*(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def doc_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of each line outside fenced code blocks."""
    out: list[tuple[int, str]] = []
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def heading_text(raw: str) -> str:
    """A heading as GitHub renders it: code spans' contents, links' texts, no markup."""
    text = CODE_SPAN.sub(lambda m: m.group(2).strip(), raw)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    return text


def slug(text: str) -> str:
    """GitHub's anchor for a heading: lowercase; letters, digits, '-' and '_' kept,
    other punctuation and symbols dropped; each space becomes '-'."""
    kept = []
    for char in heading_text(text).strip().lower():
        category = unicodedata.category(char)
        if char in "-_" or category[0] in "LN" or category == "Mn":
            kept.append(char)
        elif char == " ":
            kept.append("-")
    return "".join(kept)


def test_slug_follows_githubs_rules() -> None:
    assert slug("Slurm's nodes: `check --slurm` and `-i slurm:`") == (
        "slurms-nodes-check---slurm-and--i-slurm"
    )
    assert slug("Fewer nodes: --nodes MIN:MAX") == "fewer-nodes---nodes-minmax"
    assert slug("group_vars and host_vars") == "group_vars-and-host_vars"
    assert slug("A/B between two revisions") == "ab-between-two-revisions"
    assert slug("## Defaults in cpuaccel.yaml".lstrip("# ")) == "defaults-in-cpuaccelyaml"


@cache
def anchors(path: Path) -> frozenset[str]:
    """Every anchor a Markdown file offers: its headings' slugs (a repeated slug gets
    -1, -2, ... as on GitHub) and explicit HTML anchors."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in prose_lines(path):
        found.update(HTML_ANCHOR.findall(line))
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link and image outside code."""
    out: list[tuple[int, str]] = []
    for number, line in prose_lines(path):
        # A code span becomes a plain word, so that a link text written as code still
        # counts and nothing inside code is taken for a link.
        line = CODE_SPAN.sub("code", line)
        out.extend((number, target) for target in INLINE_LINK.findall(line))
        definition = REFERENCE_DEF.match(line)
        if definition:
            out.append((number, definition.group(1)))
    return out


def broken(source: Path, target: str) -> str | None:
    """Why a link from ``source`` to ``target`` does not resolve, or None."""
    if not target:
        return "empty link"
    if SCHEME.match(target) or target.startswith("//"):
        return None  # another site: not this test's to check
    name, _, anchor = target.partition("#")
    file = (source.parent / name).resolve() if name else source
    if ROOT not in (file, *file.parents):
        return f"{name} is outside the repository"
    if not file.exists():
        return f"{name} does not exist"
    if anchor and file.suffix == ".md" and anchor not in anchors(file):
        return f"{file.relative_to(ROOT)} has no heading with the anchor #{anchor}"
    return None


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    problems = [
        f"{path.relative_to(ROOT)}:{number}: ({target}) {why}"
        for number, target in links(path)
        if (why := broken(path, target)) is not None
    ]
    assert not problems, "\n".join(problems)


def test_the_readme_is_at_most_400_lines() -> None:
    count = len(README.read_text(encoding="utf-8").splitlines())
    assert count <= MAX_README_LINES, f"README.md has {count} lines; move detail into docs/"


def sections(path: Path, level: int) -> dict[str, tuple[str, list[tuple[int, str]]]]:
    """Each heading of ``level`` in ``path`` -> (its rendered text, its lines up to the
    next heading of that level or higher), keyed by slug."""
    out: dict[str, tuple[str, list[tuple[int, str]]]] = {}
    current: list[tuple[int, str]] | None = None
    for number, line in prose_lines(path):
        match = HEADING.match(line)
        if match and len(match.group(1)) <= level:
            current = None
            if len(match.group(1)) == level:
                current = []
                out[slug(match.group(2))] = (heading_text(match.group(2)), current)
                continue
        if current is not None:
            current.append((number, line))
    return out


def says(text: str, verb: str) -> bool:
    return re.search(rf"\bcpuaccel {re.escape(verb)}\b", CODE_SPAN.sub(r"\2", text)) is not None


def describes(source: Path, target: str, verb: str) -> bool:
    """Whether the page (or the section) a link names says `cpuaccel VERB`."""
    name, _, anchor = target.partition("#")
    file = (source.parent / name).resolve()
    if not anchor:
        return says(file.read_text(encoding="utf-8"), verb)
    for level in range(1, 7):
        found = sections(file, level).get(anchor)
        if found is not None:
            heading, body = found
            return says(heading, verb) or says("\n".join(line for _, line in body), verb)
    return False


VERB_HEADING = re.compile(r"^cpuaccel ([a-z][a-z-]*)$")


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_every_verb_has_a_section_in_the_cli_reference_linking_to_its_page(verb: str) -> None:
    found = sections(CLI, 2).get(slug(f"cpuaccel {verb}"))
    assert found is not None, f"docs/cli.md has no '## `cpuaccel {verb}`' section"
    heading, body = found
    assert heading == f"cpuaccel {verb}", heading
    pages = [
        (number, target)
        for number, line in body
        for target in INLINE_LINK.findall(CODE_SPAN.sub("code", line))
        if not SCHEME.match(target)
        and target.partition("#")[0].endswith(".md")
        and (CLI.parent / target.partition("#")[0]).resolve() != CLI
    ]
    assert pages, f"docs/cli.md's `cpuaccel {verb}` section links to no page of docs/"
    for number, target in pages:
        why = broken(CLI, target)
        assert why is None, f"docs/cli.md:{number}: ({target}) {why}"
    assert any(describes(CLI, target, verb) for _, target in pages), (
        f"no page linked from docs/cli.md's `cpuaccel {verb}` section says `cpuaccel {verb}`"
    )


def test_the_cli_reference_has_no_section_for_a_verb_that_is_gone() -> None:
    stale = [
        heading
        for heading, _ in sections(CLI, 2).values()
        if (match := VERB_HEADING.match(heading)) and match.group(1) not in VERBS
    ]
    assert not stale, f"docs/cli.md documents verbs the CLI does not have: {stale}"


def test_every_verb_is_in_the_readmes_table_of_verbs() -> None:
    found = sections(README, 2).get("the-verbs")
    assert found is not None, "README.md has no '## The verbs' section"
    table = "\n".join(line for _, line in found[1] if line.lstrip().startswith("|"))
    missing = [verb for verb in sorted(VERBS) if f"`{verb}`" not in table]
    assert not missing, f"README.md's table of verbs lacks {missing}"


ARCHITECTURE = ROOT / "docs" / "architecture.md"
MAX_ARCHITECTURE_CHARS = 6000  # one screen's map: the reference lives in the other pages


def test_the_architecture_map_is_one_screen_and_names_every_package() -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    assert len(text) <= MAX_ARCHITECTURE_CHARS, (
        f"docs/architecture.md has {len(text)} characters, over {MAX_ARCHITECTURE_CHARS}: "
        "say less in it, and move detail to the page of that part"
    )
    packages = sorted(p.parent.name for p in (ROOT / "cpuaccel").glob("*/__init__.py"))
    named = set(re.findall(r"`([a-z_]+)/?`", text)) | set(re.findall(r"`([a-z_]+)/", text))
    missing = [name for name in packages if name not in named]
    assert not missing, f"docs/architecture.md does not name the package(s) {missing}"
