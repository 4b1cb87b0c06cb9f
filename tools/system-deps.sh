#!/usr/bin/env bash
# The Debian packages the multi-node tests use (real sshd in namespaces, rsync, the
# nodes' own venvs, MPICH and Open MPI, sudo). `make test` runs this first, so a fresh
# machine runs those tests instead of skipping them. Installs only what is missing;
# without root it names what is missing and the cluster tests skip.
set -euo pipefail

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
