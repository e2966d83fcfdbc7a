"""``fcall.to_module`` leaves each dict of the module in the order tensordict's leaves it,
and runs torch's global parameter registration hooks as tensordict's does: each name it
writes (and each name its restore writes back) is registered again, at the end of its
dict (``fcall/_core/registration.py``). ``fcall.swap`` keeps the order and runs no hook, as
``torch.func.functional_call`` does. Every case runs with tensordict and compares."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
import torch
from tensordict import TensorDict
from torch import nn

import fcall
from tests.support import Net, assert_same_state, state

PEERS: dict[str, Callable] = {"fcall": fcall.to_module, "tensordict": TensorDict.to_module}


def orders(module: nn.Module) -> list:
    """Every dict's names in order, per submodule (tensor attributes included)."""
    return [row[:3] if row[1] in ("p", "b") else row for row in state(module) if row[1] != "np"]


def linear() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Linear(3, 2)
    m.register_buffer("c", torch.zeros(2))
    m.register_buffer("d", torch.zeros(2))
    return m


def net() -> nn.Module:
    torch.manual_seed(0)
    return Net()


CASES = {
    "partial": (linear, lambda m: TensorDict(weight=torch.ones(2, 3), c=torch.ones(2)), {}),
    "reversed": (linear, lambda m: TensorDict(bias=torch.ones(2), weight=torch.ones(2, 3)), {}),
    "whole_tree": (net, lambda m: TensorDict.from_module(m).detach().clone(), {}),
    "partial_tree": (
        net,
        lambda m: TensorDict.from_module(m).detach().clone().exclude(("lin", "weight")),
        {},
    ),
    "not_preserved": (
        linear,
        lambda m: TensorDict(weight=torch.ones(2, 3)),
        {"preserve_module_state": False},
    ),
    "parameter_values": (
        linear,
        lambda m: TensorDict(weight=nn.Parameter(torch.ones(2, 3))),
        {"preserve_module_state": False},
    ),
    "inplace": (linear, lambda m: TensorDict(weight=torch.ones(2, 3)), {"inplace": True}),
    "value_changes_dict": (  # a plain tensor for a Parameter: a plain attribute in the block
        linear,
        lambda m: TensorDict(bias=nn.Parameter(torch.ones(2)), weight=torch.ones(2, 3)),
        {"preserve_module_state": False},
    ),
}


def run_case(case: str, to_module: Callable, hook: Callable | None) -> dict:
    make, params_of, kwargs = CASES[case]
    m = make()
    before = state(m)
    params = params_of(m)
    handle = (
        torch.nn.modules.module.register_module_parameter_registration_hook(hook)
        if hook is not None
        else contextlib.nullcontext()
    )
    with handle:
        with to_module(params, m, **kwargs):
            inside = orders(m)
        after = orders(m)
        assert_same_state(m, before, in_any_order=True)
        to_module(params, m, **kwargs)  # without `with`: the swap stays
        kept = orders(m)
    return {"inside": inside, "after": after, "kept": kept}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_order_of_every_dict_is_tensordicts(case):
    assert run_case(case, fcall.to_module, None) == run_case(case, TensorDict.to_module, None)


@pytest.mark.parametrize("case", sorted(CASES))
def test_registration_hooks_run_as_tensordicts(case):
    seen: dict[str, list] = {}
    for name, to_module in PEERS.items():
        calls = seen[name] = []

        def hook(module, key, value, calls=calls):
            calls.append((type(module).__name__, key, type(value).__name__, value.shape))

        run_case(case, to_module, hook)
    assert seen["fcall"] == seen["tensordict"]


def test_a_hooks_result_is_what_the_slot_holds_in_the_block():
    replacement = nn.Parameter(torch.full((2, 3), 7.0))
    held = {}
    for name, to_module in PEERS.items():
        m = linear()
        original = m.weight

        def hook(module, key, value, original=original):
            return replacement if key == "weight" and value is not original else None

        handle = torch.nn.modules.module.register_module_parameter_registration_hook(hook)
        try:
            with to_module(TensorDict(weight=nn.Parameter(torch.ones(2, 3))), m):
                held[name] = m.weight is replacement
            assert m.weight is original
        finally:
            handle.remove()
    assert held == {"fcall": True, "tensordict": True}


def test_swap_keeps_the_order_and_runs_no_hook():
    m, calls = linear(), []
    before = state(m)
    handle = torch.nn.modules.module.register_module_parameter_registration_hook(
        lambda *args: calls.append(args)
    )
    try:
        with fcall.swap({"weight": torch.ones(2, 3)}, m):
            assert list(m._parameters) == ["weight", "bias"]
    finally:
        handle.remove()
    assert_same_state(m, before)  # the order of every dict included
    assert calls == []
