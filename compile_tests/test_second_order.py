"""Second-order gradients through a compiled swap (issue 43; pytorch/pytorch#181581, #91469).

What each compiled form gives a MAML meta-gradient on torch 2.13-2.15, pinned so that a
torch that changes it fails here (docs/faq.md and docs/guides/maml.md say the same):

* the forward compiled alone, ``autograd.grad(create_graph=True)`` outside: right with the
  ``eager`` backend; ``aot_eager`` and ``inductor`` raise;
* the whole inner step compiled, ``autograd.grad`` inside (``fullgraph=False``): right with
  ``eager``; ``aot_eager`` and ``inductor`` give the first-order meta-gradient, silently;

and ``fcall.testing.check_swap_parity(..., order=2)`` names the silent case.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fcall
from fcall.testing import Failure, ParityError, check_swap_parity

LR = 0.5


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.randn(10, 3), torch.randn(10, 1)


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().requires_grad_() for k, v in model.named_parameters()}


def _inner_step(forward, create_graph: bool = True):
    def meta_loss(p: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = ((forward(p, x) - y) ** 2).mean()
        grads = torch.autograd.grad(loss, list(p.values()), create_graph=create_graph)
        adapted = {k: v - LR * g for (k, v), g in zip(p.items(), grads)}
        return ((forward(adapted, x) - y) ** 2).mean()

    return meta_loss


def _meta_grads(meta_loss, model: nn.Module) -> list[torch.Tensor]:
    p = _params(model)
    return list(torch.autograd.grad(meta_loss(p, *_data()), list(p.values())))


def _close(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.allclose(x, y, atol=1e-5) for x, y in zip(a, b))


def _references(model: nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    def forward(p: dict, x: torch.Tensor) -> torch.Tensor:
        return fcall.functional_call(model, p, (x,))

    second = _meta_grads(_inner_step(forward), model)
    first = _meta_grads(_inner_step(forward, create_graph=False), model)
    assert not _close(second, first)  # the example has a second-order term to lose
    return second, first


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_the_whole_inner_step_compiled_is_first_order_on_aot_backends(counter, backend):
    model = _model()
    second, first = _references(model)
    cnt = counter(backend)

    def forward(p: dict, x: torch.Tensor) -> torch.Tensor:
        return fcall.functional_call(model, p, (x,))

    got = _meta_grads(torch.compile(_inner_step(forward), backend=cnt), model)
    assert cnt.frame_count >= 1  # it compiled (autograd.grad breaks the graph)
    if backend == "eager":
        assert _close(got, second)
    else:  # silently first-order: pytorch/pytorch#181581
        assert _close(got, first)
        assert not _close(got, second)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_the_forward_compiled_alone_is_right_on_eager_and_raises_on_aot_backends(counter, backend):
    model = _model()
    second, _ = _references(model)
    cnt = counter(backend)
    forward = torch.compile(
        lambda p, x: fcall.functional_call(model, p, (x,)), backend=cnt, fullgraph=True
    )
    if backend == "eager":
        assert _close(_meta_grads(_inner_step(forward), model), second)
    else:
        with pytest.raises(RuntimeError, match="does not currently support double backward"):
            _meta_grads(_inner_step(forward), model)
    assert cnt.frame_count == 1


def _sets(model: nn.Module) -> list:
    return [
        fcall.from_module(model).detach().clone().apply(lambda t: t.requires_grad_())
        for _ in range(2)
    ]


@pytest.mark.parametrize("api", ["swap", "functional_call", "to_module"])
def test_check_swap_parity_order_2_passes_on_eager(api):
    model = _model()
    sets, x = _sets(model), _data()[0]
    report = check_swap_parity(model, sets, x, api=api, backends=["eager"], order=2)
    assert "eager: 1 graph(s)" in str(report)


def test_check_swap_parity_order_2_names_a_silently_first_order_meta_gradient():
    model = _model()
    with pytest.raises(ParityError) as raised:
        check_swap_parity(model, _sets(model), _data()[0], backends=["aot_eager"], order=2)
    assert raised.value.kind is Failure.FIRST_ORDER
    message = str(raised.value)
    assert message.startswith(
        "[first order] backend 'aot_eager': param set 0: the meta-gradient of `0.weight` is the "
        "first-order (FOMAML) one: the compiled inner step silently dropped the second-order "
        "term (pytorch/pytorch#181581; largest abs difference from eager "
    )
    assert message.endswith(
        "Compile the inner step with backend='eager', or compile only the forward and take the "
        "gradients outside on the eager backend (docs/guides/maml.md)."
    )


def test_check_swap_parity_order_1_does_not_see_it():
    """Without order=2 the silent case passes: first-order gradients match."""
    model = _model()
    check_swap_parity(model, _sets(model), _data()[0], backends=["aot_eager"])


def test_check_swap_parity_order_must_be_1_or_2_and_need_values_that_require_grad():
    model = _model()
    with pytest.raises(ValueError, match="order must be 1 or 2, got 3"):
        check_swap_parity(model, _sets(model), _data()[0], order=3)
    frozen = [fcall.from_module(model).detach().clone()]
    with pytest.raises(ValueError, match="no value that requires grad"):
        check_swap_parity(model, frozen, _data()[0], backends=["eager"], order=2)
