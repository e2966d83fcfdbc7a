"""The stand-ins that conftest.py puts behind torch's functional-call names (--against fcall).

In a module of their own, not in conftest.py: every conftest.py of the conformance suites is
imported as a module named ``conftest``, and Dynamo resolves a traced function's globals
through ``sys.modules[fn.__module__]``, which would be another suite's conftest.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

import fcall

# torch's FutureWarning for torch.nn.utils.stateless.functional_call (torch 2.13.0).
STATELESS_DEPRECATION = (
    "`torch.nn.utils.stateless.functional_call` is deprecated as of PyTorch 2.0 "
    "and will be removed in a future version of PyTorch. "
    "Please use `torch.func.functional_call` instead which is a drop-in replacement."
)


def as_torch_func(
    module: torch.nn.Module,
    parameter_and_buffer_dicts: Any,
    args: Any = None,
    kwargs: dict[str, Any] | None = None,
    *,
    tie_weights: bool = True,
    strict: bool = False,
) -> Any:
    """fcall.functional_call behind torch.func.functional_call's signature."""
    return fcall.functional_call(
        module, parameter_and_buffer_dicts, args, kwargs, tie_weights=tie_weights, strict=strict
    )


def as_stateless(
    module: torch.nn.Module,
    parameters_and_buffers: Any,
    args: Any = None,
    kwargs: dict[str, Any] | None = None,
    *,
    tie_weights: bool = True,
    strict: bool = False,
) -> Any:
    """fcall.functional_call behind torch.nn.utils.stateless._functional_call's signature."""
    return fcall.functional_call(
        module, parameters_and_buffers, args, kwargs, tie_weights=tie_weights, strict=strict
    )


def as_stateless_deprecated(
    module: torch.nn.Module,
    parameters_and_buffers: Any,
    args: Any = None,
    kwargs: dict[str, Any] | None = None,
    *,
    tie_weights: bool = True,
    strict: bool = False,
) -> Any:
    """torch.nn.utils.stateless.functional_call's deprecation shim over ``as_stateless``."""
    warnings.warn(STATELESS_DEPRECATION, FutureWarning, stacklevel=2)
    return as_stateless(
        module, parameters_and_buffers, args, kwargs, tie_weights=tie_weights, strict=strict
    )
