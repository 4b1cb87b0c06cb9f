"""The rank side's reading of a forced setting: init's argument over the variable."""

from __future__ import annotations

import pytest

from cpuaccel.errors import SettingError
from cpuaccel.rank_settings import BACKEND_ENV, forced_value


def test_init_s_argument_wins_over_the_variable_and_is_lower_cased() -> None:
    environ = {BACKEND_ENV: "gloo"}
    assert forced_value(BACKEND_ENV, "backend", " CCL ", environ) == ("ccl", "init(backend=...)")
    assert forced_value(BACKEND_ENV, "backend", None, environ) == ("gloo", "$CPUACCEL_BACKEND")


def test_nothing_given_forces_nothing() -> None:
    assert forced_value(BACKEND_ENV, "backend", "", {BACKEND_ENV: ""})[0] is None


def test_a_bad_value_names_where_it_was_given() -> None:
    with pytest.raises(SettingError, match=r"^\$CPUACCEL_BACKEND: 'nccl' is not a choice"):
        forced_value(BACKEND_ENV, "backend", None, {BACKEND_ENV: "nccl"})
