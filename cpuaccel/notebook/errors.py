"""What ``cpuaccel.notebook.launch`` raises when its job gives no value back."""

from __future__ import annotations


class JobError(RuntimeError):
    """The job ended without a return value: ``reason`` (failed, timeout, lost, hang,
    terminated ...), ``exit_code`` (the job's, as ``cpuaccel run`` exits), ``run_id``
    and ``folder`` (the run's folder, with every rank's log)."""

    def __init__(
        self, message: str, *, reason: str, exit_code: int, run_id: str, folder: str | None
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.exit_code = exit_code
        self.run_id = run_id
        self.folder = folder


class RankError(JobError):
    """The function raised on a rank: ``rank``, ``host`` (the node, as the inventory
    names it) and ``remote_traceback`` (the traceback there, as text), which the
    message ends with."""

    def __init__(
        self,
        rank: int,
        host: str,
        remote_traceback: str,
        *,
        exit_code: int,
        run_id: str,
        folder: str | None,
    ) -> None:
        text = remote_traceback.rstrip("\n")
        super().__init__(
            f"the function raised on rank {rank} on {host} (run {run_id}):\n\n{text}",
            reason="failed",
            exit_code=exit_code,
            run_id=run_id,
            folder=folder,
        )
        self.rank = rank
        self.host = host
        self.remote_traceback = remote_traceback


class ResultRefused(JobError):
    """A rank's result file is not sealed with the run's key (changed on its node after
    the rank wrote it): ``rank`` and ``host`` name it. It was not unpickled."""

    def __init__(
        self, message: str, *, rank: int, host: str, exit_code: int, run_id: str,
        folder: str | None,
    ) -> None:  # fmt: skip
        super().__init__(
            message, reason="refused", exit_code=exit_code, run_id=run_id, folder=folder
        )
        self.rank = rank
        self.host = host
