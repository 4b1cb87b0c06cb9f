"""cpuaccel.visible and ui.escape: whatever a node or a rank sends, what is shown holds
no control character but the newline and the tab, and text without one is unchanged
(property tests over any text, then the sequences a terminal would obey)."""

from __future__ import annotations

import io
import unicodedata

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from rich.console import Console

from cpuaccel import ui
from cpuaccel.visible import visible

BIDI = {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}
# Text rich with escapes: any character, or one of the controls, or a piece of a sequence.
PIECES = st.sampled_from(
    ["\x1b", "\x1b[", "\x1b]", "\x07", "\x1b\\", "\x9b", "\x9d", "\x90", "\r", "\x08", "\x7f",
     "\u202e", "\u2028", "[", "]", "\\", "[bold]", "[/]", "52;c;", "1A", "\n", "\t"]
)  # fmt: skip
TEXT = st.lists(st.one_of(st.characters(), PIECES), max_size=60).map("".join)


def controls(text: str) -> set[str]:
    """The characters of ``text`` a terminal would take as a control, \\n and \\t aside."""
    return {
        c
        for c in text
        if (unicodedata.category(c) == "Cc" and c not in "\n\t") or c in BIDI or c in "\u2028\u2029"
    }


@settings(max_examples=600, deadline=None)
@given(TEXT)
@example("\x1b]52;c;SGVsbG8=\x07")
@example("\x1b[1A\x1b[2Kok PASSED")
@example("\x1b]8;;https://evil.example/\x1b\\docs\x1b]8;;\x1b\\")
@example("\x1bP+q544e\x1b\\")
@example("\x9b6n")
def test_what_is_shown_holds_no_control_but_newline_and_tab(text: str) -> None:
    shown = visible(text)
    assert controls(shown) == set()
    assert shown.count("\n") == text.count("\n") and shown.count("\t") == text.count("\t")
    if not controls(text):
        assert shown == text  # nothing to show otherwise: the same text
    assert visible(shown) == shown


@settings(max_examples=300, deadline=None)
@given(TEXT)
def test_escaped_text_printed_by_rich_holds_no_control_and_shows_each_one(text: str) -> None:
    out = io.StringIO()
    console = Console(file=out, color_system=None, width=100000, soft_wrap=True)
    console.print(f"[bold]\\[rank 0 h][/] {ui.escape(text)}")
    printed = out.getvalue()
    assert controls(printed) == set()
    assert printed.startswith("[rank 0 h] ")  # the label's markup read, the text's not
    for c in controls(text):  # each control shown as its code
        assert visible(c) in printed


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("\x1b]52;c;SGVsbG8=\x07", "\\x1b]52;c;SGVsbG8=\\x07"),
        ("\x1b[1A\rPASSED", "\\x1b[1A\\x0dPASSED"),
        ("a\x08b\x7f\x9b2J", "a\\x08b\\x7f\\x9b2J"),
        ("abc\u202eexe.txt", "abc\\u202eexe.txt"),
        ("tab\tand newline\n", "tab\tand newline\n"),
        ("ünïcode ✓ 日本", "ünïcode ✓ 日本"),
    ],
)
def test_each_control_is_shown_as_its_code(text: str, shown: str) -> None:
    assert visible(text) == shown
