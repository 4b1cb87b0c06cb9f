# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# An extra package index for torch, e.g. PyTorch's CPU-only wheels:
#   make demo TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# On plain PyPI, torch for Linux is the multi-GB CUDA build. Empty (the default): pip's
# own configuration alone (pip.conf, PIP_INDEX_URL), which is what a machine whose
# index already serves the CPU wheel wants; an index it cannot reach would cost retries
# on every package. Also given to the wheelhouse as cpuaccel_torch_index_url.
TORCH_INDEX_URL ?=
PIP_INDEX_ARGS := $(if $(TORCH_INDEX_URL),--extra-index-url $(TORCH_INDEX_URL))
TORCH_INDEX_VARS := $(if $(TORCH_INDEX_URL),-e cpuaccel_torch_index_url=$(TORCH_INDEX_URL))

.PHONY: venv system-deps wheelhouse test test-clients test-stress lint unit demo bench-provision bench-fanout bench-sync bench-broadcast bench-broadcast-shape bench-launch bench-launch16 bench-launch-slurm bench-train bench-ab cluster-up cluster-down clean

venv: $(STAMP)

# A fresh Debian's python3 cannot create a venv without python3-venv: installed first
# when missing (as root), else one line naming it.
$(STAMP): pyproject.toml constraints.txt
	PYTHON=$(PYTHON) bash tools/system-deps.sh --venv
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(PIP_INDEX_ARGS) -c constraints.txt -e '.[dev]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check cpuaccel testsupport tests bench examples
	$(BIN)/ruff format --check cpuaccel testsupport tests bench examples
	$(BIN)/mypy
	$(BIN)/lint-imports
	@# No package function takes more than 8 parameters (ruff's PLR0913), with no exception.
	@! grep -rn --include='*.py' 'noqa:.*PLR0913' cpuaccel || { echo "make lint: a package function takes more than 8 parameters: group them in a dataclass"; exit 1; }

# The controller's wheels for offline nodes (pip download, part of the install step):
# the provisioning tests install from it and never reach an index. Quick when filled.
WHEELHOUSE := $(CURDIR)/.wheelhouse/upstream
wheelhouse: $(STAMP)
	$(BIN)/cpuaccel provision --tags wheelhouse -e cpuaccel_wheelhouse=$(WHEELHOUSE) $(TORCH_INDEX_VARS)

# sshd, rsync, MPICH, Open MPI ... for the multi-node tests (installed when root).
system-deps:
	bash tools/system-deps.sh

# The multi-node tests start real namespace nodes and need root; CI sets
# CPUACCEL_REQUIRE_CLUSTER=1 so that they fail rather than skip there. Three workers, a
# test file the unit of work, each worker its own cluster (tests/conftest.py).
# The tests start thousands of interpreters: they keep their bytecode (__pycache__,
# ignored by git) even where PYTHONDONTWRITEBYTECODE is set.
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest
test: lint system-deps wheelhouse
	$(PYTEST) -q -n 3 --dist loadgroup -m "not clients"

# The training libraries that `make test` leaves out (pytest mark `clients`): DeepSpeed
# ZeRO-2 on CPU at 2 nodes x 2 ranks (docs/compatibility.md). DeepSpeed is an sdist whose
# build imports torch: built against the venv's torch (no build isolation, which would
# fetch another torch) and the pinned one, its C++ ops left to its first use (DS_BUILD_OPS=0).
# The release docs/compatibility.md was tried with; override to try another.
DEEPSPEED ?= deepspeed==0.19.8
test-clients: $(STAMP) system-deps
	DS_BUILD_OPS=0 $(BIN)/pip install --quiet --no-build-isolation $(PIP_INDEX_ARGS) -c constraints.txt "$(DEEPSPEED)"
	$(PYTEST) -q -m clients

# Nightly: each rank's exit code over 50 runs a launcher, one rank failing in each
# way (tests/cluster/test_rank_codes.py; `make test` runs a few of them).
test-stress: system-deps $(STAMP)
	CPUACCEL_STRESS_RUNS=50 $(PYTEST) -q -n 3 --dist loadgroup tests/cluster/test_rank_codes.py

# Three workers on two cores too: the page, hang and provision tests wait on timers.
unit: $(STAMP)
	$(PYTEST) -q -m "not cluster" -n 3 --dist loadgroup

# Precision auto: bf16 where the CPU has AMX or AVX512-BF16, fp32 elsewhere (a short
# run either way: docs/benchmarks.md, "The demo").
demo: $(STAMP)
	$(BIN)/cpuaccel check
	$(BIN)/cpuaccel run --nodes 1 --ppn 2 examples/train.py --steps 200
	$(BIN)/cpuaccel report "$$(ls -1d runs/*/ | sort | tail -n 1)"

# No-op re-run of the default playbook: cpuaccel provision vs ansible-playbook on 1 and 8
# namespace nodes (needs root; the warm-up installs torch on 8 nodes, which takes minutes).
bench-provision: wheelhouse
	$(BIN)/python bench/provision.py

bench-fanout: $(STAMP)
	$(BIN)/python bench/fanout.py

bench-sync: $(STAMP)
	$(BIN)/python bench/sync.py

# One 50 MB file and the wheelhouse to 4, 8 and 16 namespace nodes over links shaped to
# 200 Mbit/s: one copy, parallel rsync, Ansible's copy and cpuaccel sync (needs root).
bench-broadcast: $(STAMP)
	$(BIN)/python bench/broadcast.py

bench-broadcast-shape: $(STAMP)
	$(BIN)/python bench/broadcast_shape.py

bench-launch: $(STAMP)
	$(BIN)/python bench/launch.py

# The same at 16 nodes x 2: a trivial rank script, and where cpuaccel's time goes.
bench-launch16: $(STAMP)
	$(BIN)/python bench/launch.py --scale

# Its Slurm column: cpuaccel run inside salloc against plain srun, on the Slurm test bed.
bench-launch-slurm: $(STAMP)
	$(BIN)/python bench/launch_slurm.py

# A rank's death to the next attempt's first step: run --max-restarts against torchrun's.
bench-restart: $(STAMP)
	$(BIN)/python bench/restart.py

# 1 node x 2 ranks: fp32 DDP, Accelerate bf16 and cpuaccel run side by side, then the
# gloo/MPI allreduce microbenchmark (its 2-node half needs root for the namespace cluster).
bench-train: $(STAMP)
	$(BIN)/python bench/train.py
	$(BIN)/python bench/allreduce.py

# The same commands from the tree at BASE (a git revision) and this checkout, alternating:
# a refactor must not be slower beyond noise. make bench-ab BASE=<rev>
bench-ab: $(STAMP)
	$(BIN)/python bench/ab.py --base $(BASE)

cluster-up: $(STAMP)
	$(BIN)/python -m cpuaccel.testbed up --nodes 3

cluster-down: $(STAMP)
	$(BIN)/python -m cpuaccel.testbed down

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
