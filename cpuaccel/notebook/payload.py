"""A notebook's function and its arguments as one run file, and the names of the files
each rank leaves in the run folder.

The call is pickled with cloudpickle, which pickles a function defined in the kernel
(``__main__``) by value: its code, and the globals it uses, travel with it; a function
or class of an importable module travels by name and is imported on the rank. The
bytes are base64 text, as every run file is text. Both sides use this module: the
controller to write the call, each rank to read it; the standard library and
cloudpickle only.

A return value comes back to the controller sealed: an HMAC-SHA256 of the rank's
number and the pickle, under a key the controller made for the run (it reaches the
ranks in secret.env, never in argv, a log or a record), is checked before the pickle
is loaded. A result file changed on its node, by anyone without the key, is refused
unread.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

CALL = "notebook-call.b64"  # the run file holding the call
KEY_ENV = "CPUACCEL_NOTEBOOK_KEY"  # the run's key, hex, in the ranks' secret.env
KEY_BYTES = 32
TAG_BYTES = 32  # an HMAC-SHA256, ahead of the pickle in a result file


class Unsealed(ValueError):
    """A result file whose seal is not the run key's: never unpickled."""


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


def new_key() -> str:
    """A run's key (hex), made on the controller."""
    import secrets

    return secrets.token_hex(KEY_BYTES)


def _tag(key: str, rank: int, data: bytes) -> bytes:
    import hashlib
    import hmac

    mac = hmac.new(bytes.fromhex(key), b"rank %d\n" % rank, hashlib.sha256)
    mac.update(data)  # not joined first: a value may be large
    return mac.digest()


def seal(key: str, rank: int, data: bytes) -> bytes:
    """Rank ``rank``'s pickled value as its result file holds it: the tag, then ``data``."""
    return _tag(key, rank, data) + data


def unseal(key: str, rank: int, sealed: bytes) -> bytes:
    """The pickle of rank ``rank``'s result file, once its tag is checked; Unsealed if
    the tag is not the one ``key`` gives (changed, forged or another rank's)."""
    import hmac

    tag, data = sealed[:TAG_BYTES], sealed[TAG_BYTES:]
    if len(tag) < TAG_BYTES or not hmac.compare_digest(tag, _tag(key, rank, data)):
        raise Unsealed("its HMAC is not the run key's")
    return data


def value_of(data: bytes) -> Any:
    """A value from the pickle ``unseal`` gave back (never from a file's bytes as such)."""
    import pickle

    return pickle.loads(data)
