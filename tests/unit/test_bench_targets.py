"""bench/launch_phases.py times run's phases by wrapping functions by name: a function
moved or renamed in cpuaccel would stop the launch bench at its first run (it did once,
when check_launcher_reach moved to jobs/launcher_reach.py). Every name it wraps must
exist where it looks."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "launch_phases.py"


def test_every_function_the_launch_phases_bench_wraps_exists() -> None:
    tree = ast.parse(BENCH.read_text())
    modules: dict[str, str] = {}  # a name imported in the bench -> its module's path
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cpuaccel"):
            for alias in node.names:
                modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    targets = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_timed":
            owner, name = node.args[0], node.args[1]
            assert isinstance(name, ast.Constant)
            targets.append((ast.unparse(owner), name.value))
    assert len(targets) >= 10
    for owner, name in targets:
        first, _, rest = owner.partition(".")
        obj = _resolve(modules[first])
        for part in filter(None, rest.split(".")):
            obj = getattr(obj, part)
        assert hasattr(obj, name), f"bench/launch_phases.py wraps {owner}.{name}: gone"


def _resolve(dotted: str) -> object:
    try:
        return importlib.import_module(dotted)
    except ImportError:  # `from module import Class`
        module, _, attr = dotted.rpartition(".")
        return getattr(importlib.import_module(module), attr)
