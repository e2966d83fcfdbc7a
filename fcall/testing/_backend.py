"""A counting wrapper around a ``torch.compile`` backend: graphs compiled, graphs run.

Counting compiles finds recompiles; counting *runs* proves that a call ran compiled code:
past its recompile limit Dynamo runs a frame in eager without a word, and a parity check
that does not count runs would then compare eager with eager.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._dynamo.backends.registry import lookup_backend

Backend = str | Callable[..., Any]


def backend_name(backend: Backend) -> str:
    """``"aot_eager"`` for a name, the callable's ``__name__`` (or its type's) otherwise."""
    if isinstance(backend, str):
        return backend
    return str(getattr(backend, "__name__", type(backend).__name__))


class CountingBackend:
    """A ``torch.compile`` backend that counts the graphs it compiles and the times the
    compiled graphs run, and hands each graph to ``backend``."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.name = backend_name(backend)
        self.graphs = 0
        self.runs = 0
        self.__name__ = f"counting_{self.name}"

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        self.graphs += 1
        compiled = lookup_backend(self.backend)(gm, example_inputs)

        def run(*args: Any) -> Any:
            self.runs += 1
            return compiled(*args)

        return run
