"""A table fitted to the terminal, as check and ps print theirs: when it is wider than
the terminal, whole columns are left out in the verb's order (and the gap between
columns narrows) before any cell would be cut; the columns never left out fold."""

from __future__ import annotations

from collections.abc import Sequence

# The space between two columns: two, or one when that saves a column (rich's padding
# (0, 1), collapsed or not; pad_edge=False: none at the edges).
GAPS = (2, 1)


def width(columns: Sequence[str], rows: Sequence[dict[str, str]], gap: int) -> int:
    """The table's width in cells when nothing wraps ("-" for a missing cell)."""
    # emoji=False, as ui's consoles print: `:smile:` in a name is 7 cells, not a picture's
    # 2, and rich's large emoji table stays unloaded: its load would follow the probes.
    from rich.text import Text

    widths = [
        max([len(c)] + [Text.from_markup(r.get(c, "-"), emoji=False).cell_len for r in rows])
        for c in columns
    ]
    return sum(widths) + gap * (len(columns) - 1)


def fit(
    columns: Sequence[str],
    drop_order: Sequence[str],
    rows: Sequence[dict[str, str]],
    room: int,
) -> tuple[list[str], list[str], int]:
    """The columns shown in ``room`` cells, the ones left out (of ``drop_order``, in
    its order), and the gap."""
    shown: list[str] = list(columns)
    dropped: list[str] = []
    for gap in GAPS:
        shown, dropped = list(columns), []
        for column in drop_order:
            if width(shown, rows, gap) <= room:
                break
            if column in shown:
                shown.remove(column)
                dropped.append(column)
        if width(shown, rows, gap) <= room:
            break
    return shown, dropped, gap


def left_out(dropped: Sequence[str], room: int) -> str:
    """The line under a table that left columns out (rich markup)."""
    return (
        f"[dim]({', '.join(dropped)} left out at {room} columns; "
        "a wider terminal or --json shows them)[/]"
    )
