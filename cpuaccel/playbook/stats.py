"""Per-host counts for the recap, in Ansible's shape."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class HostStats:
    # Ansible counts a changed task under ok too: ok=12 changed=3 is 12 tasks that
    # ended well, 3 of which changed something.
    ok: int = 0
    changed: int = 0
    unreachable: int = 0
    failed: int = 0
    skipped: int = 0
    rescued: int = 0
    ignored: int = 0

    def count(self, status: str, changed: bool) -> None:
        if status in ("ok", "changed"):
            self.ok += 1
            self.changed += int(changed)
        elif status == "ignored":
            self.ignored += 1
        else:
            setattr(self, status, getattr(self, status) + 1)

    @property
    def succeeded(self) -> bool:
        return self.failed == 0 and self.unreachable == 0

    def line(self) -> str:
        return " ".join(f"{k}={v}" for k, v in asdict(self).items())

    def to_json(self) -> dict[str, int]:
        return asdict(self)
