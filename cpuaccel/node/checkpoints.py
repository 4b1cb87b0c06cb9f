"""Which checkpoint a restarted job resumes from: the newest one every node has whole.

Part of cpuaccel's node package (see ``cpuaccel.node``): stdlib only, Python 3.8+. One
judgement for both sides of the supervisor: a foreground run's (jobs/foreground.py,
reading each node through its connection) and a detached run's on the head
(node/detached.py, reading each node through the run's ssh.sh).

Each node's local rank 0 saves its own copy (``ctx.save``) and appends a line to the run
folder's ``checkpoints.jsonl`` on its node (path, step, sha256, size, time, rank, host).
:func:`host_of` reads one node's lines (the tail only: bounded) with its listing (the
files' sizes), and :func:`choose` picks the newest checkpoint (highest step, then time)
that every host recorded with the same sha256 and size and still holds at that size. A
folder (``cpuaccel.record_checkpoint`` of what Accelerate's ``save_state`` wrote) is
recorded by its manifest, a file beside it. A checkpoint that lived only on a lost node,
or that one node did not finish writing, is not chosen.

What a node wrote is input, not trusted: a line that is not JSON, a field of the wrong
type, a path outside the run folder (or in a subfolder, or a hidden name) is ignored
with a reason; a path is never followed, only its name looked up in the run folder.
"""

from __future__ import annotations

import base64
import math
import os
import re
from dataclasses import dataclass, field

from cpuaccel.node.boundedjson import Refused, loads
from cpuaccel.node.runfiles import list_files, read_file

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

RECORDS = "checkpoints.jsonl"
MANIFEST = ".manifest.json"  # a recorded folder's: <folder>.manifest.json beside it
TAIL = 1024 * 1024  # bytes of checkpoints.jsonl read (its newest lines are at its end)
LINE_LIMIT = 4096  # a longer line is no record cpuaccel wrote
MTIME_SLACK = 5.0  # seconds a file's mtime may pass its record's time (clock skew)
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*\Z")  # a file the node's `list` shows
_SHA = re.compile(r"^[0-9a-f]{64}\Z")


@dataclass(frozen=True)
class Record:
    """One checkpoints.jsonl line that passed the checks (``name``: in the run folder)."""

    name: str
    step: int | None
    sha256: str
    size: int
    time: float
    manifest: str | None = None  # a folder's: the file in the run folder that stands for it


@dataclass
class HostCheckpoints:
    """What one host has: its latest record per file, its files' (size, mtime), and why
    anything was ignored. ``files`` None: the host could not be read."""

    host: str
    records: dict[str, Record] = field(default_factory=dict)
    files: dict[str, tuple[int, float]] | None = None
    reasons: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Found:
    path: str | None
    reasons: list[tuple[str, str]]  # (host, why something was ignored or is incomplete)


def parse_line(text: str, run_dir: str) -> Record | str:
    """A record, or why the line is ignored."""
    if len(text) > LINE_LIMIT:
        return f"longer than {LINE_LIMIT} bytes"
    try:
        data = loads(text)
    except Refused as exc:
        return str(exc)
    except ValueError:
        return "not JSON"
    if not isinstance(data, dict):
        return "not a JSON object"
    path = data.get("path")
    if not isinstance(path, str):
        return "no path"
    folder, name = os.path.split(path)
    if (
        not os.path.isabs(path)
        or os.path.normpath(path) != path
        or folder != os.path.normpath(run_dir)
        or not _NAME.match(name)
    ):
        return f"{path!r} is not a file directly in the run folder {run_dir} (not followed)"
    step, sha, size, when = (data.get(k) for k in ("step", "sha256", "size", "time"))
    if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
        return f"step {step!r} is not a whole number"
    if not isinstance(sha, str) or not _SHA.match(sha):
        return "no sha256"
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return f"size {size!r} is not a byte count"
    if not isinstance(when, (int, float)) or isinstance(when, bool) or not math.isfinite(when):
        return f"time {when!r} is not a time"
    manifest = data.get("manifest")
    if manifest is not None and manifest != f"{name}{MANIFEST}":
        return f"manifest {manifest!r} is not {name}{MANIFEST}"
    return Record(name, step, sha, size, float(when), manifest)


def parse_records(text: str, run_dir: str, found: HostCheckpoints, first: int = 1) -> None:
    """Fill ``found.records`` from checkpoints.jsonl's ``text`` (lines numbered from
    ``first``): a later line for a file replaces the earlier (the file was rewritten)."""
    for number, line in enumerate(text.splitlines(), first):
        if not line.strip():
            continue
        parsed = parse_line(line, run_dir)
        if isinstance(parsed, str):
            found.reasons.append(f"{RECORDS} line {number}: {parsed}: ignored")
        else:
            found.records[parsed.name] = parsed


def gap(record: Record, host: HostCheckpoints) -> str | None:
    """Why ``host`` lacks ``record``'s checkpoint whole; None when it has it."""
    mine = host.records.get(record.name)
    if mine is None:
        return "no record of it"
    if (mine.sha256, mine.size, mine.step, mine.manifest) != (
        record.sha256, record.size, record.step, record.manifest
    ):  # fmt: skip
        return f"its copy is another one (step {mine.step}, sha256 {mine.sha256[:12]})"
    # A folder (Accelerate's save_state) is checked through its manifest, which the
    # node's listing shows (it lists files only) and whose hash the record holds.
    held = (host.files or {}).get(record.manifest or record.name)
    if held is None:
        return f"{record.manifest or 'the file'} is gone"
    if held[0] != record.size:
        return f"the file is {held[0]} bytes, its record says {record.size}"
    if held[1] > mine.time + MTIME_SLACK:
        return "the file was rewritten after its record"
    return None


def choose(hosts: Sequence[HostCheckpoints], run_dir: str) -> Found:
    """The newest checkpoint complete on every host (pure: what the hosts told)."""
    reasons = [(h.host, why) for h in hosts for why in h.reasons]
    if not hosts or any(h.files is None for h in hosts):
        return Found(None, reasons)

    def newest(record: Record) -> tuple[bool, int, float]:
        return (record.step is not None, record.step or 0, record.time)

    for record in sorted(hosts[0].records.values(), key=newest, reverse=True):
        gaps = [(h.host, gap(record, h)) for h in hosts]
        missing = [(host, why) for host, why in gaps if why is not None]
        if not missing:
            return Found(os.path.join(os.path.normpath(run_dir), record.name), reasons)
        for host, why in missing:
            reasons.append((host, f"{record.name} (step {record.step}) not complete: {why}"))
    return Found(None, reasons)


def records_size(files: list[Any] | None) -> int:
    """checkpoints.jsonl's size in a listing ([name, size, mtime] rows), 0 without it."""
    return next((int(size) for name, size, _ in files or () if name == RECORDS), 0)


def host_of(host: str, run_dir: str, files: list[Any] | None, tail: str | None) -> HostCheckpoints:
    """One host's checkpoints from its listing (None: no run folder) and the tail of its
    checkpoints.jsonl (its last TAIL bytes, decoded)."""
    found = HostCheckpoints(host)
    if files is None:
        found.reasons.append(f"no run folder {run_dir}")
        return found
    found.files = {str(n): (int(s), float(m)) for n, s, m in files}
    size = records_size(files)
    if size == 0 or tail is None:
        return found
    text = tail
    if size > TAIL:  # the first line read is a part of one: dropped
        text = text.partition("\n")[2]
        found.reasons.append(f"{RECORDS} is {size} bytes: only its last {TAIL} read")
    parse_records(text, run_dir, found, first=1 if size <= TAIL else 2)
    return found


def gather_here(run_dir: str) -> dict[str, Any]:
    """This node's listing and checkpoints.jsonl tail, as :func:`host_of` takes them
    (the supervisor's ``ready``, on the head and, through ssh.sh, on the other nodes)."""
    try:
        files = list_files(run_dir)["files"]
        size = records_size(files)
        tail = None
        if size:
            data = read_file(run_dir, RECORDS, max(0, size - TAIL), TAIL)["data"]
            tail = base64.b64decode(data).decode("utf-8", errors="replace") if data else None
    except (OSError, ValueError) as exc:  # e.g. a FIFO put there: not read, no checkpoint
        return {"error": f"{RECORDS} not read: {exc}"}
    return {"files": files, "tail": tail}
