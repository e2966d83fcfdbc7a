"""Shared fixtures of the eager tests.

``swap_lane`` runs a test twice: once as fcall runs by default (a test swaps a
structure a few times, so every swap takes the generic path), once with the
express lane built at a plan's first use (``fcall/_express.py``), so that every
later swap of that structure goes through the generated code. The eager test
modules apply it to all their tests with ``pytestmark``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fcall import _express


@pytest.fixture(params=["generic", "express"])
def swap_lane(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "express":
        monkeypatch.setattr(_express, "_OFFERS_BEFORE_BUILD", 1)
    yield request.param
