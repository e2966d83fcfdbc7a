"""Shared options for the conformance suites under conformance/.

``--against fcall`` (default) runs an upstream suite with fcall behind it; ``--against peer``
runs the same suite on the stock library, as the reference. Each suite's own conftest.py
reads the option (``request.config.getoption("--against")``) and does its routing.
"""

from __future__ import annotations

import pytest

# --doctest-modules (pyproject) imports each .py file it collects as a module named after the
# file; the suites' conftest.py files, in no package, would all be "conftest" and clash when
# two suites run in one session ("import file mismatch"). They hold no doctests.
collect_ignore_glob = ["conftest.py", "*/conftest.py"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance")
    group.addoption(
        "--against",
        choices=("fcall", "peer"),
        default="fcall",
        help="run the conformance suites against fcall (default) or the stock peer library",
    )
