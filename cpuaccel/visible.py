"""Text from a node or a rank made safe to show on a terminal: every control character
made visible, as ``\\x1b``, except the newline and the tab.

A rank's output, a node's name or its error message may hold escape sequences that a
terminal would obey: OSC 52 (write the clipboard), OSC 8 (a link disguised as text),
cursor movement that rewrites earlier lines, a title change, a DCS string. With ESC
and every other C0 and C1 control (CSI as the one code 0x9b too), DEL, the Unicode
line and paragraph separators and the bidirectional overrides shown as their code,
no sequence reaches the terminal whole: what follows the visible code is plain text.
Only what is shown goes through here; the logs keep every byte.
"""

from __future__ import annotations

import re

# C0 but \t and \n, DEL, C1; U+2028/U+2029 (line breaks of their own); the bidi
# embeddings, overrides and isolates (text that reads other than it runs).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _code(match: re.Match[str]) -> str:
    point = ord(match.group())
    return f"\\x{point:02x}" if point < 0x100 else f"\\u{point:04x}"


def visible(text: str) -> str:
    """``text`` with each control character but ``\\n`` and ``\\t`` written as its code
    (``\\x1b``, ``\\x9b``, ``\\u202e``)."""
    if _CONTROL.search(text) is None:
        return text
    return _CONTROL.sub(_code, text)
