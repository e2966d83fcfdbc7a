"""Eager: ``to_module(inplace=True)`` under grad mode, and ``use_state_dict=True`` with a
pre-hook that computes a new value (issue 15, points 10 and 11).

The compiled twins are in compile_tests/test_inplace_and_state_dict_compile.py.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import fcall
from tests.support import assert_same_state, state

# torch's own message, raised by backward (eager) when the restore has overwritten a
# tensor that forward saved.
SAVED_AND_MODIFIED = (
    "one of the variables needed for gradient computation has been modified by an inplace operation"
)


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def doubled(module: nn.Module):
    return fcall.from_module(module).detach().clone().apply(lambda t: t * 2)


def inplace_block(p, m, x):
    with fcall.to_module(p, m, inplace=True):
        return m(x)


def test_inplace_forward_runs_and_backward_raises_torchs_error():
    # The restore copies the old values back into the tensors forward saved for
    # backward (the second Linear's weight): backward raises, in eager as in torch.
    m = mlp()
    before, values = state(m), fcall.from_module(m).detach().clone()
    p, x = doubled(m), torch.randn(5, 3)
    y = inplace_block(p, m, x)
    torch.testing.assert_close(y, torch.func.functional_call(m, dict(p.flatten_keys(".")), x))
    assert_same_state(m, before)
    torch.testing.assert_close(fcall.from_module(m), values)  # the old values are back
    with pytest.raises(RuntimeError, match=re.escape(SAVED_AND_MODIFIED)):
        y.sum().backward()
    assert_same_state(m, before)
    torch.testing.assert_close(fcall.from_module(m), values)


def test_inplace_gradients_reach_the_modules_own_parameters_when_nothing_saved_changed():
    # One Linear on an input that needs no grad: forward saves the input only, so
    # backward runs, and the gradients land in the module's own Parameters.
    m = nn.Linear(3, 2)
    p, x = doubled(m), torch.randn(5, 3)
    inplace_block(p, m, x).sum().backward()
    torch.testing.assert_close(m.weight.grad, x.sum(0).expand(2, 3))
    torch.testing.assert_close(m.bias.grad, torch.full((2,), 5.0))


class DoublesWeight(nn.Module):
    """A load_state_dict pre-hook that computes a new value: ``0.weight`` doubled."""

    def __init__(self) -> None:
        super().__init__()
        self.body = mlp()
        self._register_load_state_dict_pre_hook(self._double)

    def _double(self, state_dict, prefix, *args):
        key = f"{prefix}body.0.weight"
        if key in state_dict:
            state_dict[key] = state_dict[key] * 2

    def forward(self, x):
        return self.body(x)


def state_dict_block(p, m, x):
    with fcall.to_module(p, m, use_state_dict=True):
        return m(x), m.body[0].weight


def test_use_state_dict_hook_value_becomes_a_parameter_that_takes_gradients():
    m = DoublesWeight()
    before = state(m)
    p, x = fcall.from_module(m).detach().clone(), torch.randn(5, 3)
    y, weight = state_dict_block(p, m, x)
    assert type(weight) is nn.Parameter and weight.requires_grad
    torch.testing.assert_close(weight.detach(), p["body", "0", "weight"] * 2)
    assert_same_state(m, before)
    y.sum().backward()
    assert weight.grad is not None and weight.grad.shape == (4, 3)
    assert all(param.grad is None for param in m.parameters())  # the module's own: untouched
