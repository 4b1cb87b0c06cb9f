"""One recorded run as a row: what ``cpuaccel ps --json`` prints and the dashboard's
``/api/runs`` serves (one home, so the two never disagree)."""

from __future__ import annotations

from typing import Any

from cpuaccel.runs.records import ENDED, RunRecord, last_metrics


def script_of(record: dict[str, Any]) -> str:
    """The script (or -m module) a run ran: the words after rank.sh in its command (a
    submitted run that has not started yet: the script `cpuaccel submit` was given)."""
    words = [str(w) for w in record.get("command") or []]
    if not words and isinstance(record.get("script"), list) and record["script"]:
        return str(record["script"][0])
    for i, word in enumerate(words):
        if word.endswith("/rank.sh") or word == "rank.sh":
            rest = words[i + 1 :]
            return " ".join(rest[:2] if rest[:1] == ["-m"] else rest[:1]) or "?"
    return "?"


def number(value: Any) -> float | None:
    """``value`` as a float when it is a JSON number (not a bool), else None."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def row(run: RunRecord, now: float) -> dict[str, Any]:
    status, record = run.status or {}, run.record
    state = run.state()
    started = number(status.get("started")) or number(record.get("started"))
    ended = number(status.get("ended"))
    if ended is None and state in ENDED and started is not None:
        seconds = number(record.get("seconds"))
        ended = started + seconds if seconds is not None else number(record.get("updated"))
    step, loss = last_metrics(run.path)
    hosts = run.hosts
    return {
        "id": run.run_id,
        "script": script_of(record),
        "nodes": len(hosts) or int(number(record.get("nodes")) or 0),  # submitted: asked
        "ppn": record.get("ppn"),
        "hosts": hosts,
        "state": state,
        "exit_code": run.exit_code(),
        "detached": run.detached,
        "started": started,
        "ended": ended,
        "seconds": round((ended or now) - started, 1) if started is not None else None,
        "step": step,
        "loss": number(loss),
        "restarts": restarts(record, state, run.status),
        "slurm": slurm_of(run),
    }


def slurm_of(run: RunRecord) -> dict[str, Any] | None:
    """A submitted run's Slurm job: its id, and its state when Slurm was asked."""
    if run.job_id is None:
        return None
    known = run.slurm
    return {
        "job_id": run.job_id,
        "state": known.state if known else None,
        "exit_code": known.exit_code if known else None,
        "reason": known.reason if known else None,
    }


def restarts(record: dict[str, Any], state: str, status: dict[str, Any] | None = None) -> int:
    """How many times run --max-restarts restarted it: run.json's attempts (a detached
    run's: status.json's, its supervisor's record) are those that ended (a running run
    is in the one after them)."""
    ended = record.get("attempts", (status or {}).get("attempts"))
    count = len(ended) if isinstance(ended, list) else 0
    return count if state == "running" else max(0, count - 1)
