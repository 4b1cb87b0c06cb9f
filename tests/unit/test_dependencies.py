"""The dependency floors that security rests on: every template renders in Jinja2's
sandbox, which had published escapes before 3.1.6 (CVE-2024-56326, CVE-2025-27516)."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
SANDBOX_FLOOR = Version("3.1.6")


def _jinja2(lines: list[str]) -> list[Requirement]:
    found = [Requirement(line.split("#")[0].strip()) for line in lines if line.strip()]
    return [r for r in found if r.name.lower() == "jinja2"]


def test_every_requirement_of_jinja2_admits_no_version_with_a_sandbox_escape() -> None:
    # A requirement with a version: the import contracts name "jinja2" bare.
    written = re.findall(
        r'^\s*"(jinja2\s*[<>=!~][^"]*)"', (REPO / "pyproject.toml").read_text(), re.M
    )
    pyproject = _jinja2(written)
    constraints = _jinja2(
        [line for line in (REPO / "constraints.txt").read_text().splitlines()
         if not line.lstrip().startswith("#")]
    )  # fmt: skip
    assert len(pyproject) == 1 and len(constraints) == 1
    for requirement in (*pyproject, *constraints):
        assert not requirement.specifier.contains("3.1.5"), requirement
        assert not requirement.specifier.contains("3.0.3"), requirement
        assert requirement.specifier.contains(str(SANDBOX_FLOOR)), requirement
    assert pyproject[0].specifier == constraints[0].specifier  # one floor, said twice


def test_the_installed_jinja2_is_past_the_escapes() -> None:
    assert Version(importlib.metadata.version("jinja2")) >= SANDBOX_FLOOR
