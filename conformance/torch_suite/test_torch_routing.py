"""conftest.py's routing: each torch entry point reaches fcall under --against fcall only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import _torch_route
import pytest
import torch
from torch.func import functional_call

import fcall


def _by_keyword_torch_func(module: torch.nn.Module, params: Any, args: Any) -> Any:
    return torch.func.functional_call(module, parameter_and_buffer_dicts=params, args=args)


def _by_keyword_stateless(module: torch.nn.Module, params: Any, args: Any) -> Any:
    return torch.nn.utils.stateless.functional_call(
        module, parameters_and_buffers=params, args=args
    )


def _by_keyword_stateless_private(module: torch.nn.Module, params: Any, args: Any) -> Any:
    return torch.nn.utils.stateless._functional_call(
        module, parameters_and_buffers=params, args=args
    )


def _functorch_module_attribute(module: torch.nn.Module, params: Any, args: Any) -> Any:
    return torch._functorch.functional_call.functional_call(module, params, args)


def _bound_at_import(module: torch.nn.Module, params: Any, args: Any) -> Any:
    # as test_torch_eager_transforms.py does: `from torch.func import functional_call`
    return functional_call(module, params, args)


@pytest.mark.parametrize(
    "call",
    [
        _torch_route.torch_func,
        _torch_route.stateless,
        _torch_route.stateless_private,
        _by_keyword_torch_func,
        _by_keyword_stateless,
        _by_keyword_stateless_private,
        _functorch_module_attribute,
        _bound_at_import,
    ],
    ids=lambda call: call.__name__,
)
def test_entry_point_reaches_the_library_under_test(
    call: Callable[..., Any], request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    real = fcall.functional_call

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(fcall, "functional_call", spy)
    module = torch.nn.Linear(1, 1)
    params = {"weight": torch.full((1, 1), 3.0), "bias": torch.zeros(1)}
    out = call(module, params, (torch.full((1, 1), 2.0),))
    assert out.item() == 6.0
    against = request.config.getoption("--against")
    assert len(calls) == (1 if against == "fcall" else 0)
