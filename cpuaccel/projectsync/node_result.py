"""What a sync did (or, with --check, would do) on one node: ``sync --json``'s host object
and the lines ``sync`` prints (cli/sync.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The fields of sync --json's host object, in its order. Not shown: the mismatches (they
# make the sync's error) and the runs found (what of them was ended is ``swept``).
_JSON_KEYS = ("dest", "changed", "deleted", "added", "bytes", "method", "shared_with", "in_sync")


@dataclass
class NodeReport:
    """What a sync did (or, with --check, would do) on one node."""

    dest: str
    changed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    bytes: int = 0
    method: str = "none"  # none | rsync | tar | check
    shared_with: str | None = None
    in_sync: bool = False
    mismatches: list[str] = field(default_factory=list)
    # The part of ``changed`` the node did not have at all (sync --diff tells them apart).
    added: list[str] = field(default_factory=list)
    # The jobs with processes on the node, as its look found them (run id -> processes),
    # and what of them the controller ended: a run it records as ended.
    runs: dict[str, Any] = field(default_factory=dict)
    swept: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """sync --json's host object: ``_JSON_KEYS``, then ``swept`` when any run was."""
        shown = {name: getattr(self, name) for name in _JSON_KEYS}
        return {**shown, "swept": self.swept} if self.swept else shown
