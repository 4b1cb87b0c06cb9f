"""The rank side: ``python -m cpuaccel.worker SCRIPT [ARGS...]``, what every rank execs.

It stays tiny, like torchrun's worker-side setup: derive the torch.distributed
environment from whichever launcher started the process, label this rank's output,
then run the script as ``__main__`` with ``sys.argv`` as the user wrote it.
"""

from __future__ import annotations

import os
import runpy
import socket
import sys
from collections.abc import Mapping, MutableMapping

from cpuaccel import _labels

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
EXIT_MARKER = "[cpuaccel] exit code"


def derive_env(env: Mapping[str, str]) -> dict[str, str]:
    """The torch.distributed variables this process should see, from its launcher's.

    torchrun's own variables (RANK, ...) win when present; otherwise the first launcher
    family whose rank variable is set provides all four. Slurm's per-node task count can
    read "4(x2)", of which the leading number is the local world size.
    """
    derived: dict[str, str] = {}
    for rank, size, local_rank, local_size in LAUNCHER_VARS:
        if rank in env:
            derived = {
                "RANK": env[rank],
                "WORLD_SIZE": env.get(size, "1"),
                "LOCAL_RANK": env.get(local_rank, "0"),
                "LOCAL_WORLD_SIZE": env.get(local_size, "1").split("(")[0],
            }
            break
    if not derived:
        derived = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        if key in env:
            derived[key] = env[key]
    derived["MASTER_ADDR"] = env.get("MASTER_ADDR", "127.0.0.1")
    derived["MASTER_PORT"] = env.get("MASTER_PORT", DEFAULT_MASTER_PORT)
    return derived


def apply_env(env: MutableMapping[str, str]) -> dict[str, str]:
    derived = derive_env(env)
    env.update(derived)
    return derived


def run_script(script: str, args: list[str]) -> int:
    """Run SCRIPT as __main__; return the exit code it ended with."""
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
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
    except BaseException:
        import traceback

        traceback.print_exc()
        return 1
    return 0


def main() -> None:
    if len(sys.argv) < 2:
        print("usage: python -m cpuaccel.worker SCRIPT [ARGS...]", file=sys.stderr)
        sys.exit(2)
    derived = apply_env(os.environ)
    if os.environ.get("CPUACCEL_LABEL_OUTPUT") == "1":
        _labels.install(f"[rank {derived['RANK']} {socket.gethostname()}] ")
    code = run_script(sys.argv[1], sys.argv[2:])
    if code != 0:
        # The controller reads this to report the first failing rank and its code.
        print(f"{EXIT_MARKER} {code}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    _labels.finish()
    os._exit(code & 0xFF if code >= 0 else 1)


if __name__ == "__main__":
    main()
