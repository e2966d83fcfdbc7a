"""A warm eager call stays on its short path (``python -m benchmarks call_path`` prints it):
the fcall modules it runs through and the fcall functions it calls, from the API's entry to
its return. Deterministic counts, not times; a new hop on the path fails here."""

from __future__ import annotations

import pytest

from benchmarks.call_path import paths

# api -> (most fcall modules, most fcall function calls)
BUDGET = {"swap": (4, 16), "to_module": (5, 20), "functional_call": (4, 14)}


@pytest.fixture(scope="module")
def measured():
    return {p.api: p for p in paths()}


@pytest.mark.parametrize("api", list(BUDGET))
def test_a_warm_call_stays_on_its_short_path(measured, api):
    path = measured[api]
    most_modules, most_calls = BUDGET[api]
    assert len(set(path.modules)) <= most_modules, path.modules
    assert len(path.calls) <= most_calls, path.calls
    assert path.modules[0] == f"fcall._fronts.{api}"  # entered through its own front
    assert {m.split(".")[1] for m in path.modules} <= {"_fronts", "_core"}
