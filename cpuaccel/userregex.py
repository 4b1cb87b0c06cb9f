"""A user's regular expression, run where it cannot hang cpuaccel.

Python's regular expressions can backtrack for hours (``(a+)+$`` on a long run of
``a``), and only a process's main thread can interrupt one: the engine looks for signals
as it backtracks, and cpuaccel runs patterns in any thread. So a user's pattern runs in a
process of its own, started at its first use and kept, one request at a time. Its memory
is bounded, and its own alarm ends a request that runs past its time: it then answers
"late" and stays for the next one. Templates' ``regex_replace`` (cpuaccel.templating) and
host patterns' ``~regex`` (cpuaccel.inventory.patterns) run here.

The process reads and writes length-prefixed UTF-8: "OP SECONDS LEN LEN LEN\\n" and the
pattern and two texts; "ok|late|error LEN\\n" and the result or the error. OP ``sub`` is
``re.sub(pattern, replacement, text)``; OP ``match`` takes names, each written as its
length, ":" and itself, and answers a "1" or "0" a name: whether ``re.match`` (anchored
at the start) finds it.
"""

from __future__ import annotations

import select
import subprocess
import sys
import threading
from collections.abc import Sequence

__all__ = ["SECONDS", "RegexRefused", "match", "sub"]

SECONDS = 5.0  # a request's time, unless its caller gives another

_PROGRAM = r"""
import re, resource, signal, sys
class Late(Exception):
    pass
def late(*_):
    raise Late
def names(text):
    at = 0
    while at < len(text):
        colon = text.index(":", at)
        end = colon + 1 + int(text[at:colon])
        yield text[colon + 1 : end]
        at = end
def run(op, pattern, arg, text):
    if op == b"match":
        found = re.compile(pattern).match
        return "".join("1" if found(name) else "0" for name in names(text))
    return re.sub(pattern, arg, text)
signal.signal(signal.SIGALRM, late)
resource.setrlimit(resource.RLIMIT_AS, (%d, %d))
read, write = sys.stdin.buffer, sys.stdout.buffer
while True:
    head = read.readline()
    if not head:
        break
    op, seconds, *sizes = head.split()
    pattern, arg, text = (read.read(int(n)).decode("utf-8", "surrogatepass") for n in sizes)
    try:
        signal.setitimer(signal.ITIMER_REAL, float(seconds))
        try:
            status, out = b"ok", run(op, pattern, arg, text).encode("utf-8", "surrogatepass")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except Late:
        status, out = b"late", b""
    except Exception as exc:
        status, out = b"error", ("%%s: %%s" %% (type(exc).__name__, exc)).encode()
    write.write(status + b" %%d\n" %% len(out) + out)
    write.flush()
"""
MEMORY = 2 * 1024**3  # bytes of address space the regex process may take


class RegexRefused(Exception):
    """A request the regex process did not answer with a result. ``kind`` says why:
    "late" (past its time), "large" (a result over the caller's bound), "gone" (the
    process gave no answer) or "error" (``re``'s own error, the message)."""

    def __init__(self, kind: str, message: str = "") -> None:
        super().__init__(message or kind)
        self.kind = kind


class _RegexProcess:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None

    def ask(self, op: str, texts: tuple[str, str, str], seconds: float, max_bytes: int) -> str:
        parts = [x.encode("utf-8", "surrogatepass") for x in texts]
        head = f"{op} {seconds:g} " + " ".join(str(len(x)) for x in parts) + "\n"
        with self._lock:
            proc = self._started()
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(head.encode() + b"".join(parts))
                proc.stdin.flush()
                # Its alarm answers within its time; this wait is for a process gone wrong.
                ready, _, _ = select.select([proc.stdout], [], [], seconds + 10.0)
                answer = proc.stdout.readline().split() if ready else []
                status, size = answer[0], int(answer[1])
                if size > max_bytes:
                    # The answer stays unread in the pipe: the process cannot be kept.
                    self._end()
                    raise RegexRefused("large")
                out = proc.stdout.read(size)
            except (OSError, ValueError, IndexError):
                self._end()
                raise RegexRefused("gone") from None
        if status == b"late":
            raise RegexRefused("late")
        if status != b"ok":
            raise RegexRefused("error", out.decode(errors="replace"))
        return out.decode("utf-8", "surrogatepass")

    def _started(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _PROGRAM % (MEMORY, MEMORY)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        return self._proc

    def _end(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None


_PROCESS = _RegexProcess()


def sub(pattern: str, replacement: str, text: str, seconds: float, max_bytes: int) -> str:
    """``re.sub(pattern, replacement, text)`` in the regex process; RegexRefused when it
    runs past ``seconds`` or its result would be more than ``max_bytes`` of UTF-8."""
    return _PROCESS.ask("sub", (pattern, replacement, text), seconds, max_bytes)


def match(pattern: str, names: Sequence[str], seconds: float) -> list[bool]:
    """Whether ``re.match(pattern, name)`` finds each of ``names``, in the regex process;
    RegexRefused when it runs past ``seconds``."""
    listed = "".join(f"{len(name)}:{name}" for name in names)
    flags = _PROCESS.ask("match", (pattern, "", listed), seconds, len(names))
    if len(flags) != len(names):
        raise RegexRefused("gone")
    return [flag == "1" for flag in flags]
