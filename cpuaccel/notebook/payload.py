"""A notebook's function and its arguments as one run file, and the names of the files
each rank leaves in the run folder.

The call is pickled with cloudpickle, which pickles a function defined in the kernel
(``__main__``) by value: its code, and the globals it uses, travel with it; a function
or class of an importable module travels by name and is imported on the rank. The
bytes are base64 text, as every run file is text. Both sides use this module: the
controller to write the call, each rank to read it; the standard library and
cloudpickle only.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

CALL = "notebook-call.b64"  # the run file holding the call


def result_name(rank: int) -> str:
    """The file rank ``rank`` writes its pickled return value to."""
    return f"notebook-result-{rank}.pkl"


def error_name(rank: int) -> str:
    """The file rank ``rank`` writes its traceback to when the function raised."""
    return f"notebook-error-{rank}.txt"


@dataclass(frozen=True)
class Call:
    """What each rank runs: ``fn(*args)``; with ``gather`` every rank's return value is
    kept, else rank 0's alone."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    gather: bool = False


def dumps(call: Call) -> str:
    """The call as base64 text (cloudpickle's errors, e.g. an open file among the
    arguments, are raised as they are)."""
    import cloudpickle

    return base64.b64encode(cloudpickle.dumps(call)).decode("ascii")


def loads(text: str) -> Call:
    import pickle

    call = pickle.loads(base64.b64decode(text))
    if not isinstance(call, Call):
        raise TypeError(f"{CALL} holds a {type(call).__name__}, not a notebook call")
    return call


def value_bytes(value: Any) -> bytes:
    """A return value, pickled (by cloudpickle: a function or a class defined in the
    function comes back too)."""
    import cloudpickle

    return bytes(cloudpickle.dumps(value))


def value_of(data: bytes) -> Any:
    import pickle

    return pickle.loads(data)
