"""--mixed-precision auto is settled once for the job from every chosen node's CPU."""

from __future__ import annotations

from typing import Any

import pytest

from cpuaccel.inventory.host import Host
from cpuaccel.jobs.plan import PLACEHOLDER, choose_precision

HOSTS = [Host(name) for name in ("n1", "n2", "n3")]


def cpu(*flags: str) -> dict[str, Any]:
    return {"cpu": {"isa": {flag: True for flag in flags}}}


def test_bf16_when_every_node_has_native_bf16() -> None:
    facts = {"n1": cpu("amx_bf16"), "n2": cpu("avx512_bf16"), "n3": cpu("avx512_bf16")}
    choice = choose_precision("auto", HOSTS, facts)
    assert (choice.accelerate, choice.cpuaccel) == ("bf16", "bf16")
    assert choice.note and "amx_bf16 or avx512_bf16" in choice.note


def test_fp32_when_one_node_would_emulate_bf16_and_it_is_named() -> None:
    facts = {"n1": cpu("amx_bf16"), "n2": cpu("avx2"), "n3": cpu("avx512_bf16")}
    choice = choose_precision("auto", HOSTS, facts)
    assert (choice.accelerate, choice.cpuaccel) == ("no", "no")
    assert choice.note and "on n2 " in choice.note and "--mixed-precision bf16" in choice.note


def test_a_dry_run_without_facts_shows_a_placeholder() -> None:
    choice = choose_precision("auto", HOSTS, None)
    assert (choice.accelerate, choice.cpuaccel, choice.note) == (PLACEHOLDER, "auto", None)


@pytest.mark.parametrize(
    ("value", "exported"), [("bf16", "bf16"), ("no", "no"), ("fp32", "no"), (None, None)]
)
def test_explicit_values_are_kept_whatever_the_cpu(value: str | None, exported: str | None) -> None:
    choice = choose_precision(value, HOSTS, {h.name: cpu() for h in HOSTS})
    assert (choice.accelerate, choice.cpuaccel) == (exported, exported)
    if value == "bf16":  # honoured, and said to be emulated on these nodes
        assert choice.note is not None and "without native bf16 on n1, n2, n3 " in choice.note
    else:
        assert choice.note is None
