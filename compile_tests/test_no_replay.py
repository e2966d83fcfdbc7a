"""Nothing after the graph: a compiled swap leaves no write into the module's dicts for
Dynamo to replay, however the module is held (issue 42).

Dynamo replays, after the graph, every change the trace made to a dict that existed before
it (``_parameters.clear(); _parameters.update(...)``, one write per leaf), even a change
undone in the trace: for a module reached as a global that was one write per leaf per call
(pytorch/pytorch#133487, torch.func alike). fcall tells Dynamo's side-effect tracker that a
dict it swapped holds, after the restore, exactly what it held before (``_compat.
settle_dicts``); a dict whose items differ (``forward`` changed it) is replayed as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import fcall
from tests.support import functional_call, swap_call, to_module_call, writes_after_the_graph


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.norm = nn.BatchNorm1d(4)  # train mode: running stats updated in place
        self.register_buffer("scale", torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.lin(x)) * self.scale


def _model() -> nn.Module:
    return nn.Sequential(Block(), nn.ReLU(), Block())


GLOBAL: nn.Module = _model()


def _held_as_global(api: Callable) -> tuple[Callable, Any]:
    def call(p: Any, x: torch.Tensor) -> torch.Tensor:
        return api(GLOBAL, p, x)

    return call, call.__code__


def _held_in_a_closure(api: Callable) -> tuple[Callable, Any]:
    model = GLOBAL

    def call(p: Any, x: torch.Tensor) -> torch.Tensor:
        return api(model, p, x)

    return call, call.__code__


class _Loss(nn.Module):
    def __init__(self, model: nn.Module, api: Callable) -> None:
        super().__init__()
        self.model = model
        self.api = api

    def forward(self, p: Any, x: torch.Tensor) -> torch.Tensor:
        return self.api(self.model, p, x)


def _held_as_an_attribute(api: Callable) -> tuple[Callable, Any]:
    return _Loss(GLOBAL, api), _Loss.forward.__code__


FORMS = {
    "global": _held_as_global,
    "closure": _held_in_a_closure,
    "attribute": _held_as_an_attribute,
}


def _containers(model: nn.Module) -> dict[str, Any]:
    td = fcall.from_module(model).detach().clone()
    return {"tensordict": td, "flat": dict(td.flatten_keys(".").items())}


# to_module takes a TensorDict (tensordict's signature)
CASES = [(swap_call, "flat"), (swap_call, "tensordict"), (functional_call, "flat")]
CASES += [(functional_call, "tensordict"), (to_module_call, "tensordict")]


@pytest.mark.parametrize(("api", "container"), CASES, ids=lambda c: getattr(c, "__name__", c))
@pytest.mark.parametrize("form", [*FORMS, "argument"])
@pytest.mark.parametrize("grad", [False, True])
def test_no_write_into_the_modules_dicts_after_the_graph(counter, form, api, container, grad):
    params = _containers(GLOBAL)[container]
    cnt = counter("eager")
    x = torch.randn(3, 4)
    if form == "argument":

        def body(p: Any, x: torch.Tensor, m: nn.Module) -> torch.Tensor:
            return api(m, p, x)

        fn = torch.compile(body, backend=cnt, fullgraph=True)
        code = body.__code__
        call = lambda: fn(params, x, GLOBAL)  # noqa: E731
    else:
        target, code = FORMS[form](api)
        fn = torch.compile(target, backend=cnt, fullgraph=True)
        call = lambda: fn(params, x)  # noqa: E731
    before = [(name, t) for name, t in GLOBAL.named_parameters()]
    with torch.set_grad_enabled(grad):
        call()
        call()
    assert cnt.frame_count == 1
    assert writes_after_the_graph(code) == []
    after = list(GLOBAL.named_parameters())
    assert [n for n, _ in after] == [n for n, _ in before]
    assert all(a is b for (_, a), (_, b) in zip(after, before))


def test_torch_func_replays_a_write_per_dict_for_a_global_module(counter):
    """The peer, for comparison: the replay fcall removes (pytorch/pytorch#133487)."""
    params = _containers(GLOBAL)["flat"]

    def call(p: Any, x: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(GLOBAL, p, (x,))

    fn = torch.compile(call, backend=counter("eager"), fullgraph=True)
    fn(params, torch.randn(3, 4))
    assert ("LOAD_METHOD", "clear") in writes_after_the_graph(call.__code__) or (
        "LOAD_ATTR",
        "clear",
    ) in writes_after_the_graph(call.__code__)


class Changing(nn.Module):
    """A module whose ``forward`` changes its own dicts, as ``change`` says."""

    def __init__(self, change: str) -> None:
        super().__init__()
        self.change = change
        self.lin = nn.Linear(3, 3)
        self.gain = nn.Parameter(torch.ones(3))
        self.register_buffer("scale", torch.ones(3))
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x) * self.gain * self.scale
        if self.change == "reassign_swapped_buffer":
            self.scale = self.scale * 2
        elif self.change == "reassign_other_buffer":
            self.steps = self.steps + 1
        elif self.change == "new_buffer":
            self._buffers["extra"] = y.detach().sum()
        elif self.change == "delete_parameter":
            del self._parameters["gain"]
        return y


CHANGES = ["reassign_swapped_buffer", "reassign_other_buffer", "new_buffer", "delete_parameter"]
CHANGED: nn.Module = Changing("none")


def _slots(module: nn.Module) -> list[tuple[str, str, list[str]]]:
    return [
        (path, kind, list(getattr(m, kind)))
        for path, m in module.named_modules()
        for kind in ("_parameters", "_buffers")
    ]


@pytest.mark.parametrize("api", [swap_call, functional_call], ids=lambda f: f.__name__)
@pytest.mark.parametrize("change", CHANGES)
def test_a_global_module_that_forward_changes_ends_as_in_eager(counter, api, change):
    """What skips the replay must not skip ``forward``'s own changes: a dict that does not
    end as it began is replayed, and the module ends as eager leaves it."""
    global CHANGED
    eager = Changing(change)
    CHANGED = Changing(change)
    CHANGED.load_state_dict(eager.state_dict())
    keys = {"gain": torch.full((3,), 2.0), "scale": torch.full((3,), 3.0)}

    def call(p: Any, x: torch.Tensor) -> torch.Tensor:
        return api(CHANGED, p, x)

    cnt = counter("eager")
    fn = torch.compile(call, backend=cnt, fullgraph=True)
    x = torch.randn(2, 3)
    for _ in range(2):
        p_compiled, p_eager = dict(keys), dict(keys)
        try:
            expected: Any = api(eager, p_eager, x)
        except Exception as error:
            expected = error
        if isinstance(expected, Exception):
            with pytest.raises(Exception):  # noqa: B017
                fn(p_compiled, x)
            return
        torch.testing.assert_close(fn(p_compiled, x), expected)
        assert _slots(CHANGED) == _slots(eager)
        for (name, a), (_, b) in zip(
            CHANGED.state_dict(keep_vars=True).items(), eager.state_dict(keep_vars=True).items()
        ):
            torch.testing.assert_close(a, b, msg=name)
            assert type(a) is type(b), name
        assert p_compiled.keys() == p_eager.keys()
    # a buffer registered by forward changes the module's structure: the second call recompiles
    assert cnt.frame_count == (2 if change == "new_buffer" else 1)
