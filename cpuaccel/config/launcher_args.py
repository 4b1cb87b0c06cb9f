"""``--launcher-args`` / the project file's ``launcher_args``: extra words for mpirun.

As DeepSpeed's ``--launcher_args``: the text is split as a POSIX shell would
(``shlex.split``) on the controller, and every word reaches mpirun as one argv word of
its own (rendered through the one ``quote`` filter), never re-joined into a shell
string. Words that would replace what cpuaccel decides itself (the hosts, the number of
ranks, ranks per node) are refused with the cpuaccel flag that sets it, since mpirun
would take the last of two contradicting values, or refuse them, far from where the
user typed them.
"""

from __future__ import annotations

import shlex
from typing import Any

# mpirun's options (hydra's and Open MPI's spellings) for what cpuaccel owns -> the
# cpuaccel spelling.
_HOSTS = "-i INVENTORY (with --limit / --nodes)"
_WORLD = "--nodes and --ppn (ranks = nodes x ppn)"
OWNED: dict[str, str] = {
    "-n": _WORLD,
    "-np": _WORLD,
    "--np": _WORLD,
    "--n": _WORLD,
    "-c": _WORLD,
    "-ppn": "--ppn",
    "-perhost": "--ppn",
    "-npernode": "--ppn",
    "--npernode": "--ppn",
    "-N": "--ppn",
    "--map-by": "--ppn",
    "-f": _HOSTS,
    "-hostfile": _HOSTS,
    "--hostfile": _HOSTS,
    "-machinefile": _HOSTS,
    "--machinefile": _HOSTS,
    "-host": _HOSTS,
    "--host": _HOSTS,
    "-hosts": _HOSTS,
    "-H": _HOSTS,
}


class OwnedWord(ValueError):
    """A word for what cpuaccel decides itself; ``flag`` is the cpuaccel spelling."""

    def __init__(self, word: str, flag: str) -> None:
        super().__init__(f"{word!r} is set by cpuaccel: use {flag} instead")
        self.flag = flag


def split(value: Any) -> tuple[str, ...]:
    """The words of a ``--launcher-args`` text (or a project file's list of words);
    ValueError saying what is wrong."""
    if isinstance(value, str):
        try:
            words = shlex.split(value)
        except ValueError as exc:  # "No closing quotation", "No escaped character"
            raise ValueError(f"cannot be split into words as a shell would: {exc}") from None
    elif isinstance(value, list) and all(isinstance(w, str) for w in value):
        words = list(value)
    else:
        raise ValueError(f"must be a string of mpirun options, got {value!r}")
    for word in words:
        owned = OWNED.get(word.split("=", 1)[0])
        if owned is not None:
            raise OwnedWord(word, owned)
    return tuple(words)
