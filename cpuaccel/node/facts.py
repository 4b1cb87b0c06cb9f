"""The fact probe: the node program ``facts`` (with ``common``), and a part of the agent.

It must run on any Python 3.8+ with the standard library alone (the node may have
nothing installed yet), finish in well under a second, and print one JSON object.
It never imports torch or MPI: package versions come from their metadata, and the MPI
flavour from the launcher file's contents, because importing or starting them costs
seconds per node.

Input: the words WORKDIR SETVARS PORT NAME... (SETVARS and PORT may be empty: PORT is a TCP
port to test for being free, for run's master port); the names are those of
the other nodes, to resolve. Output: one JSON object, written by the small encoder
below: the json module's import alone (it pulls in re) costs more than the probe's own
work, and this runs once per node, on nodes that may share their CPUs.
"""

from __future__ import annotations

# _socket, the C module under socket: socket.py pulls in enum and selectors, whose
# import would be a large share of the probe's run time on a node that shares its CPU.
import _socket as socket
import os
import sys
import time

from cpuaccel.node.common import dist_infos, normalise, which
from cpuaccel.node.jobprocs import live_runs
from cpuaccel.node.netif import interfaces, routes, ssh_address

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing's import costs more than the probe's own work
    from typing import Any

PACKAGES = {
    "torch": "torch",
    "intel_extension_for_pytorch": "intel-extension-for-pytorch",
    "oneccl_bindings_for_pytorch": "oneccl_bind_pt",
    "impi_rt": "impi-rt",
    "mpi4py": "mpi4py",
    "accelerate": "accelerate",
    "cpuaccel": "cpuaccel",
    # A notebook's function reaches the ranks pickled by the kernel's cloudpickle.
    "cloudpickle": "cloudpickle",
}
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8")


def package_versions() -> dict[str, str | None]:
    """Versions from the metadata folders' names on sys.path (see common.dist_infos)."""
    wanted = {normalise(dist): key for key, dist in PACKAGES.items()}
    found: dict[str, str | None] = {key: None for key in PACKAGES}
    for name, version, _ in dist_infos(sys.path):
        key = wanted.get(name)
        if key is not None and version and found[key] is None:  # the first on sys.path wins
            found[key] = version
    return found


def read(path: str, limit: int | None = None) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(limit) if limit else f.read()
    except OSError:
        return b""


def mpi_flavour(path: str) -> str:
    """Intel MPI, MPICH or Open MPI, told from the launcher file's own bytes."""
    real = os.path.realpath(path)
    base = os.path.basename(real)
    if base in ("orterun", "prterun", "prte") or base.startswith("mpirun.openmpi"):
        return "openmpi"
    data = read(real, 16 << 20)
    if b"I_MPI_" in data or b"Intel(R) MPI" in data or b"Intel Corporation" in data:
        return "impi"
    if b"Open MPI" in data or b"OpenRTE" in data or b"PRRTE" in data:
        return "openmpi"
    if b"HYDRA" in data or b"mpich" in data.lower() or base == "mpiexec.hydra":
        return "mpich"
    return "unknown"


def mpi_launchers() -> list[dict[str, str]]:
    # The flavour-named launchers before plain `mpirun`: Debian's alternatives move what
    # mpirun points to whenever another MPI is installed, so a recorded job names them.
    candidates = [
        os.path.join(os.path.dirname(sys.executable), "mpirun"),
        which("mpirun.mpich"),
        which("mpirun.openmpi"),
        which("mpirun"),
    ]
    seen = set()
    launchers = []
    for path in candidates:
        if not path or not os.access(path, os.X_OK):
            continue
        real = os.path.realpath(path)
        if real in seen:
            continue
        seen.add(real)
        launchers.append({"path": path, "flavour": mpi_flavour(path)})
    return launchers


def find_setvars(configured: str | None, workdir: str | None = None) -> dict[str, Any]:
    if configured:
        path = os.path.expanduser(configured)
        return {"path": path, "configured": True, "exists": os.path.isfile(path)}
    candidates = []
    if workdir:
        # What `cpuaccel provision` found and verified (its setvars task), first.
        try:
            with open(os.path.join(os.path.expanduser(workdir), ".cpuaccel", "setvars")) as f:
                recorded = f.read().strip()
            if recorded:
                candidates.append(recorded)
        except OSError:
            pass
    candidates += [
        "/opt/intel/oneapi/setvars.sh",
        os.path.expanduser("~/intel/oneapi/setvars.sh"),
        os.path.join(sys.prefix, "env", "setvars.sh"),
    ]
    # oneCCL's own, beside its package: found on sys.path as the import system would
    # find a regular package, without importing importlib.util (with contextlib and
    # collections, a large share of the probe's run time on a node sharing its CPU).
    for entry in sys.path:
        package = os.path.join(entry or ".", "oneccl_bindings_for_pytorch")
        if os.path.isfile(os.path.join(package, "__init__.py")):
            candidates.insert(0, os.path.join(package, "env", "setvars.sh"))
            break
    for path in candidates:
        if os.path.isfile(path):
            return {"path": path, "configured": False, "exists": True}
    return {"path": None, "configured": False, "exists": False}


def cpu_topology() -> dict[str, Any]:
    info = read("/proc/cpuinfo").decode(errors="replace")
    model: str | None = None
    flags: set[str] = set()
    for line in info.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    cores, sockets = set(), set()
    base = "/sys/devices/system/cpu"
    try:
        cpus = [d for d in os.listdir(base) if d.startswith("cpu") and d[3:].isdigit()]
    except OSError:
        cpus = []
    for cpu in cpus:
        topo = os.path.join(base, cpu, "topology")
        pkg = read(os.path.join(topo, "physical_package_id")).strip()
        core = read(os.path.join(topo, "core_id")).strip()
        if pkg:
            sockets.add(pkg)
            cores.add((pkg, core))
    try:
        numa = [d for d in os.listdir("/sys/devices/system/node") if d[4:].isdigit()]
    except OSError:
        numa = []
    allowed: int | None
    try:
        allowed = len(os.sched_getaffinity(0))
    except AttributeError:
        allowed = os.cpu_count()
    return {
        "model": model,
        "logical_cpus": os.cpu_count(),
        "allowed_cpus": allowed,
        "physical_cores": len(cores) or os.cpu_count(),
        "sockets": len(sockets) or 1,
        "numa_nodes": len(numa) or 1,
        "isa": {flag: flag in flags for flag in ISA_FLAGS},
    }


def memory() -> dict[str, int | None]:
    values = {}
    for line in read("/proc/meminfo").decode(errors="replace").splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable"):
            values[key] = int(rest.split()[0]) * 1024
    return {"total": values.get("MemTotal"), "available": values.get("MemAvailable")}


def disk(workdir: str) -> dict[str, Any]:
    path = workdir
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        st = os.statvfs(path or "/")
    except OSError:
        return {"path": path, "free": None, "exists": False}
    return {"path": path, "free": st.f_bavail * st.f_frsize, "exists": os.path.isdir(workdir)}


def resolve(names: list[str]) -> dict[str, dict[str, Any]]:
    answers: dict[str, dict[str, Any]] = {}
    for name in names:
        try:
            # bytes, not str: a str name loads the idna codec first
            infos = socket.getaddrinfo(name.encode(), None, socket.AF_INET, socket.SOCK_STREAM)
            found = sorted({str(info[4][0]) for info in infos})
            answers[name] = {"addresses": found, "error": None}
        except (OSError, UnicodeError) as exc:
            answers[name] = {"addresses": [], "error": str(exc)}
    return answers


def port_free(port: int) -> bool:
    """Whether a TCP port can be listened on (the master port of a job)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # As a server binding it would: a previous job's connections in TIME_WAIT do not
        # make the port busy.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("", port))
        return True
    except OSError:
        return False
    finally:
        sock.close()


def network() -> dict[str, Any]:
    """What the job's network is chosen from (cpuaccel.network.choice): the interfaces
    and their addresses, the routing table, the address this node's ssh session came in
    on, and what the node's own name resolves to (gloo picks its address by it)."""
    name = os.uname().nodename
    return {
        "interfaces": interfaces(),
        "routes": routes(),
        "ssh_address": ssh_address(),
        "own_name": {"name": name, **resolve([name])[name]},
    }


def login_name() -> str:
    try:
        import pwd  # POSIX only, like the rest of the probe

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return str(os.geteuid())


def os_release() -> str:
    for line in read("/etc/os-release").decode(errors="replace").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip().strip('"')
    return " ".join(os.uname()[0:3:2])


def collect(request: dict[str, Any]) -> dict[str, Any]:
    workdir = os.path.expanduser(request.get("workdir") or "~/cpuaccel")
    net = network()
    return {
        "hostname": os.uname().nodename,
        # The same boot id means the same kernel: "nodes" that are containers or
        # namespaces of one machine, whose ranks share its cores.
        "boot_id": read("/proc/sys/kernel/random/boot_id").decode(errors="replace").strip(),
        # Who we are there: with boot_id, tells `check` that two names are one account.
        "user": login_name(),
        "os": os_release(),
        "kernel": os.uname().release,
        "python": {
            "version": ".".join(str(part) for part in sys.version_info[:3]),
            "executable": sys.executable,
            "prefix": sys.prefix,
        },
        "packages": package_versions(),
        "mpi": {"launchers": mpi_launchers()},
        "setvars": find_setvars(request.get("setvars"), request.get("workdir")),
        "cpu": cpu_topology(),
        "memory": memory(),
        "workdir": workdir,
        "disk": disk(workdir),
        # This node's addresses (check shows them), from the one netlink answer.
        "addresses": [a for i in net["interfaces"] for a, _ in i["addresses"]],
        "network": net,
        "resolve": resolve(request.get("resolve") or []),
        "port_free": port_free(request["port"]) if request.get("port") else None,
        "time": time.time(),
        # The jobs' processes here: the controller ends those of a run that has ended.
        "runs": live_runs(),
    }


_ESCAPES = {i: f"\\u{i:04x}" for i in range(32)}
_ESCAPES.update({ord("\\"): "\\\\", ord('"'): '\\"'})


def to_json(value: Any) -> str:
    """JSON for the probe's own data: dicts, lists, strings, numbers, booleans, None."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.translate(_ESCAPES) + '"'
    if isinstance(value, dict):
        return "{" + ",".join(to_json(str(k)) + ":" + to_json(v) for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple, set)):
        return "[" + ",".join(to_json(v) for v in value) + "]"
    return to_json(str(value))


def request_of(words: list[str]) -> dict[str, Any]:
    """WORKDIR SETVARS PORT NAME...: the probe's request (also the ``prelaunch``
    program's first words)."""
    args = [*words, "", "", ""]
    return {
        "workdir": args[0],
        "setvars": args[1] or None,
        "port": int(args[2]) if args[2] else None,
        "resolve": words[3:],
    }


def main() -> None:
    words = sys.argv[2:]  # after BOOT's LENGTH (cpuaccel.connectors.programs)
    sys.stdout.write(to_json(collect(request_of(words))))
    sys.stdout.write("\n")
