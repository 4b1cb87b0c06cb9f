"""The rank side: ``python -m cpuaccel.worker SCRIPT [ARGS...]``, what every rank execs
(``-m MODULE [ARGS...]`` for a module, ``--no-python PROGRAM [ARGS...]`` for a program).

It stays tiny, like torchrun's worker-side setup: derive the torch.distributed
environment from whichever launcher started the process, label this rank's output,
then run the script as ``__main__`` with ``sys.argv`` as the user wrote it. The script
runs in a child of the rank's own process, which passes signals on to it and reports
its death by a signal (which the script itself cannot) as the rank's exit code. It
labels the output too, so the rank is finished when the script's process exits, even
if something the script left (a copy of stderr, a background helper) still holds it.
"""

# ruff: noqa: E402 (the signals are blocked before the other imports: they take time)
from __future__ import annotations

import signal
import sys

_BEFORE: set[int | signal.Signals] | None = None  # the mask the script's process gets back
if __name__ == "__main__":
    # As a rank: the signals that end a job wait blocked from here on (the rank's own
    # process takes them once the script's runs: _wait_for_script), so that a rank
    # ended while it is still importing reports how it ended.
    _BEFORE = signal.pthread_sigmask(
        signal.SIG_BLOCK,
        {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
         signal.SIGUSR2, signal.SIGCHLD},
    )  # fmt: skip

import atexit
import contextlib
import os
import runpy
import socket
from collections.abc import Iterable, Mapping, MutableMapping
from typing import NoReturn

from cpuaccel import _labels, _progress, _rendezvous
from cpuaccel.errors import SettingError
from cpuaccel.node.boundedjson import loads as bounded_loads
from cpuaccel.node.progress import CAUSE_LIMIT, CAUSE_MARKER, EXIT_MARKER, KILLED_MARKER
from cpuaccel.rank_settings import HOST_ENV, MAX_RESTARTS_ENV, NODE_IFACES_ENV, RESTART_ENV

# (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) as each launcher family names them.
LAUNCHER_VARS: tuple[tuple[str, str, str, str], ...] = (
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),  # Intel MPI, MPICH
    (
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),  # Open MPI
    ("PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK", "PMIX_LOCAL_SIZE"),  # PMIx
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),  # Slurm
)
DEFAULT_MASTER_PORT = "29500"


def derive_env(env: Mapping[str, str]) -> dict[str, str]:
    """The torch.distributed variables this process should see, from its launcher's:
    torchrun's whole list (cpuaccel.rank_settings.TORCHRUN_ENV).

    torchrun's own variables (RANK, ...) win when present; otherwise the first launcher
    family whose rank variable is set provides all four. Slurm sets its per-node task
    count SLURM_NTASKS_PER_NODE only for --ntasks-per-node; otherwise the local world
    size is this node's entry of SLURM_TASKS_PER_NODE, which reads like "4(x2)" or
    "3(x2),1" (one count per node, runs of equal counts shortened).
    """
    derived: dict[str, str] = {}
    for rank, size, local_rank, local_size in LAUNCHER_VARS:
        if rank in env and local_rank not in env and "SLURM_LOCALID" in env:
            continue  # srun's pmi2 gives PMI_RANK alone: Slurm's own variables are whole
        if rank in env:
            local = env.get(local_size)
            if local is None and rank == "SLURM_PROCID":
                local = _slurm_tasks_here(env)
            derived = {
                "RANK": env[rank],
                "WORLD_SIZE": env.get(size, "1"),
                "LOCAL_RANK": env.get(local_rank, "0"),
                "LOCAL_WORLD_SIZE": (local or "1").split("(")[0],
            }
            break
    if not derived:
        derived = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        if key in env:
            derived[key] = env[key]
    derived["MASTER_ADDR"] = env.get("MASTER_ADDR", "127.0.0.1")
    derived["MASTER_PORT"] = env.get("MASTER_PORT", DEFAULT_MASTER_PORT)
    derived.update(_torchrun_env(env, derived))
    return derived


def _torchrun_env(env: Mapping[str, str], derived: Mapping[str, str]) -> dict[str, str]:
    """The rest of torchrun's list, from the four numbers and cpuaccel's own variables;
    a value already in ``env`` (torchrun's own, the user's) wins.

    A node's index is RANK // LOCAL_WORLD_SIZE: the launchers place ranks in blocks of
    --ppn, the same count on every node. Slurm, whose counts may differ between nodes,
    says its node's index and the node count itself."""
    try:
        rank, world = int(derived["RANK"]), int(derived["WORLD_SIZE"])
        per_node = max(1, int(derived["LOCAL_WORLD_SIZE"]))
    except ValueError:  # a launcher's garbage: the runtime names it; nothing derived here
        return {}
    group = env.get("SLURM_NODEID") if "SLURM_PROCID" in env else None
    groups = env.get("SLURM_NNODES") if "SLURM_PROCID" in env else None
    run_dir = env.get("CPUACCEL_RUN_DIR")
    own = {
        "GROUP_RANK": group or str(rank // per_node),
        "GROUP_WORLD_SIZE": groups or str(-(-world // per_node)),
        "ROLE_RANK": derived["RANK"],
        "ROLE_NAME": "default",
        "ROLE_WORLD_SIZE": derived["WORLD_SIZE"],
        "TORCHELASTIC_RUN_ID": env.get("CPUACCEL_RUN_ID") or "none",  # torchrun's default id
        "TORCHELASTIC_RESTART_COUNT": env.get(RESTART_ENV) or "0",
        MAX_RESTARTS_ENV: "0",
    }
    own["NODE_RANK"] = env.get("GROUP_RANK") or own["GROUP_RANK"]
    if run_dir:  # under cpuaccel run: where torch's @record writes a failing rank's error
        own["TORCHELASTIC_ERROR_FILE"] = os.path.join(run_dir, f"error-{derived['RANK']}.json")
    return {key: env.get(key) or value for key, value in own.items()}


def _slurm_tasks_here(env: Mapping[str, str]) -> str | None:
    """This node's task count from SLURM_TASKS_PER_NODE and SLURM_NODEID, if readable."""
    counts: list[str] = []
    try:
        for part in env.get("SLURM_TASKS_PER_NODE", "").split(","):
            count, _, repeat = part.strip().partition("(x")
            counts += [count] * int(repeat.rstrip(")") or 1)
        node = int(env.get("SLURM_NODEID", "0"))
    except ValueError:
        return None
    return counts[node] if 0 <= node < len(counts) and counts[node].isdigit() else None


def apply_env(env: MutableMapping[str, str]) -> dict[str, str]:
    """Set this rank's environment: its node's own variables (CPUACCEL_HOST_ENV) first,
    as the user's win over what is derived; then torchrun's list; then the interfaces."""
    env.update(host_env(env))
    derived = derive_env(env)
    env.update(derived)
    env.update(network_env(env))
    return derived


MAX_HOST_ENV = 1 << 20  # characters of CPUACCEL_HOST_ENV: env.sh's own, never larger


def host_env(env: Mapping[str, str]) -> dict[str, str]:
    """This node's own variables: its entry of CPUACCEL_HOST_ENV, a JSON object
    ``{ADDRESS: {NAME: value}}`` (cpuaccel.jobs.plan wrote it from each host's
    cpuaccel_env, checked there). The node is found by the address it holds, as in
    :func:`network_env`. SettingError when the value is not such an object."""
    text = env.get(HOST_ENV, "")
    if not text:
        return {}
    try:
        by_address = bounded_loads(text, MAX_HOST_ENV)
    except ValueError:
        by_address = None
    if not isinstance(by_address, dict) or not all(
        isinstance(v, dict) and all(_settable(k, x) for k, x in v.items())
        for v in by_address.values()
    ):
        raise SettingError(
            f"${HOST_ENV} is not a JSON object of {{address: {{NAME: value}}}} "
            "(cpuaccel run writes it: unset it)"
        )
    mine = _this_node(by_address)
    return dict(by_address[mine]) if mine is not None else {}


def _settable(name: object, value: object) -> bool:
    """Whether ``name=value`` can be put in the environment."""
    return (
        isinstance(name, str)
        and isinstance(value, str)
        and bool(name)
        and "=" not in name
        and "\0" not in name + value
    )


# The variables by which each library that opens its own sockets is told its interface:
# gloo, TensorPipe (torch RPC), libfabric's tcp provider (Intel MPI, oneCCL's ofi
# transport) and oneCCL's key-value store.
IFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "FI_TCP_IFACE", "CCL_KVS_IFACE")


def network_env(env: Mapping[str, str]) -> dict[str, str]:
    """This node's interface for the job (cpuaccel.network.choice chose one a node, as
    ``ADDRESS=INTERFACE`` words in CPUACCEL_NODE_IFACES), under each library's variable
    the user did not set. The node is found by the address it holds: names and hostnames
    may repeat, and a run folder may be shared by every node."""
    words = env.get(NODE_IFACES_ENV, "").split()
    if not words:
        return {}
    by_address = dict(word.partition("=")[::2] for word in words)
    mine = _this_node(a for a, interface in by_address.items() if interface)
    if mine is None:
        return {}
    return {name: by_address[mine] for name in IFACE_VARIABLES if not env.get(name)}


_held: frozenset[str] | None = None  # this node's addresses, asked of the kernel once


def _this_node(candidates: Iterable[str]) -> str | None:
    """Which of ``candidates`` (the addresses the controller chose, one a node) this
    node holds: how a rank finds its own node's entry of a map written for every node."""
    global _held
    if _held is None:
        from cpuaccel.node.netif import addresses  # only for a multi-node job

        _held = frozenset(address for _, address, _ in addresses())
    return next((a for a in candidates if a in _held), None)


def run_script(script: str, args: list[str], module: bool = False) -> int:
    """Run SCRIPT (or, with ``module``, the module of that name) as __main__; return
    the exit code it ended with."""
    sys.argv = [script, *args]
    try:
        if module and not _module_exists(script):
            print(f"{sys.executable}: No module named {script}", file=sys.stderr)  # as python -m
            return 1
        if module:
            # As `python -m`: sys.path[0] is already the working folder (the project, as
            # rank.sh cd's there), and run_module sets sys.argv[0] to the module's file.
            runpy.run_module(script, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except SettingError as exc:  # a CPUACCEL_* variable or init() argument: its one line
        print(f"cpuaccel: {exc}", file=sys.stderr)
        return exc.exit_code
    except BaseException:
        import traceback

        traceback.print_exc()
        return 1
    return 0


def _module_exists(name: str) -> bool:
    """Whether ``name`` can be found (its parent packages are imported, as python -m
    does); a missing one is a line, not a traceback of runpy's internals."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):  # a parent package is missing
            return False
        raise


# Signals the rank's own process gets from MPI or a terminal, passed on to the script's.
FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when the rank's own process (its parent) dies."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != parent:  # it died before prctl took effect
        os._exit(1)


# What the rank's own process waits for: a signal to pass on, or its child's end.
AWAITED = (*FORWARDED, signal.SIGCHLD)


def _fork() -> int:
    """fork, with the awaited signals blocked in the rank's own process until it ends
    (:func:`_wait_for_script` takes them one by one; one still pending when the script
    has ended must not kill it before it reports) and put back at once in the child,
    whose own signals act as in a plain `python SCRIPT`."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, AWAITED)
    child = os.fork()
    if child == 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, held if _BEFORE is None else _BEFORE)
    return child


def _wait_for_script(child: int, report: bool = True, told: int | None = None) -> int:
    """The rank's own process: pass signals on to the script's, wait for it, report its
    death by a signal.

    The signals are taken synchronously (``sigwaitinfo``), not by handlers: a Python
    handler runs between bytecodes, so a SIGTERM from MPI landing just before a blocking
    ``waitpid`` would wait there until the script ended by itself, and one landing
    between the fork and the handlers' installation would kill this process, and the
    script by PDEATHSIG, the script's own handler never run. Blocked from the fork on,
    each one waits in the kernel until taken here.

    A rank killed by a signal (the OOM killer, a segfault, kill -9) cannot say so
    itself, and MPI launchers report it only when the whole job has ended (Intel MPI's
    hydra lets the other ranks run on). Its parent can: it prints the exit marker the
    controller watches for, so the job is ended at once.

    A script that left without reporting its code (``os._exit``, a C library's
    ``exit()``) cannot say it either: with ``report``, its code is reported here when
    nothing came through ``told`` (the read end of the pipe the script's process writes
    a byte to as it reports: :func:`_report_exit`).

    The rank is finished when the script's process has exited, whatever it left
    holding its output: the caller's :func:`cpuaccel._labels.finish` sees to that.
    """
    while True:
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid == child:
            break
        signum = signal.sigwaitinfo(AWAITED).si_signo  # SIGCHLD: look again
        if signum != signal.SIGCHLD:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signum)
    if not os.WIFSIGNALED(status):
        code = os.waitstatus_to_exitcode(status)
        if report and not _told(told):
            with contextlib.suppress(OSError):
                os.write(2, f"{EXIT_MARKER} {code}\n".encode())
        return code
    signum = os.WTERMSIG(status)
    code = 128 + signum
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    said = f"{KILLED_MARKER} {name}\n"
    if report:  # else the caller reports every code itself
        said += f"{EXIT_MARKER} {code}\n"
    with contextlib.suppress(OSError):  # fd 2: the labeller, if any, unless it is gone
        os.write(2, said.encode())  # one write: both lines or neither
    return code


def _told(told: int | None) -> bool:
    """Whether the script's process reported its code itself (a byte on ``told``)."""
    if told is None:
        return True
    os.set_blocking(told, False)
    try:
        return bool(os.read(told, 1))
    except BlockingIOError:
        return False


_telling: int | None = None  # the script's process: the pipe its report is noted on


USAGE = "usage: python -m cpuaccel.worker [-m MODULE | --no-python PROGRAM | SCRIPT] [ARGS...]"


def _parse(argv: list[str]) -> tuple[str, str, list[str]] | None:
    """(mode, what, args) of the worker's own words: "script", "module" or "program"."""
    if argv[:1] in (["-m"], ["--no-python"]) and len(argv) >= 2:
        return ("module" if argv[0] == "-m" else "program"), argv[1], argv[2:]
    if not argv or argv[0].startswith("-"):
        return None
    return "script", argv[0], argv[1:]


def _report_exit(code: int) -> None:
    """The exit marker the controller reads for each rank's code. Under `cpuaccel run`
    (CPUACCEL_RUN_ID set) a rank that succeeded says so too, for `run --json`'s
    per-rank codes; elsewhere only a failure is worth a line."""
    if code != 0 or os.environ.get("CPUACCEL_RUN_ID"):
        os.write(2, f"{EXIT_MARKER} {code}\n".encode())  # fd 2: the labeller, if any
    if _telling is not None:  # the rank's own process need not report it again
        with contextlib.suppress(OSError):
            os.write(_telling, b"1")


def main() -> None:
    parsed = _parse(sys.argv[1:])
    if parsed is None:
        print(USAGE, file=sys.stderr)
        sys.exit(2)
    mode, what, args = parsed
    try:
        derived = apply_env(os.environ)
    except SettingError as exc:
        print(f"cpuaccel: {exc}", file=sys.stderr, flush=True)
        _report_exit(exc.exit_code)
        sys.exit(exc.exit_code)
    _clear_error_file(os.environ.get("TORCHELASTIC_ERROR_FILE"))
    sys.stdout.flush()
    sys.stderr.flush()
    if os.environ.get("CPUACCEL_LABEL_OUTPUT") == "1":
        # In the rank's own process, which outlives the script's: so that the rank ends
        # when the script's process has, whatever the script left holding its output.
        _labels.install(f"[rank {derived['RANK']} {socket.gethostname()}] ")
    parent = os.getpid()
    told, telling = os.pipe()  # not inherited by what the script execs
    child = _fork()
    if child != 0:
        # --no-python: a program cannot report its own code; a script reports its own
        # (while its atexit handlers' output is still to come); a death by signal, or a
        # code the script left without reporting (os._exit), is reported here.
        os.close(telling)
        code = _wait_for_script(child, report=mode != "program", told=told)
        if mode == "program":
            _report_exit(code)
        _labels.finish()
        os._exit(code & 0xFF)
    _die_with_parent(parent)
    os.close(told)
    global _telling
    _telling = telling
    _labels.forget()
    if mode == "program":
        _exec_program(what, args)
    _progress.announce()  # run --hang-timeout: this pid is the one py-spy dumps on a hang
    _rendezvous.install()  # run --rendezvous-timeout: init_process_group followed
    code = run_script(what, args, module=mode == "module")
    # The controller reads this to report the first failing rank and its code.
    sys.stdout.flush()
    sys.stderr.flush()
    if code != 0:
        _report_cause(os.environ.get("TORCHELASTIC_ERROR_FILE"))
    _report_exit(code)
    _leave(code & 0xFF if code >= 0 else 1)


def _leave(code: int) -> NoReturn:
    """The script's process ends with ``code``, once the script has returned, as a plain
    `python SCRIPT` would up to the interpreter's own teardown: its non-daemon threads
    waited for, its atexit handlers run (while its output is still labelled), MPI
    finalized where mpi4py started it (a rank that leaves without MPI_Finalize makes MPI
    kill all the others), Python's and C's buffered output flushed.

    Then os._exit: the C and C++ teardown (static destructors, a library's exit hooks)
    is skipped. A native thread a library left running there, as gloo's can be after
    destroy_process_group, meets a destructor that calls std::terminate ("terminate
    called without an active exception"), and a rank whose work succeeded would die by
    SIGABRT, recorded as failed."""
    threading = sys.modules.get("threading")
    if threading is not None:
        with contextlib.suppress(Exception):
            threading._shutdown()
    atexit._run_exitfuncs()
    _finalize_mpi()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).fflush(None)  # C's stdio: what a library printf'd
    os._exit(code)


def _finalize_mpi() -> None:
    """MPI_Finalize, as mpi4py's own exit hook does, when mpi4py initialized MPI and
    was not told to leave it (``mpi4py.rc.finalize = False``)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None:
        return
    rc = getattr(sys.modules.get("mpi4py"), "rc", None)
    if getattr(rc, "finalize", None) is False:
        return
    with contextlib.suppress(Exception):
        if mpi.Is_initialized() and not mpi.Is_finalized():
            mpi.Finalize()


def _report_cause(path: str | None) -> None:
    """The root cause line of a failed rank: the message torch's @record wrote to its
    error file (``{"message": {"message": "ValueError: ..."}}``), when it wrote one."""
    if not path:
        return
    try:
        with open(path, "rb") as file:
            data = bounded_loads(file.read(1 << 20))
    except (OSError, ValueError):
        return
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):
        message = message.get("message")
    if isinstance(message, str) and message.strip():
        line = " ".join(message.split())[:CAUSE_LIMIT]
        os.write(2, f"{CAUSE_MARKER} {line}\n".encode(errors="replace"))


def _clear_error_file(path: str | None) -> None:
    """A previous attempt's error file is not this one's: torch's @record writes it
    only when the script fails, and what reads it must not find an older failure."""
    if path:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _exec_program(program: str, args: list[str]) -> None:
    """--no-python: the rank's environment is derived (above); the program replaces the
    script's process, its output labelled by the rank's own process, its exit code (or
    its signal) reported there."""
    try:
        os.execvp(program, [program, *args])
    except OSError as exc:  # as a shell says it, with the shell's codes
        print(f"cpuaccel: {program}: {exc.strerror}", file=sys.stderr, flush=True)
        os._exit(127 if isinstance(exc, FileNotFoundError) else 126)


if __name__ == "__main__":
    main()
