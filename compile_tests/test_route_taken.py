"""Which path a compiled swap takes: a Route (``fcall/_core/routes.py``) for the cases it
covers, the generic path with its ``Generic`` reason for the others. A Route that stops being
used fails here (every other compiled test would still pass: the generic path gives the same
results, slower to compile and per call)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from tensordict import TensorDict
from torch import nn

import fcall
from fcall._core import plan as _plan
from fcall._core import traced as _traced
from fcall._core.routes import Generic, Route
from tests.support import Net, Tied, flat, functional_call, swap_call, to_module_call


@pytest.fixture
def decisions(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What each trace-time decision returned, in order."""
    found: list[Any] = []
    decide = _traced._route_of

    def spy(ctx: Any) -> Any:
        found.append(decide(ctx))
        return found[-1]

    monkeypatch.setattr(_traced, "_route_of", spy)
    return found


@pytest.fixture
def generic_builds(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """One item per plan the generic traced path built (the trace records the append, and
    Dynamo replays it after the graph)."""
    found: list[bool] = []
    build = _plan.build

    def spy(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("traced"):  # not the eager plan of the reference call
            found.append(True)
        return build(*args, **kwargs)

    monkeypatch.setattr(_plan, "build", spy)
    return found


def _net_td() -> tuple[nn.Module, TensorDict]:
    m = Net()
    return m, fcall.from_module(m).detach().clone()


CASES: list[tuple[str, Callable, Callable[[], tuple[nn.Module, Any]], Any]] = [
    ("swap flat dict", swap_call, lambda: (lambda m, td: (m, flat(td)))(*_net_td()), Route),
    ("swap TensorDict", swap_call, _net_td, Route),
    ("swap nested dict", swap_call, lambda: (lambda m, td: (m, td.to_dict()))(*_net_td()), Route),
    (
        "functional_call flat dict",
        functional_call,
        lambda: (lambda m, td: (m, flat(td)))(*_net_td()),
        Route,
    ),
    ("to_module TensorDict", to_module_call, _net_td, Route),
    (
        "to_module TensorDictParams",
        to_module_call,
        lambda: (lambda m: (m, fcall.TensorDictParams(fcall.from_module(m).detach().clone())))(
            nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
        ),
        Route,
    ),
    (  # TensorDictParams makes every leaf a Parameter, the buffers' too
        "to_module TensorDictParams with buffers",
        to_module_call,
        lambda: (lambda m, td: (m, fcall.TensorDictParams(td)))(*_net_td()),
        Generic.PARAMETER_FOR_BUFFER,
    ),
    (
        "a tied name given",
        swap_call,
        lambda: (lambda m: (m, {"emb.weight": torch.ones(5, 3)}))(Tied()),
        Generic.TIED,
    ),
    (
        "swap an RNN",
        swap_call,
        lambda: (lambda m: (m, flat(fcall.from_module(m).detach().clone())))(nn.GRU(3, 4)),
        Route,
    ),
    (
        "to_module an RNN",
        to_module_call,
        lambda: (lambda m: (m, fcall.from_module(m).detach().clone()))(nn.LSTM(3, 4, 2)),
        Route,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_each_case_takes_its_path(counter, decisions, generic_builds, case):
    _, call, make, expected = case
    module, params = make()
    x = torch.randint(0, 5, (2,)) if isinstance(module, Tied) else torch.randn(2, 3)
    cnt = counter("eager")
    fn = torch.compile(call, backend=cnt, fullgraph=True)
    with torch.no_grad(), torch._dynamo.config.patch(allow_rnn=True):
        torch.testing.assert_close(fn(module, params, x), call(module, params, x))
    assert cnt.frame_count == 1
    assert len(decisions) == 1
    if expected is Route:
        assert isinstance(decisions[0], Route), decisions[0]
        assert generic_builds == [], "a Route was decided, and the trace built a plan anyway"
    else:
        assert decisions[0] is expected
        assert generic_builds, "no Route, and the trace built no plan"


def test_with_aliasing_guards_on_the_generic_path_reads_the_tensors(counter, decisions):
    module, params = _net_td()
    cnt = counter("eager")
    fn = torch.compile(swap_call, backend=cnt, fullgraph=True)
    with torch._dynamo.config.patch(skip_no_tensor_aliasing_guards_on_parameters=False):
        with torch.no_grad():
            fn(module, params, torch.randn(2, 3))
    assert decisions == [Generic.ALIASING_GUARDS]
