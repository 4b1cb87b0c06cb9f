"""The one bounded reader of JSON from disk and from nodes (cpuaccel.jsonsource, its
parser cpuaccel.node.boundedjson): a text nested too deep or too large is a Refused
(a ValueError with one line), never a RecursionError; and every JSON parse of the
package goes through it."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from cpuaccel import jsonsource
from cpuaccel.jsonsource import MAX_DEPTH, Refused, describe, lines, loads, read_file

PACKAGE = Path(__file__).parents[2] / "cpuaccel"
DEEP = "[" * 3000  # the line that ended ps, report and the dashboard in a traceback


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    "text",
    [
        DEEP,
        DEEP.encode(),
        nested(MAX_DEPTH + 1),  # valid JSON, parsed by json, deeper than the bound
        '{"a": ' * (MAX_DEPTH + 1) + "1" + "}" * (MAX_DEPTH + 1),
        '{"step": 1, "loss": ' + nested(5000) + "}",
    ],
    ids=["3000-open", "3000-open-bytes", "bound+1", "objects", "deep-value"],
)
def test_a_text_nested_too_deep_is_refused_in_one_line(text: str | bytes) -> None:
    with pytest.raises(Refused) as caught:
        loads(text)
    assert isinstance(caught.value, ValueError)  # code that skips bad JSON skips it too
    assert describe(caught.value) == f"values nested more than {MAX_DEPTH} levels deep"


def test_values_within_the_bound_are_json_s_own() -> None:
    assert loads(nested(MAX_DEPTH)) == json.loads(nested(MAX_DEPTH))
    # Brackets in strings count for the quick test only: the walk finds them shallow.
    text = json.dumps({"log": "[" * 5000, "step": [1, [2]]})
    assert loads(text) == json.loads(text)
    with pytest.raises(ValueError, match="Expecting value") as caught:
        loads('{"step": }')
    assert describe(caught.value).startswith("not valid JSON (Expecting value, line 1")


def test_a_text_longer_than_its_limit_is_refused() -> None:
    assert loads("[1, 2]", limit=6) == [1, 2]
    with pytest.raises(Refused, match="longer than 5 bytes"):
        loads("[1, 2]", limit=5)


def test_json_lines_leave_out_the_refused_and_the_bad_lines() -> None:
    data = b'{"step": 1}\n' + DEEP.encode() + b'\nnot json\n{"step": 2}\n'
    assert lines(data) == [{"step": 1}, {"step": 2}]
    # Lines that are no JSON alone but nest across each other once joined by commas.
    across = b"\n".join([b"[" * 150 + b"1", b"[" * 150 + b"1" + b"]" * 301])
    assert lines(across + b'\n{"step": 3}\n') == [{"step": 3}]
    many = b"".join(b'{"step": %d, "loss": 0.5}\n' % i for i in range(1000))
    assert [v["step"] for v in lines(many)] == list(range(1000))


def test_a_file_is_read_within_its_bounds(tmp_path: Path) -> None:
    assert read_file(tmp_path / "missing.json") is None
    (tmp_path / "ok.json").write_text('{"a": 1}\n')
    assert read_file(tmp_path / "ok.json") == {"a": 1}
    (tmp_path / "deep.json").write_text(DEEP)
    with pytest.raises(Refused, match=f"nested more than {MAX_DEPTH} levels"):
        read_file(tmp_path / "deep.json")
    (tmp_path / "big.json").write_text("[" + "1," * 100 + "1]")
    with pytest.raises(Refused, match="larger than 100 bytes"):
        read_file(tmp_path / "big.json", limit=100)
    os.mkfifo(tmp_path / "fifo.json")  # never waited on
    with pytest.raises(Refused, match="not a regular file"):
        read_file(tmp_path / "fifo.json")
    (tmp_path / "link.json").symlink_to(tmp_path / "ok.json")  # never followed
    with pytest.raises(Refused, match="cannot be read"):
        read_file(tmp_path / "link.json")
    problems: list[str] = []
    assert jsonsource.read_object(tmp_path / "deep.json", problems) is None
    assert problems == [f"deep.json: not read: values nested more than {MAX_DEPTH} levels deep"]


# The only places that call json's parser: the bounded reader itself, and the test bed.
_PARSE = re.compile(r"\bjson\.loads?\(|\bfrom json import\b.*\bloads?\b")
_ALLOWED = {"node/boundedjson.py"}


def test_every_json_parse_of_the_package_goes_through_the_bounded_reader() -> None:
    found = [
        f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] != "testbed"
        and str(path.relative_to(PACKAGE)) not in _ALLOWED
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if _PARSE.search(line)
    ]
    assert found == [], "parse JSON with cpuaccel.jsonsource (cpuaccel.node.boundedjson on a node)"
