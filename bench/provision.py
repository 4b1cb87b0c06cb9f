"""Provision: a no-op re-run of the default playbook, `cpuaccel provision` against
`ansible-playbook` running the same task list (bench/provision_ansible.yaml), on 1 and 8
real nodes.

The bench brings up its own namespace cluster, provisions every node once (the warm-up:
torch into a venv per node, several minutes), checks that both tools then report
changed=0, and times --repeat re-runs of each, as a user would type them, start-up
included. Both tools read the same inventory (Ansible's format) with the same variables:
the node's venv in its private dir, the system Python as the module interpreter, the
repo's wheelhouse. Ansible runs with -f 16 and ANSIBLE_PIPELINING=True (its fastest
common setting); everything else is its defaults, fact gathering included (cpuaccel
gathers facts too). Nothing reaches a package index: PIP_NO_INDEX=1, and the nodes
install from the pushed wheelhouse.

    make wheelhouse    # once: the wheels the nodes install from
    sudo .venv/bin/python bench/provision.py [--nodes 8] [--repeat 5]

ansible-core is installed into bench/.venv-ansible for the benchmark only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ansible_venv import ensure_ansible

from cpuaccel.playbook.wheels import STAMP_NAME
from cpuaccel.testbed.cluster import Cluster
from cpuaccel.testbed.netns import NODE_DIR

ROOT = Path(__file__).resolve().parent.parent
ANSIBLE_PLAYBOOK = ROOT / "bench" / "provision_ansible.yaml"
WHEELHOUSE = ROOT / ".wheelhouse" / "upstream"  # what `make wheelhouse` fills
CLUSTER_ID = 12  # apart from the tests' (0) and the other benches' clusters
# The module interpreter on the nodes: a fresh node's Python, not the controller's venv.
NODE_PYTHON = "/usr/bin/python3"
ANSIBLE_FORKS = 16
TARGET_VS_ANSIBLE = 0.3
TARGET_SCALING = 2.0
# Someone editing cpuaccel's code while the bench runs changes its self wheel, and the
# next run of either tool pushes and installs it: such a run is no no-op and is retried.
MAX_ATTEMPTS_PER_SAMPLE = 3

_RECAP = re.compile(
    r"^(\S+)\s+:\s+ok=\d+\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def recap(stdout: str) -> dict[str, tuple[int, int, int]]:
    """host -> (changed, unreachable, failed) from a PLAY RECAP; both tools print one."""
    return {m[1]: (int(m[2]), int(m[3]), int(m[4])) for m in _RECAP.finditer(_ANSI.sub("", stdout))}


def run(argv: Sequence[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, errors="replace")
    return time.perf_counter() - started, proc


def noop_seconds(argv: Sequence[str], env: dict[str, str], hosts: int) -> float | None:
    """Wall seconds of one run if it was a clean no-op (changed=0 on every host), else None.

    A failure stops the bench: a median of failing runs would measure nothing.
    """
    seconds, proc = run(argv, env)
    counts = recap(proc.stdout)
    if proc.returncode != 0 or len(counts) != hosts or any(u or f for _, u, f in counts.values()):
        raise SystemExit(
            f"{' '.join(argv)} exited {proc.returncode}:\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"
        )
    return seconds if all(c == 0 for c, _, _ in counts.values()) else None


def settle(argv: Sequence[str], env: dict[str, str], hosts: int) -> None:
    """Run until a run changes nothing: the state every timed run starts from."""
    for _ in range(MAX_ATTEMPTS_PER_SAMPLE):
        if noop_seconds(argv, env, hosts) is not None:
            return
    raise SystemExit(f"{' '.join(argv)}: not one no-op in {MAX_ATTEMPTS_PER_SAMPLE} runs")


def medians(
    commands: dict[str, list[str]], env: dict[str, str], hosts: int, repeat: int
) -> tuple[dict[str, float], int]:
    """Median no-op seconds per tool, and how many runs were discarded for changing something.

    The tools take turns, so that a burst of other load on this shared machine falls on
    both alike rather than on whichever happened to be running.
    """
    samples: dict[str, list[float]] = {label: [] for label in commands}
    discarded = 0
    for i in range(repeat):
        for label, argv in commands.items():
            for _ in range(MAX_ATTEMPTS_PER_SAMPLE):
                seconds = noop_seconds(argv, env, hosts)
                if seconds is not None:
                    break
                discarded += 1
            else:
                raise SystemExit(f"{label}: no no-op run in {MAX_ATTEMPTS_PER_SAMPLE} attempts")
            samples[label].append(seconds)
            print(f"  {hosts} node(s), run {i + 1}/{repeat}: {label} {seconds:.2f} s", flush=True)
    return {label: statistics.median(s) for label, s in samples.items()}, discarded


def cpuaccel_json(argv: Sequence[str], env: dict[str, str]) -> dict[str, Any]:
    """One run's `--json` report: the recap's counts per host and each task's seconds."""
    _, proc = run([*argv, "--json"], env)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} --json exited {proc.returncode}:\n{proc.stderr}")
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def confirm_noop(argv: Sequence[str], env: dict[str, str]) -> None:
    """The provisioning contract: a re-run reports changed=0 on every host."""
    for _ in range(MAX_ATTEMPTS_PER_SAMPLE):
        stats = cpuaccel_json(argv, env)["stats"]
        changed = {host: s["changed"] for host, s in stats.items() if s["changed"]}
        if not changed:
            print(f"re-run: changed=0 on all {len(stats)} nodes", flush=True)
            return
        print(f"re-run still changed something: {changed}; once more", flush=True)
    raise SystemExit(f"{' '.join(argv)}: not one no-op in {MAX_ATTEMPTS_PER_SAMPLE} runs")


def cpuaccel_profile(argv: Sequence[str], env: dict[str, str]) -> list[tuple[str, float]]:
    """Per-task seconds of one run (gathering facts included)."""
    report = cpuaccel_json(argv, env)
    return [(t["task"], float(t["seconds"])) for p in report["plays"] for t in p["tasks"]]


def ansible_profile(argv: Sequence[str], env: dict[str, str]) -> list[tuple[str, float]]:
    """Per-task seconds of one run, from ansible-core's own junit callback.

    A task's time is its slowest host's (the linear strategy waits for every host).
    """
    out = Path(tempfile.mkdtemp(prefix="cpxl-bench-junit-"))
    try:
        _, proc = run(
            argv,
            dict(
                env,
                ANSIBLE_CALLBACKS_ENABLED="junit",
                JUNIT_OUTPUT_DIR=str(out),
                JUNIT_HIDE_TASK_ARGUMENTS="True",
            ),
        )
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout[-3000:]}")
        tasks: dict[str, float] = {}
        for path in out.glob("*.xml"):
            for case in ET.parse(path).getroot().iter("testcase"):
                # "[node4] PLAY NAME: TASK NAME"
                name = str(case.get("name")).split("] ", 1)[-1].split(": ", 1)[-1]
                tasks[name] = max(tasks.get(name, 0.0), float(case.get("time") or 0))
        return list(tasks.items())
    finally:
        shutil.rmtree(out, ignore_errors=True)


def slowest(tasks: list[tuple[str, float]], top: int = 4) -> str:
    ranked = sorted(tasks, key=lambda t: t[1], reverse=True)[:top]
    return ", ".join(f"{name} {seconds:.2f}" for name, seconds in ranked)


def verdict(value: float, target: float) -> str:
    return "PASS" if value <= target else "MISS"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if not (WHEELHOUSE / STAMP_NAME).is_file():
        raise SystemExit(f"no wheelhouse at {WHEELHOUSE}: run `make wheelhouse` first")
    ansible_playbook = ensure_ansible("ansible-playbook")
    cpuaccel = str(Path(sys.executable).with_name("cpuaccel"))
    home = Path(tempfile.mkdtemp(prefix="cpxl-bench-ansible-"))
    env = dict(
        os.environ,
        ANSIBLE_HOME=str(home),
        ANSIBLE_LOCAL_TEMP=str(home / "tmp"),
        # The inventory pins a known_hosts file with StrictHostKeyChecking=yes.
        ANSIBLE_HOST_KEY_CHECKING="True",
        ANSIBLE_PIPELINING="True",
        # The controller's wheelhouse step is filled already; should it run pip after
        # all, it must not reach an index either.
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(WHEELHOUSE),
    )
    sizes = sorted({1, args.nodes})
    load = os.getloadavg()[0]
    rows: list[tuple[int, float, float]] = []
    discarded = 0
    try:
        with Cluster(args.nodes, cluster_id=CLUSTER_ID) as cluster:
            inventory = str(
                cluster.write_inventory(
                    cluster.state_dir / "provision.yaml",
                    cpuaccel_python=None,
                    cpuaccel_venv=str(NODE_DIR / "venv"),
                    ansible_python_interpreter=NODE_PYTHON,
                    cpuaccel_wheelhouse=str(WHEELHOUSE),
                )
            )
            ours = [cpuaccel, "provision", inventory]
            theirs = [
                str(ansible_playbook), "-i", inventory, str(ANSIBLE_PLAYBOOK),
                "-f", str(ANSIBLE_FORKS),
            ]  # fmt: skip
            print(
                f"warm-up: provisioning {args.nodes} fresh nodes (torch into a venv on each: "
                "several minutes)",
                flush=True,
            )
            started = time.perf_counter()
            # Its own output is the progress: a line per task as it ends.
            subprocess.run(ours, env=env, check=True)
            print(f"warm-up done in {time.perf_counter() - started:.0f} s", flush=True)
            confirm_noop(ours, env)
            for n in sizes:
                limit = [] if n == args.nodes else ["--limit", ",".join(cluster.names[:n])]
                commands = {"cpuaccel": ours + limit, "ansible": theirs + limit}
                # Ansible's first run too (from cpuaccel's end state); both warm the page
                # cache, and Ansible its ssh control sockets.
                for argv in commands.values():
                    settle(argv, env, n)
                times, dropped = medians(commands, env, n, args.repeat)
                discarded += dropped
                rows.append((n, times["cpuaccel"], times["ansible"]))
            profiles = {
                "cpuaccel provision": cpuaccel_profile(ours, env),
                "ansible-playbook": ansible_profile(theirs, env),
            }
    finally:
        shutil.rmtree(home, ignore_errors=True)

    print()
    print(
        f"no-op re-run of the default playbook: median of {args.repeat} runs, wall seconds; "
        f"{os.cpu_count()}-core machine, load average {load:.1f} at the start"
    )
    print(f"ansible-core with -f {ANSIBLE_FORKS}, ANSIBLE_PIPELINING=True, facts gathered")
    print("commands (1 node: the same with --limit node1):")
    print("  cpuaccel provision INVENTORY")
    print(f"  ansible-playbook -i INVENTORY bench/provision_ansible.yaml -f {ANSIBLE_FORKS}\n")
    print("| nodes | cpuaccel provision | ansible-playbook (pipelining) | cpuaccel / ansible |")
    print("|---:|---:|---:|---:|")
    for n, mine, theirs_s in rows:
        print(f"| {n} | {mine:.2f} | {theirs_s:.2f} | {mine / theirs_s:.2f}x |")
    print()
    (n1, ours1, theirs1), (nk, oursk, theirsk) = rows[0], rows[-1]
    vs = oursk / theirsk
    scaling = oursk / ours1
    print(
        f"cpuaccel vs ansible at {nk} nodes: {vs:.2f}x "
        f"(target <= {TARGET_VS_ANSIBLE}x) {verdict(vs, TARGET_VS_ANSIBLE)}"
    )
    print(
        f"scaling {n1} -> {nk} nodes: cpuaccel {scaling:.2f}x "
        f"(target <= {TARGET_SCALING}x) {verdict(scaling, TARGET_SCALING)}; "
        f"ansible {theirsk / theirs1:.2f}x"
    )
    print(f"\nslowest tasks at {nk} nodes, seconds (one more run each, outside the medians):")
    for label, tasks in profiles.items():
        print(f"  {label}: {slowest(tasks)}")
    if discarded:
        print(
            f"\n{discarded} run(s) changed something and were re-run: the self wheel in the "
            "shared wheelhouse changed (cpuaccel code edited, or another checkout provisioned)"
        )


if __name__ == "__main__":
    main()
