"""A value under a parametrized tensor's plain name (issue 43, pytorch/pytorch#186565).

torch documents that it disables the parametrization for the call; ``torch.func`` sets it
through ``right_inverse`` instead, and sets the old value back through it, so the
originals come back changed (and a parametrization without ``right_inverse`` refuses the
key). fcall's ``functional_call`` disables the parametrization and gives the module back
bit-exact (``fcall/_fronts/parametrized.py``); ``swap`` and ``to_module`` raise
``UnknownKey`` naming the originals' keys. Each case is built with torch.func beside.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import orthogonal, weight_norm

import fcall

PARAMETRIZED = (
    "fcall.{api}: '0.weight' is a parametrized tensor (torch.nn.utils.parametrize); its values "
    "are the parametrization's originals: '0.parametrizations.weight.original0', "
    "'0.parametrizations.weight.original1'. Give those keys (the parametrization then runs on "
    "them), or call fcall.functional_call, where the plain name disables the parametrization "
    "for the call. The module was left unchanged."
)


class Doubled(nn.Module):
    """A parametrization without ``right_inverse``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * x


def _weight_norm() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(weight_norm(nn.Linear(3, 3)), nn.Tanh())
    with torch.no_grad():  # as training leaves it: no longer right_inverse's own fixed point
        model[0].parametrizations.weight.original1.mul_(1.7)
    return model


def _orthogonal() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(orthogonal(nn.Linear(3, 3)), nn.Tanh())


def _no_right_inverse() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
    parametrize.register_parametrization(model[0], "weight", Doubled())
    return model


MODELS = {
    "weight_norm": _weight_norm,
    "orthogonal": _orthogonal,
    "no_right_inverse": _no_right_inverse,
}


def _snapshot(model: nn.Module) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    return [(n, t, t.detach().clone()) for n, t in model.named_parameters()]


def _assert_bit_exact(model: nn.Module, before: list) -> None:
    after = list(model.named_parameters())
    assert [n for n, _ in after] == [n for n, _, _ in before]
    for (_, now), (name, then, value) in zip(after, before):
        assert now is then, name
        assert torch.equal(now, value), name
    assert parametrize.is_parametrized(model[0], "weight")


@pytest.mark.parametrize("kind", MODELS)
def test_the_plain_name_disables_the_parametrization_and_the_module_comes_back_bit_exact(kind):
    model = MODELS[kind]()
    before = _snapshot(model)
    weight, x = torch.randn(3, 3), torch.randn(4, 3)
    out = fcall.functional_call(model, {"0.weight": weight}, (x,))
    torch.testing.assert_close(out, torch.tanh(x @ weight.T + model[0].bias))
    _assert_bit_exact(model, before)
    torch.testing.assert_close(model(x), torch.tanh(x @ model[0].weight.T + model[0].bias))


def test_torch_func_goes_through_right_inverse_and_changes_the_originals():
    """The peer: the output uses the value, the originals come back changed."""
    model = _weight_norm()
    before = _snapshot(model)
    weight, x = torch.randn(3, 3), torch.randn(4, 3)
    out = torch.func.functional_call(model, {"0.weight": weight}, (x,))
    torch.testing.assert_close(out, torch.tanh(x @ weight.T + model[0].bias))
    changed = max((t - value).abs().max().item() for _, t, value in before)
    assert changed > 0.1  # pytorch/pytorch#186565


def test_torch_func_refuses_a_parametrization_without_right_inverse():
    model = _no_right_inverse()
    with pytest.raises(RuntimeError, match="right_inverse"):
        torch.func.functional_call(model, {"0.weight": torch.randn(3, 3)}, (torch.randn(4, 3),))


def test_gradients_reach_the_given_value_not_the_originals():
    model = _weight_norm()
    weight = torch.randn(3, 3, requires_grad=True)
    fcall.functional_call(model, {"0.weight": weight}, (torch.randn(4, 3),)).sum().backward()
    assert weight.grad is not None
    assert all(p.grad is None for n, p in model.named_parameters() if "original" in n)


def test_the_originals_keys_still_run_the_parametrization():
    model = _weight_norm()
    g, v = torch.ones(3, 1), torch.eye(3)
    keys = {"0.parametrizations.weight.original0": g, "0.parametrizations.weight.original1": v}
    x = torch.randn(4, 3)
    torch.testing.assert_close(
        fcall.functional_call(model, keys, (x,)), torch.func.functional_call(model, keys, (x,))
    )


def test_the_module_is_restored_when_forward_raises():
    model = _weight_norm()
    before = _snapshot(model)
    with pytest.raises(RuntimeError):
        fcall.functional_call(model, {"0.weight": torch.randn(3, 3)}, (torch.randn(4, 5),))
    _assert_bit_exact(model, before)


@pytest.mark.parametrize("api", ["swap", "to_module"])
def test_swap_and_to_module_raise_naming_the_originals(api):
    model = _weight_norm()
    before = _snapshot(model)
    with pytest.raises(fcall.UnknownKey) as raised:
        if api == "swap":
            fcall.swap({"0.weight": torch.randn(3, 3)}, model).__enter__()
        else:
            fcall.to_module({"0.weight": torch.randn(3, 3)}, model)
    assert raised.value.args[0] == PARAMETRIZED.format(api=api)
    _assert_bit_exact(model, before)


class Scaled(nn.Module):
    """A module whose parametrized tensor is a buffer: its original is a buffer too."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


def test_a_parametrized_buffer_is_disabled_too():
    model = Scaled()
    parametrize.register_parametrization(model, "scale", Doubled())
    original = model.parametrizations.scale.original
    before = original.clone()
    x, scale = torch.randn(2, 3), torch.full((3,), 5.0)
    torch.testing.assert_close(fcall.functional_call(model, {"scale": scale}, (x,)), x * scale)
    assert model.parametrizations.scale.original is original
    assert torch.equal(original, before)
    torch.testing.assert_close(model(x), x * 2 * before)
