"""Which process-group backend, and whether IPEX is used: decisions with their reasons.

Both oneCCL's bindings (``oneccl_bindings_for_pytorch``) and IPEX
(``intel_extension_for_pytorch``) are compiled against one torch release and are
end-of-life upstream, so they are used only when present *and* built for the installed
torch (same major.minor); anything else falls back to what torch has itself (gloo,
torch's own bf16 kernels), with a one-line reason. A package whose installed metadata
already shows another torch release is not imported at all: loading a binary extension
built for another torch can crash the interpreter.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType

from cpuaccel.rank_settings import BACKEND_ENV, forced_value

CCL_MODULE = "oneccl_bindings_for_pytorch"
CCL_DISTS = ("oneccl_bind_pt", "oneccl-bind-pt")
IPEX_MODULE = "intel_extension_for_pytorch"
IPEX_DISTS = ("intel_extension_for_pytorch", "intel-extension-for-pytorch")


def major_minor(version: str) -> str:
    """``"2.7.0+cpu"`` -> ``"2.7"``."""
    parts = version.split("+")[0].split(".")
    return ".".join(parts[:2])


@dataclass(frozen=True)
class Extension:
    """An optional extension: the module when usable, else why not."""

    module: ModuleType | None
    reason: str

    @property
    def usable(self) -> bool:
        return self.module is not None


def find_extension(name: str, dists: tuple[str, ...], torch_version: str) -> Extension:
    """Import ``name`` if it is there and built for ``torch_version`` (same major.minor)."""
    want = major_minor(torch_version)
    module = sys.modules.get(name)
    if module is None:
        for dist in dists:
            try:
                installed = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                continue
            if major_minor(installed) != want:
                return Extension(
                    None,
                    f"{name} {installed} is built for torch {major_minor(installed)}, "
                    f"this is torch {torch_version}",
                )
            break
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            if getattr(exc, "name", None) == name:
                return Extension(None, f"{name} is not installed")
            return Extension(None, f"{name} does not import: {_first_line(exc)}")
        except Exception as exc:  # a binary extension can fail in many ways
            return Extension(None, f"{name} does not import: {_first_line(exc)}")
    version = str(getattr(module, "__version__", "") or "")
    if not version:
        return Extension(None, f"{name} has no __version__ to match against torch")
    if major_minor(version) != want:
        return Extension(
            None,
            f"{name} {version} is built for torch {major_minor(version)}, "
            f"this is torch {torch_version}",
        )
    return Extension(module, f"{name} {version} matches torch {torch_version}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


@dataclass(frozen=True)
class BackendChoice:
    name: str
    reason: str


def choose_backend(
    requested: str | None,
    environ: Mapping[str, str],
    torch_version: str,
    mpi_available: bool = False,
) -> BackendChoice:
    """The backend to initialize: ``requested`` > $CPUACCEL_BACKEND > ccl if usable > gloo.

    A forced ``ccl`` imports the bindings (that registers the backend with torch) and
    fails loudly when they are unusable; a forced ``mpi`` needs a torch built with MPI.
    """
    forced, source = forced_value(BACKEND_ENV, "backend", requested, environ)
    if forced is not None:
        if forced == "ccl":
            ccl = find_extension(CCL_MODULE, CCL_DISTS, torch_version)
            if not ccl.usable:
                raise RuntimeError(f"{source}=ccl, but {ccl.reason}")
        if forced == "mpi" and not mpi_available:
            raise RuntimeError(
                f"{source}=mpi, but this torch is not built with MPI "
                "(gradients still go through MPI with the default CPUACCEL_GRAD_SYNC)"
            )
        return BackendChoice(forced, f"forced by {source}")
    ccl = find_extension(CCL_MODULE, CCL_DISTS, torch_version)
    if ccl.usable:
        return BackendChoice("ccl", ccl.reason)
    return BackendChoice("gloo", ccl.reason)
