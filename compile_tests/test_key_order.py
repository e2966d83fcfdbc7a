"""Key order: a dict with the module's keys in any order compiles once (issue 43).

Checkpoint sweeps mix files whose keys are sorted and files in the module's order
(tensordict#1606, pytorch/pytorch#175624). ``swap`` and ``functional_call`` read a dict's
values by key, so Dynamo guards each node's length and keys, not their order: one frame
serves every order, and a key added or dropped fails the guards and recompiles (or raises,
as eager does). ``to_module`` keeps tensordict's rule that the names it writes take the
container's order in the module's dicts, so it compiles once per order, as torch.func does.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import fcall
from tests.support import assert_frames, functional_call, key_order_recompiles, swap_call


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


def _flat(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() + 1 for k, v in model.state_dict().items()}


def _orders(flat: dict[str, Any]) -> list[dict[str, Any]]:
    """The module's order, reversed, sorted."""
    return [dict(flat), dict(reversed(flat.items())), dict(sorted(flat.items()))]


def _nested(flat: dict[str, Any], reverse: bool) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key in reversed(flat) if reverse else flat:
        head, _, name = key.partition(".")
        nested.setdefault(head, {})[name] = flat[key]
    return nested


def _containers(kind: str, flat: dict[str, Any]) -> list[dict[str, Any]]:
    if kind == "flat":
        return _orders(flat)
    return [_nested(flat, reverse=False), _nested(flat, reverse=True)]


@pytest.mark.parametrize("kind", ["flat", "nested"])
@pytest.mark.parametrize("api", [swap_call, functional_call], ids=lambda f: f.__name__)
def test_any_key_order_compiles_one_frame_and_gives_eagers_result(request, counter, api, kind):
    key_order_recompiles(request)
    model, eager = _model(), _model()
    before = list(model.state_dict(keep_vars=True).values())
    cnt = counter("eager")
    fn = torch.compile(api, backend=cnt, fullgraph=True)
    x = torch.randn(5, 3)
    with torch.no_grad():
        for params in _containers(kind, _flat(model)):
            torch.testing.assert_close(fn(model, params, x), api(eager, params, x))
    assert all(a is b for a, b in zip(model.state_dict(keep_vars=True).values(), before))
    assert_frames(cnt, 1)


def test_torch_func_compiles_a_frame_per_key_order(counter):
    """The peer, for comparison (pytorch/pytorch#175624)."""
    model = _model()
    cnt = counter("eager")
    fn = torch.compile(
        lambda m, p, x: torch.func.functional_call(m, p, (x,)), backend=cnt, fullgraph=True
    )
    with torch.no_grad():
        for params in _orders(_flat(model)):
            fn(model, params, torch.randn(5, 3))
    assert cnt.frame_count == 3


@pytest.mark.parametrize("api", [swap_call, functional_call], ids=lambda f: f.__name__)
def test_a_key_dropped_or_added_recompiles_or_raises_as_eager(counter, api):
    model, eager = _model(), _model()
    flat = _flat(model)
    cnt = counter("eager")
    fn = torch.compile(api, backend=cnt, fullgraph=False)
    x = torch.randn(5, 3)
    with torch.no_grad():
        fn(model, dict(flat), x)
        dropped = {k: v for k, v in flat.items() if k != "2.bias"}
        torch.testing.assert_close(fn(model, dict(dropped), x), api(eager, dict(dropped), x))
        assert cnt.frame_count == 2
        added = {**dict(reversed(flat.items())), "2.extra": torch.ones(2)}
        if api is swap_call:  # an unknown key: UnknownKey, before anything is written
            with pytest.raises(fcall.UnknownKey, match=r"2\.extra"):
                api(eager, dict(added), x)
            with pytest.raises(fcall.UnknownKey, match=r"2\.extra"):
                fn(model, dict(added), x)
        else:  # functional_call sets it as an attribute for the call (torch.func's rule)
            torch.testing.assert_close(fn(model, dict(added), x), api(eager, dict(added), x))
    assert not hasattr(model[2], "extra")


def test_swap_binds_the_same_old_values_whatever_the_order(request, counter):
    """The old values a reused frame binds are eager's; their keys are listed in the order
    of the container the frame was compiled for (docs/faq.md)."""
    key_order_recompiles(request)
    model = _model()

    def old_of(p: dict, x: torch.Tensor) -> tuple[Any, torch.Tensor]:
        with fcall.swap(p, model) as old:
            return old, model(x)

    cnt = counter("eager")
    fn = torch.compile(old_of, backend=cnt, fullgraph=True)
    x = torch.randn(5, 3)
    with torch.no_grad():
        for params in _orders(_flat(model)):
            old, _ = fn(params, x)
            old_eager, _ = old_of(params, x)
            assert sorted(old.keys(True, True)) == sorted(old_eager.keys(True, True))
            for key in old_eager.keys(True, True):
                assert old[key] is old_eager[key]
    assert_frames(cnt, 1)


def test_to_module_keeps_the_containers_order_and_compiles_per_order(counter):
    """tensordict's rule: the names written end their dicts in the container's order."""
    model, eager = _model(), _model()

    def names_in_block(m: nn.Module, p: dict, x: torch.Tensor) -> list[str]:
        with fcall.to_module(p, m):
            m(x)
            return [name for name, _ in m.named_parameters()]

    cnt = counter("eager")
    fn = torch.compile(names_in_block, backend=cnt, fullgraph=True)
    x = torch.randn(5, 3)
    orders = _orders({k: v for k, v in _flat(model).items() if "running" not in k})
    with torch.no_grad():
        for params in orders:
            assert fn(model, dict(params), x) == names_in_block(eager, dict(params), x)
    assert cnt.frame_count == 3
