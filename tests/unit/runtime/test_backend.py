"""The backend and extension init chooses (runtime/backend.py): gloo, or oneCCL's bindings
built for this torch, a forced backend, and IPEX applied per model/optimizer pair.

IPEX and oneCCL's bindings cannot be installed beside this torch: their decisions are
tested with stand-in modules put into sys.modules (fixtures named ``*_standin``)."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import cpuaccel
from cpuaccel.runtime import backend as backend_mod
from cpuaccel.runtime.backend import choose_backend, find_extension
from cpuaccel.runtime.context import Context

TORCH = torch.__version__


def other_minor(version: str) -> str:
    major, minor = backend_mod.major_minor(version).split(".")
    return f"{major}.{int(minor) - 5}.0+cpu"


def _standin(
    monkeypatch: pytest.MonkeyPatch, name: str, version: str, **attrs: Any
) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(STANDIN=True, __version__=version, **attrs)
    monkeypatch.setitem(sys.modules, name, module)
    return module


@pytest.fixture
def fake_ccl_standin(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], types.ModuleType]:
    """A stand-in for oneccl_bindings_for_pytorch of the given version (not the real one)."""
    return lambda version: _standin(monkeypatch, backend_mod.CCL_MODULE, version)


class IpexCalls:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def optimize(self, model: nn.Module, optimizer: Any = None, **kwargs: Any) -> Any:
        self.calls.append({"model": model, "optimizer": optimizer, **kwargs})
        model.ipex_optimized = True  # type: ignore[assignment]
        return model if optimizer is None else (model, optimizer)


@pytest.fixture
def fake_ipex_standin(
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[[str], tuple[types.ModuleType, IpexCalls]]:
    """A stand-in for intel_extension_for_pytorch that records its optimize() calls."""

    def make(version: str) -> tuple[types.ModuleType, IpexCalls]:
        calls = IpexCalls()
        module = _standin(monkeypatch, backend_mod.IPEX_MODULE, version, optimize=calls.optimize)
        return module, calls

    return make


def test_backend_is_gloo_without_ccl_bindings() -> None:
    assert backend_mod.CCL_MODULE not in sys.modules
    choice = choose_backend(None, {}, TORCH)
    assert choice.name == "gloo"
    assert choice.reason == "oneccl_bindings_for_pytorch is not installed"


def test_backend_is_ccl_when_the_standin_matches_torch(
    fake_ccl_standin: Callable[[str], types.ModuleType],
) -> None:
    fake_ccl_standin(TORCH)
    choice = choose_backend(None, {}, TORCH)
    assert choice.name == "ccl"
    assert f"matches torch {TORCH}" in choice.reason


def test_backend_is_gloo_when_the_standin_is_built_for_another_torch(
    fake_ccl_standin: Callable[[str], types.ModuleType],
) -> None:
    old = other_minor(TORCH)
    fake_ccl_standin(old)
    choice = choose_backend(None, {}, TORCH)
    assert choice.name == "gloo"
    assert choice.reason == (
        f"oneccl_bindings_for_pytorch {old} is built for torch "
        f"{backend_mod.major_minor(old)}, this is torch {TORCH}"
    )


def test_forced_backend_wins_and_says_so(
    fake_ccl_standin: Callable[[str], types.ModuleType],
) -> None:
    fake_ccl_standin(TORCH)  # ccl would be chosen otherwise
    forced = choose_backend(None, {"CPUACCEL_BACKEND": "gloo"}, TORCH)
    assert (forced.name, forced.reason) == ("gloo", "forced by $CPUACCEL_BACKEND")
    # init's own argument wins over the environment.
    argument = choose_backend("ccl", {"CPUACCEL_BACKEND": "gloo"}, TORCH)
    assert (argument.name, argument.reason) == ("ccl", "forced by init(backend=...)")


def test_forced_backend_that_cannot_work_is_an_error(
    fake_ccl_standin: Callable[[str], types.ModuleType],
) -> None:
    with pytest.raises(RuntimeError, match=r"CPUACCEL_BACKEND=ccl, but .* not installed"):
        choose_backend(None, {"CPUACCEL_BACKEND": "ccl"}, TORCH)
    fake_ccl_standin(other_minor(TORCH))
    with pytest.raises(RuntimeError, match="is built for torch"):
        choose_backend(None, {"CPUACCEL_BACKEND": "ccl"}, TORCH)
    with pytest.raises(RuntimeError, match="not built with MPI"):
        choose_backend(None, {"CPUACCEL_BACKEND": "mpi"}, TORCH, mpi_available=False)
    with pytest.raises(ValueError, match=r"^\$CPUACCEL_BACKEND: 'nccl' is not a choice"):
        choose_backend(None, {"CPUACCEL_BACKEND": "nccl"}, TORCH)
    with pytest.raises(ValueError, match=r"^init\(backend=\.\.\.\): '-gloo' is not a choice"):
        choose_backend("-gloo", {}, TORCH)


def test_a_build_for_another_torch_is_not_even_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a binary extension built for another torch can crash: metadata is enough."""
    installed = {"oneccl_bind_pt": "2.7.0+cpu"}

    def version(dist_name: str) -> str:
        if dist_name in installed:
            return installed[dist_name]
        raise backend_mod.importlib.metadata.PackageNotFoundError(dist_name)

    def no_import(name: str) -> None:
        raise AssertionError(f"{name} was imported")

    monkeypatch.setattr(backend_mod.importlib.metadata, "version", version)
    monkeypatch.setattr(backend_mod.importlib, "import_module", no_import)
    found = find_extension(backend_mod.CCL_MODULE, backend_mod.CCL_DISTS, "2.13.0+cpu")
    assert found.module is None
    assert found.reason == (
        "oneccl_bindings_for_pytorch 2.7.0+cpu is built for torch 2.7, this is torch 2.13.0+cpu"
    )


# ---------------------------------------------------------------- IPEX


def test_ipex_standin_matching_torch_is_applied_per_pair(
    ctx: Context,
    fake_ipex_standin: Callable[[str], tuple[types.ModuleType, IpexCalls]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, ipex = fake_ipex_standin(TORCH)
    a, b = nn.Linear(3, 3), nn.Linear(3, 2)
    opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters())
    # Optimizers are matched to their models by parameters, not by position.
    out = ctx.prepare(opt_b, a, b, opt_a)
    assert out == (opt_b, a, b, opt_a)
    assert [(c["model"], c["optimizer"], c["dtype"]) for c in ipex.calls] == [
        (a, opt_a, torch.bfloat16),
        (b, opt_b, torch.bfloat16),
    ]
    assert "cpuaccel: IPEX optimize applied to 2 model(s)" in capsys.readouterr().err


def test_ipex_standin_for_another_torch_is_skipped_with_a_reason(
    ctx: Context,
    fake_ipex_standin: Callable[[str], tuple[types.ModuleType, IpexCalls]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    old = other_minor(TORCH)
    _, ipex = fake_ipex_standin(old)
    model = nn.Linear(3, 3)
    prepared = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))[0]
    assert ipex.calls == [] and not hasattr(prepared, "ipex_optimized")
    skipped = [line for line in capsys.readouterr().err.splitlines() if "IPEX" in line]
    assert skipped == [
        f"cpuaccel: IPEX skipped: intel_extension_for_pytorch {old} is built for torch "
        f"{backend_mod.major_minor(old)}, this is torch {TORCH}"
    ]


def test_ipex_absent_or_disabled_is_skipped(
    clean_env: None,
    tmp_path: Path,
    fake_ipex_standin: Callable[[str], tuple[types.ModuleType, IpexCalls]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    with cpuaccel.init(metrics_path=tmp_path / "m.jsonl") as absent:
        absent.prepare(nn.Linear(2, 2))
    assert "IPEX skipped: intel_extension_for_pytorch is not installed" in capsys.readouterr().err
    _, ipex = fake_ipex_standin(TORCH)
    with cpuaccel.init(ipex=False, metrics_path=tmp_path / "m.jsonl") as off:
        model = nn.Linear(2, 2)
        off.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert ipex.calls == []
    assert "IPEX skipped: init(ipex=False)" in capsys.readouterr().err
