"""fcall.functional_call's torch.func semantics (issue 25, points 1, 2 and 4), compiled with
``fullgraph=True`` and a counting backend, beside torch.func compiled the same way."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fcall

CALLS = {"torch.func": torch.func.functional_call, "fcall": fcall.functional_call}


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


@pytest.mark.parametrize("name", list(CALLS))
def test_an_unknown_key_compiles_in_one_graph(name, counter):
    m, x = Scaled(), torch.randn(3, 2)
    cnt = counter("aot_eager")
    call = CALLS[name]
    fn = torch.compile(lambda p, x: call(m, p, (x,)), backend=cnt, fullgraph=True)
    for scale in (1.0, 2.0, 3.0):
        params = {"lin.weight": torch.randn(2, 2), "scale": torch.tensor(scale)}
        out = fn(params, x)
        torch.testing.assert_close(out, (x @ params["lin.weight"].T + m.lin.bias) * scale)
        assert not hasattr(m, "scale")
    assert cnt.frame_count == 1


@pytest.mark.parametrize("name", list(CALLS))
def test_a_reference_cycle_compiles_with_tie_weights_false(name, counter):
    m = nn.Sequential(nn.Linear(2, 2))
    m[0].m = m
    cnt = counter("aot_eager")
    call = CALLS[name]
    fn = torch.compile(
        lambda p, x: call(m, p, (x,), tie_weights=False), backend=cnt, fullgraph=True
    )
    x = torch.randn(3, 2)
    for _ in range(3):
        params = {"0.weight": torch.randn(2, 2), "0.bias": torch.randn(2)}
        torch.testing.assert_close(fn(params, x), x @ params["0.weight"].T + params["0.bias"])
    assert cnt.frame_count == 1


def test_a_reference_cycle_compiles_with_fcalls_tie_weights(counter):
    """torch.func's tie_weights=True walk recurses forever on a cycle; fcall's stops."""
    m = nn.Sequential(nn.Linear(2, 2))
    m[0].m = m
    cnt = counter("aot_eager")
    fn = torch.compile(lambda p, x: fcall.functional_call(m, p, (x,)), backend=cnt, fullgraph=True)
    x = torch.randn(3, 2)
    for _ in range(3):
        params = {"0.weight": torch.randn(2, 2), "0.bias": torch.randn(2)}
        torch.testing.assert_close(fn(params, x), x @ params["0.weight"].T + params["0.bias"])
    assert cnt.frame_count == 1


@pytest.mark.parametrize("name", list(CALLS))
def test_args_none_compiles(name, counter):
    m = nn.Linear(2, 2)
    cnt = counter("aot_eager")
    call = CALLS[name]
    fn = torch.compile(lambda p, x: call(m, p, None, {"input": x}), backend=cnt, fullgraph=True)
    x = torch.randn(3, 2)
    for _ in range(3):
        params = {"weight": torch.randn(2, 2), "bias": torch.randn(2)}
        torch.testing.assert_close(fn(params, x), x @ params["weight"].T + params["bias"])
    assert cnt.frame_count == 1
