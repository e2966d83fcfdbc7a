"""Hypothesis strategies that draw param sets in a module's layout.

Needs ``hypothesis`` (``pip install hypothesis``); nothing else in ``fcall`` or
``fcall.testing`` imports it. Values come from a drawn seed (a torch generator), so a drawn
set is cheap however large the model, and hypothesis shrinks it through the seed.

>>> import torch
>>> from hypothesis import given, settings
>>> from fcall.testing import check_swap_parity
>>> from fcall.testing.strategies import param_sets
>>> model = torch.nn.Linear(3, 2)
>>> @settings(max_examples=2, deadline=None)
... @given(param_sets(model), param_sets(model))
... def test_swaps(first, second):
...     check_swap_parity(model, [first, second], torch.ones(3), backends=["eager"])
>>> test_swaps()
"""

from __future__ import annotations

import enum
from typing import Any, Literal

import torch
from hypothesis import strategies as st
from tensordict import TensorDict
from torch import nn

import fcall

Container = Literal["tensordict", "dict", "tensordictparams"]
Perturb = Literal["dtype", "requires_grad", "missing_key"]


class _Kind(enum.Enum):
    PARAMETER = "parameter"
    BUFFER = "buffer"


def _layout(module: nn.Module) -> dict[str, tuple[_Kind, torch.Tensor]]:
    """Each dotted key of ``module``, with whether it is a parameter and its current value;
    names tied to one tensor appear once (the swap gives the value to all of them)."""
    params = {k: (_Kind.PARAMETER, v) for k, v in module.named_parameters()}
    buffers = {k: (_Kind.BUFFER, v) for k, v in module.named_buffers()}
    return {**params, **buffers}


def _value(kind: _Kind, like: torch.Tensor, gen: torch.Generator, scale: float) -> torch.Tensor:
    if not like.is_floating_point():
        return like.detach().clone()  # an integer buffer (num_batches_tracked): as it is
    noise = torch.rand(like.shape, generator=gen, dtype=torch.float64)
    if kind is _Kind.BUFFER:  # near the module's own (running_var stays positive)
        return (like.detach().double() + 0.1 * noise).to(like.dtype)
    return ((noise * 2 - 1) * scale).to(like.dtype)


def _pack(flat: dict[str, torch.Tensor], kinds: dict[str, _Kind], container: Container) -> Any:
    if container == "dict":
        return flat
    td = TensorDict({tuple(k.split(".")): v for k, v in flat.items()}, batch_size=[])
    if container == "tensordict":
        return td
    for key, kind in kinds.items():  # parameters registered as parameters, buffers as buffers
        if key in flat and kind is _Kind.PARAMETER:
            value = flat[key]
            td[tuple(key.split("."))] = nn.Parameter(value, requires_grad=value.requires_grad)
    return fcall.TensorDictParams(td, no_convert=True)


@st.composite
def _draw(
    draw: st.DrawFn,
    module: nn.Module,
    container: Container,
    perturb: Perturb | None,
    requires_grad: bool,
    scale: float,
) -> Any:
    layout = _layout(module)
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    flat = {k: _value(kind, v, gen, scale) for k, (kind, v) in layout.items()}
    for key, (kind, _) in layout.items():
        if requires_grad and kind is _Kind.PARAMETER and flat[key].is_floating_point():
            flat[key].requires_grad_(True)
    if perturb is not None:
        floats = [k for k, v in flat.items() if v.is_floating_point()]
        params = [k for k in floats if layout[k][0] is _Kind.PARAMETER]
        choices = {"dtype": floats, "requires_grad": params or floats, "missing_key": list(flat)}
        key = draw(st.sampled_from(choices[perturb]))
        if perturb == "dtype":
            old = flat[key]
            dtype = torch.float32 if old.dtype == torch.float64 else torch.float64
            flat[key] = old.detach().to(dtype).requires_grad_(old.requires_grad)
        elif perturb == "requires_grad":
            flat[key].requires_grad_(not flat[key].requires_grad)
        else:
            del flat[key]
    return _pack(flat, {k: kind for k, (kind, _) in layout.items()}, container)


def param_sets(
    module: nn.Module,
    *,
    container: Container = "tensordict",
    perturb: Perturb | None = None,
    requires_grad: bool = False,
    scale: float = 1.0,
) -> st.SearchStrategy[Any]:
    """A strategy drawing one param set for ``module``: every parameter and buffer key, each
    value with the module's dtype, shape and device.

    Args:
        module: the module whose layout the sets take (``named_parameters`` and
            ``named_buffers``: names tied to one tensor appear once, and the swap gives the
            value to all of them).
        container: ``"tensordict"`` (nested keys), ``"dict"`` (flat ``"a.b.weight"`` keys) or
            ``"tensordictparams"`` (an ``fcall.TensorDictParams``, parameters as
            Parameters).
        perturb: change the layout of one drawn key, for negative tests (a set that must
            recompile): ``"dtype"`` (float32 <-> float64, any floating key),
            ``"requires_grad"`` (flipped, a parameter's: BatchNorm refuses running stats
            that require grad) or ``"missing_key"`` (left out).
        requires_grad: the values of parameters require grad (to check gradients).
        scale: parameters are drawn uniformly from ``[-scale, scale]``; floating buffers
            are the module's own plus up to 0.1; integer buffers are the module's own.

    >>> import torch
    >>> from hypothesis import find
    >>> from fcall.testing.strategies import param_sets
    >>> s = param_sets(torch.nn.Linear(2, 3), container="dict", perturb="missing_key")
    >>> sorted(find(s, lambda params: "weight" in params))
    ['weight']
    """
    if container not in ("tensordict", "dict", "tensordictparams"):
        raise ValueError(
            "param_sets: container must be 'tensordict', 'dict' or 'tensordictparams', "
            f"got {container!r}."
        )
    if perturb not in (None, "dtype", "requires_grad", "missing_key"):
        raise ValueError(
            "param_sets: perturb must be None, 'dtype', 'requires_grad' or 'missing_key', "
            f"got {perturb!r}."
        )
    return _draw(module, container, perturb, requires_grad, scale)
