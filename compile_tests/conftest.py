"""Shared fixtures of the compile tests.

- Dynamo is reset before and after every test (autouse), so that no cache entry,
  guard or recompile count leaks from one test into the next.
- ``counter`` gives a factory of counting backends: ``cnt = counter("aot_eager")``
  returns a ``torch._dynamo.testing.CompileCounterWithBackend``; pass it as the
  ``backend=`` of ``torch.compile`` and assert ``cnt.frame_count`` (graphs compiled,
  one per frame and graph break) after several calls::

      def test_one_graph(counter):
          cnt = counter("eager")
          fn = torch.compile(f, backend=cnt, fullgraph=True)
          fn(a); fn(b)
          assert cnt.frame_count == 1  # no recompile for the second call

  A recompile past ``torch._dynamo.config.recompile_limit`` silently falls back
  to eager; counting frames is what makes such a test able to fail.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounterWithBackend

# --doctest-modules would import this file as a test module named "conftest", which
# conformance/'s conftest files also are: not collected, only loaded as a plugin.
collect_ignore = ["conftest.py"]


@pytest.fixture(autouse=True)
def _reset_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def counter() -> Callable[[str], CompileCounterWithBackend]:
    """A factory: ``counter(backend="eager")`` -> a new ``CompileCounterWithBackend``."""

    def make(backend: str = "eager") -> CompileCounterWithBackend:
        return CompileCounterWithBackend(backend)

    return make
