"""Hypothesis profiles for the compile-parity suite, and a Dynamo reset per test.

``ci`` (default): derandomized, fixed example counts, no deadline.
``deep``: ten times the examples, with random seeds.
Select with ``HYPOTHESIS_PROFILE=deep``.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch._dynamo
from hypothesis import HealthCheck, Phase, settings

_COMMON = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
    "print_blob": True,
}
# ci does not shrink: a failure prints its reproducer at once instead of spending
# minutes of compiles on a smaller example (deep shrinks).
settings.register_profile(
    "ci",
    max_examples=3,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    **_COMMON,
)
settings.register_profile("deep", max_examples=30, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def examples(n: int) -> int:
    """``n`` examples in ci, ``10 * n`` in deep."""
    return n * 10 if os.environ.get("HYPOTHESIS_PROFILE") == "deep" else n


@pytest.fixture(autouse=True)
def _reset_dynamo():
    # GRU / LSTM: Dynamo refuses them unless this experimental flag is set; set
    # for the parity tests only, not for the rest of the session.
    with torch._dynamo.config.patch(allow_rnn=True):
        torch._dynamo.reset()
        yield
        torch._dynamo.reset()
