"""A rank's escape sequences are shown, never obeyed: a real run on this machine whose
rank prints OSC 52 (write the clipboard), OSC 8 (a disguised link), a title change,
cursor movement over an earlier line, a carriage return and a C1 CSI, on stdout and
stderr. ``cpuaccel run``, ``cpuaccel logs`` and ``cpuaccel ps`` print each as its code
(no control character but the newline and the tab reaches the terminal; with colour on,
rich's own SGR alone); the rank's log keeps the bytes as the rank wrote them."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
from pathlib import Path

from testsupport.command import clean_env, cpuaccel, cpuaccel_argv

HOSTILE = r"""
import sys
print("clip \x1b]52;c;SGVsbG8=\x07 end", flush=True)
print("link \x1b]8;;https://evil.example/\x1b\\docs\x1b]8;;\x1b\\ end", flush=True)
print("title \x1b]0;owned\x07 end", flush=True)
print("FAILED 3 tests\r\x1b[1A\x1b[2Kall PASSED", flush=True)
print("c1 \x9b2J end", flush=True)
print("err \x1b]52;c;ZXJy\x07 end", file=sys.stderr, flush=True)
"""
SHOWN = [
    "clip \\x1b]52;c;SGVsbG8=\\x07 end",
    "link \\x1b]8;;https://evil.example/\\x1b\\docs\\x1b]8;;\\x1b\\ end",
    "title \\x1b]0;owned\\x07 end",
    "FAILED 3 tests\\x0d\\x1b[1A\\x1b[2Kall PASSED",
    "c1 \\x9b2J end",
]
RAW = [
    b"clip \x1b]52;c;SGVsbG8=\x07 end",
    b"FAILED 3 tests\r\x1b[1A\x1b[2Kall PASSED",
    "c1 \x9b2J end".encode(),
    b"err \x1b]52;c;ZXJy\x07 end",
]
SGR = re.compile(r"\x1b\[[0-9;]*m")


def terminal_controls(text: str) -> list[str]:
    return re.findall(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", text)


def on_a_terminal(cwd: Path, env: dict[str, str], *args: str) -> str:
    """What ``cpuaccel ARGS`` writes on a pseudo-terminal (stdout and stderr both)."""
    main, side = pty.openpty()
    with subprocess.Popen(
        cpuaccel_argv(*args), cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=side,
        stderr=side,
    ) as proc:  # fmt: skip
        os.close(side)
        chunks = []
        while True:
            try:
                data = os.read(main, 65536)
            except OSError:  # EIO: the terminal's other side closed
                break
            if not data:
                break
            chunks.append(data)
        assert proc.wait(timeout=60) == 0
    os.close(main)
    return b"".join(chunks).decode(errors="replace")


def test_a_ranks_escapes_are_shown_by_run_logs_and_ps_and_kept_in_its_log(
    tmp_path: Path,
) -> None:
    (tmp_path / "evil.py").write_text(HOSTILE)
    env = clean_env()
    ran = cpuaccel("run", "--nodes", "1", "--ppn", "1", "evil.py", cwd=tmp_path, env=env,
                   timeout=120)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    for printed in (ran.stdout, ran.stderr):
        assert terminal_controls(printed) == [], printed
    for line in SHOWN:
        assert line in ran.stdout, ran.stdout
    assert "err \\x1b]52;c;ZXJy\\x07 end" in ran.stderr

    (run,) = (tmp_path / "runs").iterdir()
    log = (run / "rank-0.log").read_bytes()
    for raw in RAW:  # the log is byte-exact
        assert raw in log, log

    logs = cpuaccel("logs", cwd=tmp_path, env=env)
    assert logs.returncode == 0, logs.stderr
    assert terminal_controls(logs.stdout + logs.stderr) == [], logs.stdout
    for line in [*SHOWN, "err \\x1b]52;c;ZXJy\\x07 end"]:
        assert line in logs.stdout, logs.stdout

    # On a terminal, in colour: rich's own SGR codes are the only escapes.
    on_tty = on_a_terminal(tmp_path, {k: v for k, v in env.items() if k != "NO_COLOR"}, "logs")
    assert SGR.search(on_tty), on_tty  # colour is really on
    plain = SGR.sub("", on_tty).replace("\r\n", "\n")  # the tty's own line ends
    assert terminal_controls(plain) == [], on_tty
    assert "clip \\x1b]52;c;SGVsbG8=\\x07 end" in plain

    # What `ps` lists (the run's record) is shown the same way.
    record = json.loads((run / "run.json").read_text())
    record["command"][-1] = "evil\x1b]0;owned\x07\x1b[1A.py"
    (run / "run.json").write_text(json.dumps(record))
    listed = cpuaccel("ps", cwd=tmp_path, env=env)
    assert listed.returncode == 0, listed.stderr
    assert terminal_controls(listed.stdout + listed.stderr) == [], listed.stdout
    assert "\\x1b]0;owned\\x07\\x1b[1A" in listed.stdout, listed.stdout
