"""The settings table (config/settings.py) is the only home of a setting: its inventory
variables, the variables the ranks get it as and its question are declared there and
nowhere else in the package, apart from the code that uses them; the inventory's
variable list, the ranks' environment and the questionnaire are written from it."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from cpuaccel.config import questionnaire
from cpuaccel.config.settings import BY_NAME, INVENTORY_VARIABLES, TABLE
from cpuaccel.inventory.variables import VARIABLES

PACKAGE = Path(__file__).resolve().parents[3] / "cpuaccel"
HOME = "config/settings.py"

# The uses of a setting's declared names outside the table, by file (below cpuaccel/):
# the names each may hold, and why. A declaration anywhere else fails the test.
_RANK_SIDE = "the rank side reads the variables the plan set"
_HOST_OWN = "a host's own value, read per host beside the run's settings"
_WRITES = "it writes an inventory (or a host's variables) for later reading"
USES: dict[str, tuple[frozenset[str], str]] = {
    "rank_settings.py": (
        frozenset({"CPUACCEL_BACKEND", "CPUACCEL_GRAD_REDUCE", "CPUACCEL_DETERMINISTIC",
                   "CPUACCEL_WEIGHTS", "TORCHELASTIC_MAX_RESTARTS", "MASTER_ADDR",
                   "MASTER_PORT", "ACCELERATE_MIXED_PRECISION"}),
        "the runtime's variables and torchrun's, named for both sides of a launch",
    ),
    "runtime/env.py": (frozenset({"MASTER_ADDR", "MASTER_PORT"}), _RANK_SIDE),
    "runtime/precision.py": (frozenset({"CPUACCEL_MIXED_PRECISION"}), _RANK_SIDE),
    "worker.py": (frozenset({"MASTER_ADDR", "MASTER_PORT"}), _RANK_SIDE),
    "netbench/job.py": (frozenset({"MASTER_ADDR"}), _RANK_SIDE),
    "jobs/elastic.py": (frozenset({"MASTER_ADDR"}), "a restart on fewer nodes moves the head"),
    "jobs/rundir.py": (
        frozenset({"MASTER_PORT", "cpuaccel_templates"}),
        "the run's record keeps the port; a bad template names its setting",
    ),
    "inventory/host.py": (
        frozenset({"cpuaccel_python", "cpuaccel_venv", "cpuaccel_workdir"}),
        "a host's Python and folder, read to reach it before any setting is settled",
    ),
    "inventory/variables.py": (
        frozenset({"cpuaccel_slots"}),
        "an MPI hostfile's slots, which the hostfile reader writes and ppn reads",
    ),
    "inventory/builder.py": (frozenset({"cpuaccel_secret_env"}), "its values are never shown"),
    "network/choice.py": (frozenset({"cpuaccel_network"}), _HOST_OWN),
    "projectsync/location.py": (frozenset({"cpuaccel_workdir"}), _HOST_OWN),
    "config/effective.py": (frozenset({"cpuaccel_env"}), _HOST_OWN),
    "api/provisioning.py": (
        frozenset({"cpuaccel_python", "cpuaccel_venv"}),
        "the default playbook's variables for the Python it installs",
    ),
    "inventory/inventory.py": (frozenset({"cpuaccel_python"}), _WRITES),
    "slurm/allocation.py": (frozenset({"cpuaccel_python"}), _WRITES),
    "testbed/inventory_file.py": (frozenset({"cpuaccel_python", "cpuaccel_workdir"}), _WRITES),
    "cli/config.py": (
        frozenset({"cpuaccel_python", "cpuaccel_venv", "cpuaccel_workdir"}), _WRITES
    ),
}  # fmt: skip


def _declared_names() -> dict[str, str]:
    """Every name a setting is declared by -> the setting's name."""
    names = {var: entry.name for entry in TABLE for var in entry.variables}
    names.update({var: entry.name for entry in TABLE for var in entry.env})
    return names


def _literals(path: Path) -> Iterator[tuple[str, int]]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value, node.lineno


def test_a_settings_names_are_declared_in_the_table_alone() -> None:
    names = _declared_names()
    questions = [entry.question.text for entry in TABLE if entry.question is not None]
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        if where == HOME or where.startswith("node/"):  # node/: stdlib only, no table
            continue
        allowed = USES.get(where, (frozenset(), ""))[0]
        for text, line in _literals(path):
            if (text in names and text not in allowed) or any(
                q.startswith(text) for q in questions if len(text) > 20
            ):
                found.append(f"cpuaccel/{where}:{line}: {text!r} ({names.get(text, 'question')})")
    assert not found, "declare these in config/settings.py's TABLE:\n" + "\n".join(found)


def test_every_allowed_use_is_still_one() -> None:
    """The list of uses stays small: a use that went away leaves it."""
    names = _declared_names()
    for where, (allowed, why) in USES.items():
        held = {text for text, _ in _literals(PACKAGE / where)} & set(names)
        assert allowed <= held, (where, allowed - held, why)


def test_the_inventory_checks_the_settings_variables_by_their_kinds() -> None:
    """inventory/variables.py lists its own variables; the settings' are the table's."""
    table_vars = [var for entry in TABLE for var in entry.variables]
    assert list(INVENTORY_VARIABLES) == table_vars
    assert not set(VARIABLES) & set(table_vars)
    for entry in TABLE:
        for var in entry.variables:
            assert INVENTORY_VARIABLES[var].check == entry.kind.check, var
    # Together, every variable the inventory checked before it took the settings' from
    # the table.
    assert set(VARIABLES) | set(INVENTORY_VARIABLES) >= {
        "cpuaccel_ppn", "cpuaccel_slots", "cpuaccel_launcher", "cpuaccel_master_port",
        "cpuaccel_mixed_precision", "cpuaccel_ccl_workers", "cpuaccel_mpirun",
        "cpuaccel_fi_provider", "cpuaccel_network", "cpuaccel_allocator",
        "cpuaccel_templates", "cpuaccel_backend", "cpuaccel_grad_reduce", "cpuaccel_weights",
        "cpuaccel_deterministic", "cpuaccel_env", "cpuaccel_secret_env", "cpuaccel_python",
        "cpuaccel_venv", "cpuaccel_workdir", "cpuaccel_setvars", "cpuaccel_known_hosts",
        "cpuaccel_ssh_persist", "cpuaccel_slurm_job",
    }  # fmt: skip


def test_the_questionnaire_asks_the_tables_questions() -> None:
    asked = [name for name in questionnaire.SETTINGS_ASKED]
    assert asked == ["master_port", "launcher", "ccl_workers", "mixed_precision"]
    assert all(BY_NAME[name].question is not None for name in asked)
    assert {entry.name for entry in TABLE if entry.question is not None} == set(asked)
