"""Checkpoints that a killed job cannot corrupt.

:func:`write_atomic` writes a temporary file in the target's folder, fsyncs it, then
renames it over the target (``os.replace``, atomic on POSIX) and fsyncs the folder: at
any moment the path holds either the previous checkpoint or the new one, whole.
Temporary files left by a save that was killed half-way are removed by the next save
on the same host (their names carry host and pid: nodes that share the folder, e.g. over
NFS, each write their own temporary file and never remove another's).

:func:`record` appends the saved file's line to ``checkpoints.jsonl`` in the run folder
(path, step, sha256, size, time, rank, host): what the controller reads to pick the
newest checkpoint that every node has (``cpuaccel.jobs.resume``).

:func:`state_of` turns models (DDP-wrapped or not), optimizers and schedulers into
their ``state_dict()`` so that a checkpoint holds plain tensors and numbers.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

TEMP_MARK = ".tmp-"
RECORDS = "checkpoints.jsonl"  # in the run folder, one line a saved checkpoint
MANIFEST = ".manifest.json"  # beside a recorded folder: what it holds (name, size, sha256)
# Accelerate's save_state writes each process's RNG state into the folder: each node
# holds its own ranks' files only, so they are no part of what must be equal everywhere.
PER_PROCESS = re.compile(r"^random_states_[0-9]+\.pkl$")


def unwrap(model: Any) -> Any:
    """The user's module inside DDP (or any wrapper with ``.module``)."""
    while isinstance(model, nn.parallel.DistributedDataParallel):
        model = model.module
    return model


def state_of(value: Any) -> Any:
    """``value.state_dict()`` for anything that has one, else ``value`` itself."""
    value = unwrap(value)
    if hasattr(value, "state_dict") and callable(value.state_dict):
        return value.state_dict()
    return value


def to_bytes(state: Mapping[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save({key: state_of(value) for key, value in state.items()}, buffer)
    return buffer.getvalue()


def _temp_prefix(path: Path) -> str:
    return f".{path.name}{TEMP_MARK}{socket.gethostname()}-"


def _remove_stale(folder: Path, prefix: str) -> None:
    """Remove this host's temporary files whose writer is gone (killed mid-save)."""
    for stale in folder.glob(f"{prefix}*"):
        pid = stale.name[len(prefix) :]
        if pid.isdigit() and int(pid) != os.getpid() and _alive(int(pid)):
            continue  # another save in progress on this host
        with contextlib.suppress(OSError):
            stale.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's process: alive
    return True


def write_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` so that ``path`` is never seen half-written."""
    target = Path(path)
    folder = target.parent
    folder.mkdir(parents=True, exist_ok=True)
    prefix = _temp_prefix(target)
    _remove_stale(folder, prefix)
    temp = folder / f"{prefix}{os.getpid()}"
    try:
        with open(temp, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    _fsync_folder(folder)
    return target


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems do not fsync folders
    finally:
        os.close(fd)


def from_bytes(data: bytes, *, weights_only: bool = True) -> dict[str, Any]:
    loaded = torch.load(io.BytesIO(data), map_location="cpu", weights_only=weights_only)
    if not isinstance(loaded, dict):
        raise TypeError(f"not a cpuaccel checkpoint (a {type(loaded).__name__}, not a dict)")
    return loaded


def restore(state: Mapping[str, Any], targets: Mapping[str, Any]) -> None:
    """``target.load_state_dict(state[name])`` for each named target."""
    missing = [name for name in targets if name not in state]
    if missing:
        raise KeyError(
            f"checkpoint has no {', '.join(missing)} (it has: {', '.join(sorted(state))})"
        )
    for name, target in targets.items():
        unwrap(target).load_state_dict(state[name])


def record_line(path: Path, data: bytes, *, step: int | None, rank: int) -> dict[str, Any]:
    """The checkpoints.jsonl line of ``data`` just saved at ``path`` (absolute)."""
    return {
        "path": str(path),
        "step": step,
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "time": time.time(),
        "rank": rank,
        "host": socket.gethostname(),
    }


def record(run_dir: str | os.PathLike[str], line: Mapping[str, Any]) -> None:
    """Append ``line`` to the run folder's checkpoints.jsonl: one write of one line with
    O_APPEND, so that lines of several writers never interleave; never through a link."""
    text = (json.dumps(line, sort_keys=True) + "\n").encode()
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(Path(run_dir) / RECORDS, flags, 0o644)
    try:
        os.write(fd, text)
        os.fsync(fd)
    finally:
        os.close(fd)


def step_of(state: Mapping[str, Any]) -> int | None:
    """The ``step`` saved with a checkpoint, when it is a number (the record's step)."""
    value = state.get("step")
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        return int(value.item())
    return None


def fetch(path: Path, is_main: bool, world_size: int) -> bytes:
    """Rank 0's bytes of ``path`` on every rank: a rank whose node has the same file
    (same sha256) reads its own copy; the others get rank 0's over the process group."""
    data: bytes | None = None
    head: list[Any] = [None, None]
    if is_main:
        try:
            data = path.read_bytes()
            head = [hashlib.sha256(data).hexdigest(), None]
        except OSError as exc:
            head = [None, f"{type(exc).__name__}: {exc}"]
    dist.broadcast_object_list(head, src=0)
    digest, error = head
    if error is not None:
        raise RuntimeError(f"loading {path} failed on rank 0: {error}")
    if not is_main:
        with contextlib.suppress(OSError):
            local = path.read_bytes()
            if hashlib.sha256(local).hexdigest() == digest:
                data = local
    wanted: list[Any] = [None] * world_size
    dist.all_gather_object(wanted, data is None)
    if any(wanted):
        box: list[Any] = [data if is_main else None]
        dist.broadcast_object_list(box, src=0)
        if data is None:
            data = box[0]
    assert data is not None
    return data


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as data:
        for chunk in iter(lambda: data.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def manifest(folder: Path) -> bytes:
    """The files of a checkpoint folder (relative name, size, sha256), links left out."""
    entries = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            full = Path(root) / name
            if (root == str(folder) and PER_PROCESS.match(name)) or not full.is_file():
                continue
            if full.is_symlink():
                continue
            rel = full.relative_to(folder).as_posix()
            entries.append([rel, full.stat().st_size, _digest(full)])
    return json.dumps(entries).encode()


def record_checkpoint(
    path: str | os.PathLike[str], *, step: int | None = None
) -> dict[str, Any] | None:
    """Record a checkpoint the script wrote itself, so that a restarted ``cpuaccel run``
    can resume from it ($CPUACCEL_RESUME), as it does from ``ctx.save``'s.

    For a file, or a folder such as Accelerate's ``accelerator.save_state(folder)``
    writes (with ``ProjectConfiguration(save_on_each_node=True)``: a copy on every
    node). Call it on every rank after the save; each node's local rank 0 appends the
    line to its checkpoints.jsonl (for a folder, after writing ``<folder>.manifest.json``
    beside it, which the line describes). Outside ``cpuaccel run`` it does nothing.
    Returns the line written, or None.
    """
    from cpuaccel.runtime.env import DistEnv

    env = DistEnv.from_environ()
    if env.run_dir is None or env.local_rank != 0:
        return None
    target = Path(path).absolute()
    if target.is_dir():
        listed = manifest(target)
        name = f"{target.name}{MANIFEST}"
        write_atomic(target.parent / name, listed)
        line = {**record_line(target, listed, step=step, rank=env.rank), "manifest": name}
    else:
        line = record_line(target, target.read_bytes(), step=step, rank=env.rank)
    record(env.run_dir, line)
    return line
