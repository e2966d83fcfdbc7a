"""Routing for the vendored torch functional_call tests (``--against`` is in ../conftest.py).

``--against peer`` routes nothing: the vendored files test torch itself. ``--against fcall``
puts fcall behind each of torch's functional-call entry points for the duration of every
test (an autouse, function-scoped fixture; it applies to the unittest.TestCase methods too):

* ``torch.func.functional_call`` and ``torch._functorch.functional_call.functional_call``
  (the same function object) -> ``as_torch_func``, torch.func's signature;
* ``torch.nn.utils.stateless._functional_call`` -> ``as_stateless``, its signature;
* ``torch.nn.utils.stateless.functional_call`` -> ``as_stateless_deprecated``: torch's
  deprecation shim (the same FutureWarning, then ``as_stateless``), as torch has it;
* every global of a vendored test module that is one of those torch functions (e.g.
  ``from torch.func import functional_call`` in test_torch_eager_transforms.py) -> the same
  stand-in. Functions captured inside ``@parametrize`` lists go through _torch_route.py.

Each stand-in has the exact parameters of the torch function it replaces (checked at
import, below) and forwards every argument unchanged to ``fcall.functional_call``.
"""

from __future__ import annotations

import inspect
import os
import warnings
from typing import Any

import pytest
import torch
import torch._functorch.functional_call
import torch.nn.utils.stateless

HERE = os.path.dirname(os.path.abspath(__file__))

TORCH_FUNC = torch.func.functional_call
TORCH_STATELESS = torch.nn.utils.stateless.functional_call
TORCH_STATELESS_PRIVATE = torch.nn.utils.stateless._functional_call

from _torch_stand_ins import (  # noqa: E402
    as_stateless,
    as_stateless_deprecated,
    as_torch_func,
)

# torch function -> the stand-in that replaces it under --against fcall
STAND_INS = {
    TORCH_FUNC: as_torch_func,
    TORCH_STATELESS: as_stateless_deprecated,
    TORCH_STATELESS_PRIVATE: as_stateless,
}


_STAND_INS_BY_ID = {id(torch_fn): stand_in for torch_fn, stand_in in STAND_INS.items()}


def _parameters(fn: Any) -> list[tuple[str, Any, Any]]:
    sig = inspect.signature(inspect.unwrap(fn))
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


for _torch_fn, _stand_in in STAND_INS.items():
    if _parameters(_torch_fn) != _parameters(_stand_in):
        raise RuntimeError(
            f"conformance/torch_suite: {_stand_in.__name__} does not have the parameters of "
            f"{_torch_fn.__module__}.{_torch_fn.__qualname__}: "
            f"{_parameters(_stand_in)} != {_parameters(_torch_fn)}"
        )

# Tests that are outside fcall's API, expected to fail under --against fcall (strict).
GRAPH_INPUT_NAMES = (
    "Dynamo names a graph input after the source it was read from: torch.func's "
    "functional_call is traced as a special variable that reads the module's own "
    "attributes (L_model_parameters_weight_, L_model_modules_l1_parameters_weight_); "
    "fcall reads the tensors from the dicts the caller passed (L_params_weight_, "
    "L_params_l1_weight_, L_buffers_buffer_). "
    "The graph computes the same thing; the test compares the printed graph."
)
VENDORED_FOR = "2.13."  # the torch whose printed graphs the Dynamo tests compare with
EXPECTED_FAILURES = {
    "test_torch_dynamo_hop_functorch.py::FuncTorchHigherOrderOpTests::test_functional_call": (
        GRAPH_INPUT_NAMES
    ),
    "test_torch_dynamo_hop_functorch.py::FuncTorchHigherOrderOpTests::"
    "test_functional_call_sequential_params_and_buffers": GRAPH_INPUT_NAMES,
}

# Warnings that torch's own test code raises when it imports or runs, which the project's
# `filterwarnings = error` would otherwise turn into errors (message regexes).
TORCH_TEST_WARNINGS = (
    # test_torch_eager_transforms.py, at import: torchvision is not a dependency
    "Couldn't import torchvision",
    # torch.nn.utils.stateless.functional_call is deprecated (torch's, and the stand-in's)
    r"`torch\.nn\.utils\.stateless\.functional_call` is deprecated",
    # test_torch_eager_transforms.py calls functorch.{vmap, grad, jacrev, ...}, deprecated
    "We've integrated functorch into PyTorch",
    # test_maml_regression builds its batches with torch.tensor(list of ndarrays)
    "Creating a tensor from a list of numpy.ndarrays is extremely slow",
    # test_correctness_mnist's Net calls F.log_softmax(x) without dim
    "Implicit dimension choice for log_softmax has been deprecated",
)


def _ours(path: Any) -> bool:
    return str(path).startswith(HERE + os.sep)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    if not _ours(collector.path):
        return (yield)
    with warnings.catch_warnings():
        for message in TORCH_TEST_WARNINGS:
            warnings.filterwarnings("ignore", message=message)
        return (yield)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    against = config.getoption("--against")
    keep, drop = [], []
    for item in items:
        if not _ours(item.path):
            keep.append(item)
            continue
        # The make_functional variants of test_torch_eager_transforms.py's `mechanism`
        # tests exercise functorch.make_functional only: not part of this suite.
        if "mechanism_make_functional" in item.name:
            drop.append(item)
            continue
        keep.append(item)
        for message in TORCH_TEST_WARNINGS:
            item.add_marker(pytest.mark.filterwarnings(f"ignore:{message}"))
        key = item.nodeid.rsplit("/", 1)[-1]
        if key in EXPECTED_FAILURES and not torch.__version__.startswith(VENDORED_FOR):
            # the printed graphs these tests expect are torch 2.13's: on another torch they
            # fail on torch itself (--against peer), so they say nothing about fcall there
            item.add_marker(pytest.mark.skip(reason=f"graph text of torch {VENDORED_FOR}"))
        elif against == "fcall" and key in EXPECTED_FAILURES:
            item.add_marker(
                pytest.mark.xfail(strict=True, raises=AssertionError, reason=EXPECTED_FAILURES[key])
            )
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(autouse=True)
def _route_functional_call(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.config.getoption("--against") != "fcall":
        return
    monkeypatch.setattr(torch.func, "functional_call", as_torch_func)
    monkeypatch.setattr(torch._functorch.functional_call, "functional_call", as_torch_func)
    monkeypatch.setattr(torch.nn.utils.stateless, "functional_call", as_stateless_deprecated)
    monkeypatch.setattr(torch.nn.utils.stateless, "_functional_call", as_stateless)
    module = request.module
    for name, value in list(vars(module).items()):
        stand_in = _STAND_INS_BY_ID.get(id(value))
        if stand_in is not None:
            monkeypatch.setattr(module, name, stand_in)
