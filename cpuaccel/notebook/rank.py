"""The rank side of ``cpuaccel.notebook.launch``: ``python -m cpuaccel.worker -m
cpuaccel.notebook.rank``, what every rank of a notebook's job runs.

It reads the call from ``$CPUACCEL_RUN_DIR`` (a run file of the job), runs it, and
leaves its outcome in the run folder for the controller to read once the job has
ended: the pickled return value (rank 0's, or every rank's when gathered), or the
function's traceback, which is also printed on stderr as a script's would be. A rank
whose function raised exits 1, so the job ends as a failing script's does. Inside the
function ``cpuaccel.init()`` works as in a script: the rank's environment is the one
the worker set up. The standard library and cloudpickle only.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import traceback
from typing import Any

from cpuaccel.notebook import payload


def write(run_dir: str, name: str, data: bytes) -> None:
    """``name`` in the run folder (0700), whole or not at all: written under a hidden
    name (never listed nor read), created 0600 and new (never through a link), and
    renamed."""
    hidden = os.path.join(run_dir, f".{name}.{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(hidden)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(hidden, flags, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(hidden, os.path.join(run_dir, name))


def remove(run_dir: str, name: str) -> None:
    """An earlier attempt's file of this rank (a restarted job), if any."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(run_dir, name))


def failure(exc: BaseException) -> str:
    """The traceback from the function's own frame on (this module's frame left out)."""
    tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
    return "".join(traceback.format_exception(type(exc), exc, tb))


def run(run_dir: str, rank: int, key: str) -> int:
    """Run the call of ``run_dir`` as rank ``rank``, its value sealed with ``key``; the
    rank's exit code."""
    remove(run_dir, payload.result_name(rank))
    remove(run_dir, payload.error_name(rank))
    try:
        with open(os.path.join(run_dir, payload.CALL)) as f:
            call = payload.loads(f.read())
        value: Any = call.fn(*call.args)
        kept = rank == 0 or call.gather
        data = payload.value_bytes(value) if kept else b""
    except KeyboardInterrupt:  # the job is being ended: nothing to report
        raise
    except BaseException as exc:  # SystemExit too: the function's end, as it chose it
        text = failure(exc)
        sys.stderr.write(text)
        sys.stderr.flush()
        write(run_dir, payload.error_name(rank), text.encode("utf-8", errors="replace"))
        return 1
    if kept:
        write(run_dir, payload.result_name(rank), payload.seal(key, rank, data))
    return 0


def main() -> int:
    run_dir = os.environ.get("CPUACCEL_RUN_DIR")
    if not run_dir:
        print("cpuaccel.notebook.rank: CPUACCEL_RUN_DIR is not set", file=sys.stderr)
        return 2
    # Taken out of the environment: what the function starts does not inherit it.
    key = os.environ.pop(payload.KEY_ENV, "")
    if not re.fullmatch(f"[0-9a-f]{{{2 * payload.KEY_BYTES}}}", key):
        print(f"cpuaccel.notebook.rank: {payload.KEY_ENV} is not set", file=sys.stderr)
        return 2
    return run(run_dir, int(os.environ.get("RANK", "0")), key)


if __name__ == "__main__":
    sys.exit(main())
