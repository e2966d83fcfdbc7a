"""Markers of the eager suite (``tests/``).

``benchmark``: runs a benchmark script in its quick mode as a smoke test (a subprocess of
about a minute; no timing is asserted). Part of the normal suite; ``-m "not benchmark"``
leaves it out.
"""

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "benchmark: a benchmark's quick mode, run as a smoke test")
