"""Checkpoints that a killed job cannot corrupt.

:func:`write_atomic` writes a temporary file in the target's folder, fsyncs it, then
renames it over the target (``os.replace``, atomic on POSIX) and fsyncs the folder: at
any moment the path holds either the previous checkpoint or the new one, whole.
Temporary files left by a save that was killed half-way are removed by the next save.

:func:`state_of` turns models (DDP-wrapped or not), optimizers and schedulers into
their ``state_dict()`` so that a checkpoint holds plain tensors and numbers.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

TEMP_MARK = ".tmp-"


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
    return f".{path.name}{TEMP_MARK}"


def write_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` so that ``path`` is never seen half-written."""
    target = Path(path)
    folder = target.parent
    folder.mkdir(parents=True, exist_ok=True)
    prefix = _temp_prefix(target)
    for stale in folder.glob(f"{prefix}*"):  # left by a save that was killed
        with contextlib.suppress(OSError):
            stale.unlink()
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
