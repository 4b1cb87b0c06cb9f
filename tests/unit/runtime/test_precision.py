"""Precision ``auto`` (the default): bf16 where the CPU has AMX or AVX512-BF16, else fp32,
said once by rank 0; an explicit ``bf16`` is honoured everywhere. The CPU's flags come
from a string or a file here, so both kinds of machine are tested on either."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import cpuaccel
from cpuaccel.runtime import precision
from cpuaccel.runtime.precision import cpu_bf16_support, cpu_flags, resolve_precision

# /proc/cpuinfo's shape: one block a processor; only the first one's flags are read.
EPYC_ZEN3 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 avx512f\n\n"
XEON_SPR = "processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
ZEN4 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n"
BF16 = "precision auto -> bf16: the CPU has"
NO_BF16 = "precision auto -> fp32: this CPU has no AMX or AVX512-BF16 (bf16 would be emulated)"
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")
LAUNCH_VARS += ("MASTER_PORT", "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")
LAUNCH_VARS += ("CPUACCEL_BACKEND", "CPUACCEL_GRAD_SYNC", "CPUACCEL_RUN_DIR")


def test_flags_are_read_from_text_or_a_file(tmp_path: Path) -> None:
    assert cpu_flags(XEON_SPR) >= {"amx_bf16", "amx_tile", "avx512_bf16"}
    info = tmp_path / "cpuinfo"
    info.write_text(ZEN4 + "processor\t: 1\nflags\t\t: other\n")
    assert cpu_flags(path=str(info)) == {"fpu", "avx2", "avx512f", "avx512_bf16", "avx512_vnni"}
    assert cpu_flags(path=str(tmp_path / "missing")) == set()
    assert cpu_bf16_support(cpu_flags(XEON_SPR)) == "amx_bf16, amx_tile, avx512_bf16"
    assert cpu_bf16_support(cpu_flags(EPYC_ZEN3)) == ""


@pytest.mark.parametrize(
    ("cpuinfo", "dtype", "note"),
    [
        (XEON_SPR, torch.bfloat16, f"{BF16} amx_bf16, amx_tile, avx512_bf16"),
        (ZEN4, torch.bfloat16, f"{BF16} avx512_bf16"),
        ("processor\t: 0\nflags\t\t: amx_tile\n", torch.bfloat16, f"{BF16} amx_tile"),
        (EPYC_ZEN3, None, NO_BF16),
        ("", None, NO_BF16),  # unknown (no /proc): fp32, never a slow guess
    ],
)  # fmt: skip
def test_auto_is_bf16_only_where_it_is_native(
    cpuinfo: str, dtype: torch.dtype | None, note: str
) -> None:
    chosen = resolve_precision("auto", cpu_flags(cpuinfo))
    assert (chosen.dtype, chosen.note) == (dtype, note)
    assert chosen.name == ("bf16" if dtype is not None else "fp32")


def test_explicit_bf16_is_honoured_without_native_support() -> None:
    chosen = resolve_precision("bf16", cpu_flags(EPYC_ZEN3))
    assert chosen.dtype is torch.bfloat16
    assert chosen.note is not None and "no native bf16 (may be slower than fp32" in chosen.note
    native = resolve_precision("BF16", cpu_flags(ZEN4))
    assert native.note == "mixed precision bf16: the CPU has avx512_bf16"
    for fp32 in ("no", "fp32"):
        assert resolve_precision(fp32, cpu_flags(XEON_SPR)) == precision.Precision(None, None)
    with pytest.raises(ValueError, match="use 'auto', 'bf16' or 'no'"):
        resolve_precision("fp8", set())


@pytest.fixture
def world_of_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in (*LAUNCH_VARS, precision.PRECISION_ENV):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "metrics.jsonl"


def as_cpu(monkeypatch: pytest.MonkeyPatch, cpuinfo: str) -> None:
    """This process's CPU, as init sees it, becomes the one described."""
    monkeypatch.setattr(precision, "cpu_flags", lambda *a, **k: cpu_flags(cpuinfo))


@pytest.mark.parametrize(
    ("cpuinfo", "dtype", "line"),
    [
        (EPYC_ZEN3, None, f"cpuaccel: {NO_BF16}"),
        (XEON_SPR, torch.bfloat16, "cpuaccel: precision auto -> bf16: the CPU has amx_bf16"),
    ],
)
def test_init_defaults_to_auto_and_says_why_once(
    world_of_one: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    cpuinfo: str,
    dtype: torch.dtype | None,
    line: str,
) -> None:
    as_cpu(monkeypatch, cpuinfo)
    with cpuaccel.init(metrics_path=world_of_one) as ctx:
        assert ctx.dtype == dtype
    err = capsys.readouterr().err.splitlines()
    said = [e for e in err if "precision" in e]
    assert len(said) == 1 and said[0].startswith(line), err
    assert not dist.is_initialized()


def test_what_run_exported_wins_over_auto(
    world_of_one: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    as_cpu(monkeypatch, EPYC_ZEN3)
    monkeypatch.setenv(precision.PRECISION_ENV, "bf16")  # cpuaccel run --mixed-precision bf16
    with cpuaccel.init(metrics_path=world_of_one) as ctx:
        assert ctx.dtype is torch.bfloat16
    assert "cpuaccel: mixed precision bf16: this CPU has no native bf16" in capsys.readouterr().err
    monkeypatch.setenv(precision.PRECISION_ENV, "auto")
    with cpuaccel.init(metrics_path=world_of_one) as ctx:
        assert ctx.dtype is None
    assert NO_BF16 in capsys.readouterr().err
    monkeypatch.setenv(precision.PRECISION_ENV, "fp32")
    as_cpu(monkeypatch, XEON_SPR)
    with cpuaccel.init(metrics_path=world_of_one) as ctx:
        assert ctx.dtype is None
    assert "precision" not in capsys.readouterr().err  # fp32 asked for: nothing to explain
