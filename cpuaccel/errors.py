"""The errors a user can cause, and the exit codes they map to.

Every error meant for a user derives from CpuaccelError: the CLI prints its message
(one clear paragraph, no traceback) and exits with its exit_code. Anything else that
escapes is a bug and keeps its traceback.
"""

from __future__ import annotations

# Documented exit codes (docs/cli.md, "Exit codes").
EXIT_OK = 0
EXIT_PROBLEMS = 1  # the command ran and found problems of error severity
# Codes no training script is likely to use (argparse exits 2, an exception 1), so that a
# caller can tell cpuaccel's own refusals from the script's failures (sysexits.h names).
EXIT_USAGE = 64  # bad input (a file, a flag, a value): refused before anything changed
EXIT_NODE_FAILED = 69  # a node unreachable, not ready for the run, or failing its task


class CpuaccelError(Exception):
    """An error with a message written for the user."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\n  fix: {self.hint}"
        return self.message


class SourceError(CpuaccelError):
    """A file the user wrote is wrong: the message starts with its file:line.

    The base of the errors of every file cpuaccel reads (inventory, project file,
    playbook), so that one ``except SourceError`` catches a mistake in any of them.
    """

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        line: int | None = None,
        hint: str | None = None,
    ) -> None:
        where = ""
        if source is not None:
            where = f"{source}:{line}: " if line is not None else f"{source}: "
        super().__init__(f"{where}{message}", hint=hint)
        self.source = source
        self.line = line


class InventoryError(SourceError):
    """The inventory file (or --limit, or -e) is wrong. Names the file and line."""


class ProjectFileError(SourceError):
    """The project file (cpuaccel.yaml, or Accelerate's config) is wrong. Names the file
    and line."""


class UsageError(CpuaccelError):
    """A command-line argument is wrong."""


class SettingError(CpuaccelError, ValueError):
    """A rank's runtime setting is wrong: an ``init()`` argument or the CPUACCEL_*
    variable that stands for it. ``python -m cpuaccel.worker`` says it in one line and
    ends the rank with EXIT_USAGE; a ValueError still, for code that catches those."""


class HostError(CpuaccelError):
    """Something about one host (connection, host key, command) went wrong."""

    def __init__(self, host: str, message: str, *, hint: str | None = None) -> None:
        super().__init__(f"{host}: {message}", hint=hint)
        self.host = host
        self.reason = message


class NotALog(CpuaccelError):
    """A rank's log that is not a regular file (a link, a FIFO, a device, a folder):
    never read, nor followed."""


class Unreachable(HostError):
    """The host could not be connected to or authenticated against."""


class HostKeyError(Unreachable):
    """The host's key is unknown or changed: connecting could hand secrets to an impostor."""


class PreflightError(CpuaccelError):
    """Nodes failed the checks before a launch (unreachable, unlike the head, not ready,
    a stale project with sync off): no job was started. ``problems`` holds one line a
    problem, ``host: message (fix: ...)``."""

    exit_code = EXIT_NODE_FAILED

    def __init__(self, message: str, *, problems: list[str] | None = None) -> None:
        self.problems = list(problems or [])
        listed = "".join(f"\n  {line}" for line in self.problems)
        super().__init__(f"{message}{listed}")


class WaitTimeout(CpuaccelError, TimeoutError):
    """``Run.wait(timeout=...)`` ran out of time; the job goes on."""


class CommandTimeout(HostError):
    """A command did not finish within its timeout."""


class PlaybookError(SourceError):
    """The playbook is wrong (unknown module, bad argument, bad expression).

    Found before anything runs on any node; names the file, line and task.
    """


class InsecureWarning(UserWarning):
    """An API call was told to skip a safety check (host keys): said as a Python
    warning, since the API prints nothing of its own."""
