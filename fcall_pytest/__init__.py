"""fcall's pytest plugin (entry point ``pytest11``: ``fcall = "fcall_pytest"``).

Inert unless a test asks for it:

* the ``swap_parity`` fixture is ``fcall.testing.check_swap_parity``, with Dynamo reset
  before and after the test, and defaults taken from the test's ``swap_parity`` marker
  and from ``--swap-parity-backends``;
* the marker ``@pytest.mark.swap_parity(backends=("eager",), max_recompiles=1, ...)``
  sets those defaults (any keyword of ``check_swap_parity``);
* ``--swap-parity-backends=eager,aot_eager`` sets the backends of every
  ``swap_parity`` call that does not name its own (a CI machine without a C++ compiler
  leaves ``inductor`` out).

This module lives outside the ``fcall`` package so that loading it at pytest's startup
imports neither fcall nor torch: the fixture imports them when a test uses it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

MARKER = "swap_parity"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fcall", "fcall swap parity")
    group.addoption(
        "--swap-parity-backends",
        default=None,
        help="comma-separated torch.compile backends for the swap_parity fixture "
        "(default: check_swap_parity's eager,aot_eager,inductor)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(**kwargs): defaults of the swap_parity fixture "
        "(keywords of fcall.testing.check_swap_parity)",
    )


@pytest.fixture
def swap_parity(request: pytest.FixtureRequest) -> Iterator[Callable[..., Any]]:
    """``fcall.testing.check_swap_parity``, with the marker's and the option's defaults.

    ``swap_parity(model, param_sets, inputs, **kwargs)`` returns the ``ParityReport`` or
    raises ``ParityError`` (the test fails with its message).
    """
    import torch._dynamo

    from fcall.testing import check_swap_parity

    defaults: dict[str, Any] = {}
    option = request.config.getoption("--swap-parity-backends")
    if option:
        defaults["backends"] = tuple(b.strip() for b in option.split(",") if b.strip())
    for mark in reversed(list(request.node.iter_markers(MARKER))):  # closest mark wins
        defaults.update(mark.kwargs)

    def check(model: Any, param_sets: Any, inputs: Any, **kwargs: Any) -> Any:
        return check_swap_parity(model, param_sets, inputs, **{**defaults, **kwargs})

    torch._dynamo.reset()
    yield check
    torch._dynamo.reset()
