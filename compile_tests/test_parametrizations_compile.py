"""A parametrized tensor's plain name, compiled (issue 43): the parametrization is off for
the call, one graph, no recompile for a new value, the module back bit-exact, and nothing
replayed after the graph. torch.func, compiled with ``fullgraph=True``, breaks the graph in
``right_inverse`` (``set_`` of an original)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._dynamo.exc import Unsupported

import fcall
from tests.support import DYNAMO_2_11, writes_after_the_graph
from tests.test_parametrizations import MODELS, _assert_bit_exact, _snapshot

HELD: nn.Module = MODELS["weight_norm"]()


@pytest.mark.parametrize("kind", MODELS)
def test_compiled_plain_name_disables_the_parametrization(counter, kind):
    model = MODELS[kind]()
    before = _snapshot(model)
    cnt = counter("aot_eager")

    def call(p: dict, x: torch.Tensor) -> torch.Tensor:
        return fcall.functional_call(model, p, (x,))

    fn = torch.compile(call, backend=cnt, fullgraph=True)
    x = torch.randn(4, 3)
    for _ in range(2):
        weight = torch.randn(3, 3)
        torch.testing.assert_close(
            fn({"0.weight": weight}, x), torch.tanh(x @ weight.T + model[0].bias)
        )
        _assert_bit_exact(model, before)
    assert cnt.frame_count == 1


def test_a_global_parametrized_module_has_nothing_replayed(counter):
    global HELD
    HELD = MODELS["weight_norm"]()
    before = _snapshot(HELD)

    def call(p: dict, x: torch.Tensor) -> torch.Tensor:
        return fcall.functional_call(HELD, p, (x,))

    fn = torch.compile(call, backend=counter("eager"), fullgraph=True)
    fn({"0.weight": torch.randn(3, 3)}, torch.randn(4, 3))
    assert writes_after_the_graph(call.__code__) == []
    _assert_bit_exact(HELD, before)


def test_torch_func_compiled_breaks_the_graph_in_right_inverse(counter):
    model = MODELS["weight_norm"]()
    fn = torch.compile(
        lambda p, x: torch.func.functional_call(model, p, (x,)),
        backend=counter("eager"),
        fullgraph=True,
    )
    p, x = {"0.weight": torch.randn(3, 3)}, torch.randn(4, 3)
    if DYNAMO_2_11:  # torch 2.11 traced it whole: the break came with 2.12
        torch.testing.assert_close(fn(p, x), torch.func.functional_call(model, p, (x,)))
        return
    with pytest.raises(Unsupported):
        fn(p, x)
