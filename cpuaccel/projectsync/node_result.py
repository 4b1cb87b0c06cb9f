"""What a sync did (or, with --check, would do) on one node: ``sync --json``'s host object
and the lines ``sync`` prints (cli/sync.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
        return {
            "dest": self.dest,
            "changed": self.changed,
            "deleted": self.deleted,
            "added": self.added,
            "bytes": self.bytes,
            "method": self.method,
            "shared_with": self.shared_with,
            "in_sync": self.in_sync,
            **({"swept": self.swept} if self.swept else {}),
        }
