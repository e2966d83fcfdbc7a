"""Eager: params that carry tensordict state (issue 15, point 13).

A TensorDict whose own ops left a ``_last_op`` record, a TensorDictParams after
``clear_refs_for_compile_()``: fcall swaps them like any other container, and only the
TensorDicts fcall itself returned (or filled as ``swap_dest``) undo a swap exactly. The
compiled side (no guard on ``_last_op``, no recompile, guard count against stock
tensordict) is in compile_tests/test_swap_guards.py.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torch import nn

import fcall
from tests.support import (
    assert_same_state,
    state,
)


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))


def with_state(m: nn.Module, kind: str):
    td = TensorDict.from_module(m).detach().clone().apply(torch.randn_like)
    if kind == "td_last_op":
        td.lock_().unlock_()
        assert td.__dict__["_last_op"][0] == "unlock_"
    else:
        td = fcall.TensorDictParams(td)
        td.clear_refs_for_compile_()
        assert td.__dict__["_last_op"] is None
    return td


@pytest.mark.parametrize("kind", ["td_last_op", "tdparams_cleared"])
@pytest.mark.parametrize("preserve", [True, False])
def test_params_with_tensordict_state_swap_in_and_restore_exactly(kind, preserve):
    m = model()
    before = state(m)
    p, x = with_state(m, kind), torch.randn(2, 3)
    expected = torch.func.functional_call(m, dict(p.flatten_keys(".")), x)
    for _ in range(3):
        with fcall.to_module(p, m, preserve_module_state=preserve):
            torch.testing.assert_close(m(x), expected)
        assert_same_state(m, before)
        with fcall.swap(p, m):
            torch.testing.assert_close(m(x), expected)
        assert_same_state(m, before)


def test_swap_dest_still_undoes_exactly_in_eager():
    # preserve_module_state=False makes plain attributes of the parameters: only the
    # exact undo puts them back as Parameters, in their dict and order.
    m = model()
    before = state(m)
    dest = TensorDict()
    fcall.to_module(with_state(m, "td_last_op"), m, swap_dest=dest, preserve_module_state=False)
    assert "weight" not in m[0]._parameters
    fcall.to_module(dest, m)
    assert_same_state(m, before)
