"""The precision choice from recorded /proc/cpuinfo of the kinds of machine cpuaccel meets:
an EPYC without AVX512 (a common cloud instance: bf16 would be emulated), an EPYC with
AVX512-BF16 (Zen 4) and a Sapphire Rapids Xeon with AMX. Both places that decide are
fed the same files: the rank's own look (``resolve_precision``) and the controller's,
from the facts the node program reads (``choose_precision``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from cpuaccel.inventory.host import Host
from cpuaccel.jobs.plan import choose_precision
from cpuaccel.node import facts as node_facts
from cpuaccel.runtime.precision import cpu_flags, resolve_precision

RECORDED = Path(__file__).parent / "data" / "cpuinfo"
ZEN3 = RECORDED / "epyc-zen3-no-avx512.txt"
ZEN4 = RECORDED / "epyc-zen4-avx512-bf16.txt"
SPR = RECORDED / "xeon-spr-amx.txt"


def recorded_facts(monkeypatch: pytest.MonkeyPatch, cpuinfo: Path) -> dict[str, Any]:
    """The facts program's cpu section on a node whose /proc/cpuinfo is the recording."""
    real = node_facts.read

    def read(path: str, limit: int | None = None) -> bytes:
        return cpuinfo.read_bytes() if path == "/proc/cpuinfo" else real(path, limit)

    monkeypatch.setattr(node_facts, "read", read)
    return {"cpu": node_facts.cpu_topology()}


@pytest.mark.parametrize(
    ("cpuinfo", "dtype", "why"),
    [
        (ZEN3, None, "this CPU has no AMX or AVX512-BF16 (bf16 would be emulated)"),
        (ZEN4, torch.bfloat16, "the CPU has avx512_bf16"),
        (SPR, torch.bfloat16, "the CPU has amx_bf16, amx_tile, avx512_bf16"),
    ],
)
def test_a_rank_picks_from_its_own_cpuinfo(
    cpuinfo: Path, dtype: torch.dtype | None, why: str
) -> None:
    chosen = resolve_precision("auto", cpu_flags(path=str(cpuinfo)))
    assert chosen.dtype == dtype
    assert chosen.note is not None and chosen.note.endswith(why)
    forced = resolve_precision("bf16", cpu_flags(path=str(cpuinfo)))
    assert forced.dtype is torch.bfloat16  # an explicit bf16 is honoured on every kind
    assert forced.note is not None
    assert ("no native bf16" in forced.note) == (dtype is None)


@pytest.mark.parametrize(
    ("cpuinfo", "exported", "why"),
    [
        (ZEN3, "no", "precision auto -> fp32: no AMX-BF16 or AVX512-BF16 on n1, n2 "),
        (ZEN4, "bf16", "precision auto -> bf16: every node has avx512_bf16"),
        (SPR, "bf16", "precision auto -> bf16: every node has amx_bf16"),
    ],
)
def test_the_controller_picks_from_the_nodes_facts(
    monkeypatch: pytest.MonkeyPatch, cpuinfo: Path, exported: str, why: str
) -> None:
    cpu = recorded_facts(monkeypatch, cpuinfo)
    hosts = [Host("n1"), Host("n2")]
    choice = choose_precision("auto", hosts, {"n1": cpu, "n2": cpu})
    assert (choice.accelerate, choice.cpuaccel) == (exported, exported)
    assert choice.note is not None and choice.note.startswith(why)


def test_a_mixed_cluster_trains_in_fp32_and_forced_bf16_is_warned_about(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spr = recorded_facts(monkeypatch, SPR)
    zen3 = recorded_facts(monkeypatch, ZEN3)
    hosts = [Host("xeon"), Host("cloud")]
    facts = {"xeon": spr, "cloud": zen3}
    auto = choose_precision("auto", hosts, facts)
    assert auto.cpuaccel == "no" and auto.note is not None and "on cloud " in auto.note
    forced = choose_precision("bf16", hosts, facts)
    assert (forced.accelerate, forced.cpuaccel) == ("bf16", "bf16")
    assert forced.note is not None and forced.note.startswith(
        "warning: mixed precision bf16 without native bf16 on cloud "
    )
    assert choose_precision("bf16", hosts, {"xeon": spr, "cloud": spr}).note is None
