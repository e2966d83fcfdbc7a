"""A compiled swap whose plan was decided outside the trace (``fcall/_core/traced.py``) is sound:
after a first compile, a change of the module's or the params' structure recompiles (or
raises the eager error) and then gives eager's result, never a stale one (issue 35).

Each case compiles ``swap`` / ``functional_call`` / ``to_module`` with a counting backend,
calls it once, changes the structure, and calls it again: the result, the exception and
the module's state afterwards are those of the same call in eager, and the frame count
says whether Dynamo recompiled.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from tensordict import TensorDict
from torch import nn
from torch._dynamo.exc import Unsupported

import fcall
from tests.support import (
    assert_frames,
    assert_same_state,
    functional_call,
    key_order_recompiles,
    layout,
    state,
    swap_call,
    to_module_call,
)


class Model(nn.Module):
    """Two linears, a buffer that is swapped, and a parameter that forward scales by."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
        self.scale = nn.Parameter(torch.ones(2))
        self.register_buffer("shift", torch.zeros(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) * self.scale + self.shift


APIS = [swap_call, functional_call, to_module_call]


def values_of(m: nn.Module, container: str = "flat") -> object:
    td = fcall.from_module(m).detach().apply(torch.randn_like)
    if container == "tensordict":
        return td
    return dict(td.flatten_keys(".").items())


def _outcome(fn: Callable, m: nn.Module, p: object, x: torch.Tensor) -> tuple:
    try:
        return ("value", fn(m, p, x)), layout(m)
    except Exception as error:
        return ("error", type(error), str(error)), layout(m)


def _same_outcome(compiled: tuple, eager: tuple) -> None:
    """The same result, or the same error: under ``fullgraph=True`` Dynamo raises
    ``Unsupported: Observed exception`` with fcall's message inside
    (compile_tests/test_fullgraph_errors.py)."""
    (got, got_state), (expected, expected_state) = compiled, eager
    assert got[0] == expected[0], (got, expected)
    if got[0] == "value":
        torch.testing.assert_close(got[1], expected[1])
    else:
        assert got[1] in (expected[1], Unsupported), (got, expected)
        assert expected[2].splitlines()[0] in got[2], (got[2], expected[2])
    assert got_state == expected_state


def replace_submodule(m: Model) -> None:
    m.body[2] = nn.Linear(4, 2, bias=False)  # "body.2.bias" now names nothing


def insert_submodule(m: Model) -> None:
    m.body.insert(0, nn.Identity())  # every index shifts


def delete_parameter(m: Model) -> None:
    del m.scale
    m.scale = torch.ones(2)  # a plain attribute now


def parameter_to_buffer(m: Model) -> None:
    scale = m.scale
    del m.scale
    m.register_buffer("scale", scale.detach().clone())


def buffer_to_parameter(m: Model) -> None:
    shift = m.shift
    del m.shift
    m.shift = nn.Parameter(shift.clone())


def reassign_buffer(m: Model) -> None:
    m.shift = torch.full((2,), 5.0)


def train_to_eval(m: Model) -> None:
    m.body.insert(1, nn.Dropout(0.5))  # with a dropout, eval() changes the result
    m.eval()


def add_hook(m: Model) -> None:
    # Dynamo guards a submodule's hooks only with skip_nnmodule_hook_guards=False (its
    # default skips them, for torch.func's compiled function too): the test turns it off
    m.body[0].register_forward_hook(lambda mod, args, out: out * 3)


def add_parameter(m: Model) -> None:
    m.body[0].register_parameter("extra", nn.Parameter(torch.ones(1)))


CHANGES = [
    replace_submodule,
    insert_submodule,
    delete_parameter,
    parameter_to_buffer,
    buffer_to_parameter,
    reassign_buffer,
    train_to_eval,
    add_hook,
    add_parameter,
]


@pytest.mark.parametrize("change", CHANGES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("container", ["flat", "tensordict"])
@pytest.mark.parametrize("api", APIS, ids=lambda f: f.__name__)
def test_a_structure_changed_after_compiling_gives_eagers_outcome(
    request, counter, api, container, change
):
    if api is to_module_call and change in (parameter_to_buffer, add_parameter):
        key_order_recompiles(request)  # the changed dict's names come back reordered
    with torch._dynamo.config.patch(skip_nnmodule_hook_guards=False):
        _changed_after_compiling(counter, api, container, change)


def _changed_after_compiling(counter, api, container, change):
    compiled_model, eager_model = Model(), Model()
    eager_model.load_state_dict(compiled_model.state_dict())
    cnt = counter("eager")
    fn = torch.compile(api, backend=cnt, fullgraph=True)
    x = torch.randn(5, 3)
    p = values_of(compiled_model, container)
    _same_outcome(_outcome(fn, compiled_model, p, x), _outcome(api, eager_model, p, x))
    assert cnt.frame_count == 1
    change(compiled_model)
    change(eager_model)
    compiled_model.load_state_dict(eager_model.state_dict(), strict=False)
    changed = _outcome(fn, compiled_model, p, x)
    _same_outcome(changed, _outcome(api, eager_model, p, x))
    if changed[0][0] == "value":  # a second call of the changed structure compiles no more
        frames = cnt.frame_count
        _same_outcome(_outcome(fn, compiled_model, p, x), _outcome(api, eager_model, p, x))
        assert_frames(cnt, frames)


@pytest.mark.parametrize("api", APIS, ids=lambda f: f.__name__)
def test_a_key_added_or_dropped_or_another_container_recompiles(counter, api):
    m = Model()
    before = state(m)
    cnt = counter("eager")
    fn = torch.compile(api, backend=cnt, fullgraph=True)
    x = torch.randn(5, 3)
    full = values_of(m)
    fewer = {k: v for k, v in full.items() if k != "shift"}
    as_tensordict = TensorDict(full).unflatten_keys(".")
    # full and fewer each compile once, the TensorDict once more
    for p, frames in [(full, 1), (fewer, 2), (full, 2), (as_tensordict, 3), (fewer, 3)]:
        torch.testing.assert_close(fn(m, p, x), api(m, p, x))
        assert_same_state(m, before)
        assert cnt.frame_count == frames


@pytest.mark.parametrize("api", APIS, ids=lambda f: f.__name__)
def test_one_frame_serves_every_instance_of_the_architecture(counter, api):
    cnt = counter("eager")
    fn = torch.compile(api, backend=cnt, fullgraph=True)
    x = torch.randn(5, 3)
    models = [Model() for _ in range(3)] + [copy.deepcopy(Model())]
    for m in models:
        before = state(m)
        p = values_of(m, "tensordict")
        with torch.compiler.set_stance("fail_on_recompile" if cnt.frame_count else "default"):
            torch.testing.assert_close(fn(m, p, x), api(m, p, x))
        assert_same_state(m, before)
    assert cnt.frame_count == 1


def test_a_tie_broken_after_compiling_recompiles(counter):
    m = nn.Sequential(nn.Linear(3, 3, bias=False), nn.Linear(3, 3, bias=False))
    m[1].weight = m[0].weight
    cnt = counter("eager")
    fn = torch.compile(swap_call, backend=cnt, fullgraph=True)
    x = torch.randn(2, 3)
    p = {"0.weight": torch.randn(3, 3)}
    torch.testing.assert_close(fn(m, p, x), swap_call(m, p, x))  # both layers take it
    m[1].weight = nn.Parameter(torch.randn(3, 3))
    torch.testing.assert_close(fn(m, p, x), swap_call(m, p, x))  # only the first now
    assert cnt.frame_count == 2
