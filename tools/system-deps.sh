#!/usr/bin/env bash
# The Debian packages the multi-node tests use (real sshd in namespaces, rsync, the
# nodes' own venvs, MPICH and Open MPI, sudo, Slurm with munge, slurmdbd and MariaDB). `make test` runs this first, so a fresh
# machine runs those tests instead of skipping them. Installs only what is missing;
# without root it names what is missing and the cluster tests skip.
#
# --venv: only what `python3 -m venv` needs (python3-venv, for $PYTHON, default python3),
# which `make demo` and `make venv` run first; without root a missing one is an error.
set -euo pipefail

if [ "${1:-}" = "--venv" ]; then
    python=${PYTHON:-python3}
    if "$python" -c "import ensurepip, venv" 2>/dev/null; then
        exit 0
    fi
    version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
        echo "system-deps: $python cannot create a venv (no ensurepip): run apt-get install python3-venv (or python$version-venv) as root" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # python3-venv is the default python3's; another python3.X needs its own package.
    for package in python3-venv "python$version-venv"; do
        apt-get install -y -qq --no-install-recommends "$package" || true
        if "$python" -c "import ensurepip, venv" 2>/dev/null; then
            exit 0
        fi
    done
    echo "system-deps: $python still cannot create a venv after apt-get install python3-venv python$version-venv" >&2
    exit 1
fi

need=()
command -v /usr/sbin/sshd >/dev/null || need+=(openssh-server)
command -v ssh >/dev/null || need+=(openssh-client)
command -v ip >/dev/null || need+=(iproute2)
command -v rsync >/dev/null || need+=(rsync)
command -v nsenter >/dev/null || need+=(util-linux)
# The provisioning tests create venvs with the nodes' system Python, as a user's would.
/usr/bin/python3 -c "import ensurepip, venv" 2>/dev/null || need+=(python3-venv)
command -v mpirun.mpich >/dev/null || need+=(mpich)
command -v mpirun.openmpi >/dev/null || need+=(openmpi-bin)
# provision's become test: a non-root SSH user whose sudo asks for a password.
command -v sudo >/dev/null || need+=(sudo)
# A C++ compiler and the Python headers: the worker's exit test builds a library that
# leaves a native thread behind, and DeepSpeed builds its CPU op on first use
# (`make test-clients`).
command -v g++ >/dev/null || need+=(g++)
"${PYTHON:-python3}" -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null \
    || need+=(python3-dev)
# The dashboard's page tests: a real headless browser (driven by playwright).
command -v /usr/bin/chromium >/dev/null || need+=(chromium)
# The Slurm tests: a real Slurm in the test cluster (cpuaccel/testbed/slurm.py starts its
# own munged, slurmctld, slurmd and, for sacct, slurmdbd on a private MariaDB; the
# packages' own services stay off: they need /etc/slurm configs that this never writes).
# libpmi2-0 is the PMI-2 library Intel MPI needs under `srun --mpi=pmi2`.
{ command -v /usr/sbin/slurmctld && command -v /usr/sbin/slurmd && command -v srun; } >/dev/null \
    || need+=(slurm-wlm)
command -v /usr/sbin/munged >/dev/null || need+=(munge)
ldconfig -p 2>/dev/null | grep 'libpmi2\.so\.0 ' >/dev/null || need+=(libpmi2-0)
command -v /usr/sbin/slurmdbd >/dev/null || need+=(slurmdbd)
command -v /usr/sbin/mariadbd >/dev/null || need+=(mariadb-server-core)

if [ ${#need[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "system-deps: missing ${need[*]} (install them as root; the cluster tests skip without them)" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}"
