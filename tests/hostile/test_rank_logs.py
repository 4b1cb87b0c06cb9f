"""`cpuaccel logs` on hostile rank logs: a line of 80 MiB without a newline is shown cut,
with how many bytes were left out, in bounded time and memory; a rank log that is a FIFO
or a symbolic link is named in one line and not read (the link's target never shown),
and the other ranks' logs are shown (a detached run's, read from its head over ssh:
tests/cluster/test_ps_logs_fetch.py)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from cpuaccel.history.rank_logs import LINE_BYTES
from testsupport.command import cpuaccel_argv, inherited_env

RUN_ID = "20260101-000000-abcdef"
HUGE = 80 << 20  # bytes of the line without end
SECONDS = 15.0  # `logs` on it; reading it whole and printing it takes minutes
MAX_RSS_MIB = 160  # the process's peak; the line alone, held whole, is 80 MiB


# Run before the command line: its peak resident memory (KiB) written at its exit.
_PEAK = (
    "import atexit\n"
    "def _peak():\n"
    "    for line in open('/proc/self/status'):\n"
    "        if line.startswith('VmHWM:'):\n"
    "            open({path!r}, 'w').write(line.split()[1])\n"
    "atexit.register(_peak)"
)


def run_folder(tmp_path: Path, world: int) -> Path:
    """runs/RUN_ID of a finished run of ``world`` ranks on one node, as run.json says."""
    folder = tmp_path / "runs" / RUN_ID
    folder.mkdir(parents=True, mode=0o700)
    record = {
        "run_id": RUN_ID, "hosts": ["node1"], "ppn": world, "world": world,
        "started": time.time() - 5, "updated": time.time(), "exit_code": 0,
        "reason": "completed", "command": ["python", "train.py"],
    }  # fmt: skip
    (folder / "run.json").write_text(json.dumps(record))
    return folder


def logs(tmp_path: Path, *args: str, timeout: float = 120) -> tuple[int, str, str, float, int]:
    """``cpuaccel logs ARGS``: exit code, stdout, stderr, seconds, and its peak RSS in
    KiB (output to files: no pipe to drain meanwhile). The peak is the process's own
    VmHWM, written as it exits: wait4's ru_maxrss would count the pytest worker's memory
    that the child held between fork and exec."""
    out_path, err_path = tmp_path / "logs.out", tmp_path / "logs.err"
    peak_path = tmp_path / "logs.peak"
    started = time.monotonic()
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(
            cpuaccel_argv("logs", *args, prelude=_PEAK.format(path=str(peak_path))),
            cwd=tmp_path, env=inherited_env(), stdout=out, stderr=err,
        )  # fmt: skip
    while True:
        pid, status = os.waitpid(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() - started > timeout:
            proc.kill()
            os.waitpid(proc.pid, 0)
            raise AssertionError(f"cpuaccel logs {' '.join(args)}: still running after {timeout} s")
        time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    seconds = time.monotonic() - started
    text = (out_path.read_bytes().decode(errors="replace"), err_path.read_text(errors="replace"))
    peak = int(peak_path.read_text()) if peak_path.exists() else 0
    return proc.returncode, *text, seconds, peak


def test_a_line_without_end_is_shown_cut_in_bounded_time_and_memory(tmp_path: Path) -> None:
    folder = run_folder(tmp_path, 2)
    with (folder / "rank-0.log").open("wb") as f:  # sparse: written at once
        f.write(b"start ")
        f.truncate(HUGE)
    (folder / "rank-1.log").write_bytes(b"rank one\n" + b"y" * (LINE_BYTES + 10) + b"\nend\n")
    code, out, err, seconds, rss = logs(tmp_path)
    assert code == 0, err
    *lines, cut = out.splitlines()  # the line without end comes last, as it is so far
    assert cut.startswith("[rank 0 node1] start \\x00\\x00"), cut[:80]
    left = HUGE - LINE_BYTES
    assert cut.endswith(f" [... {left} more bytes of this line left out]"), cut[-80:]
    assert len(cut) < 5 * LINE_BYTES  # the kept bytes alone, each as its code
    # An ended line longer than LINE_BYTES is cut too; the lines after it are whole.
    assert lines == [
        "[rank 1 node1] rank one",
        "[rank 1 node1] " + "y" * LINE_BYTES + " [... 10 more bytes of this line left out]",
        "[rank 1 node1] end",
    ]
    assert seconds < SECONDS, seconds
    assert 0 < rss < MAX_RSS_MIB * 1024, rss
    print(f"logs on an {HUGE >> 20} MiB line: {seconds:.2f} s, peak RSS {rss // 1024} MiB")


def test_a_fifo_or_a_link_for_a_rank_log_is_named_and_the_others_are_shown(
    tmp_path: Path,
) -> None:
    folder = run_folder(tmp_path, 4)
    os.mkfifo(folder / "rank-0.log", 0o600)  # no writer: a read would wait for ever
    secret = tmp_path / "private.txt"
    secret.write_text("PRIVATE KEY MATERIAL\n")
    (folder / "rank-1.log").symlink_to(secret)
    (folder / "rank-2.log").write_text("rank two was here\n")
    (folder / "rank-3.log").symlink_to(tmp_path / "nowhere")  # a dangling link
    code, out, err, seconds, _ = logs(tmp_path, timeout=60)
    assert code == 0, err
    assert out == "[rank 2 node1] rank two was here\n"
    assert "PRIVATE" not in out + err
    said = err.splitlines()
    assert said == [
        f"warning: rank 0: {folder}/rank-0.log: a FIFO, not a log: not read",
        f"warning: rank 1: {folder}/rank-1.log: a symbolic link, not a log: not read",
        f"warning: rank 3: {folder}/rank-3.log: a symbolic link, not a log: not read",
    ], err
    assert seconds < 30, seconds
    # A rank asked for alone is refused the same way, and nothing traces back.
    code, out, err, _, _ = logs(tmp_path, "--rank", "0", timeout=60)
    assert (code, out) == (0, ""), err
    assert "Traceback" not in err and "a FIFO, not a log" in err
