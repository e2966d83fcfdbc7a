"""Compiled vs eager, value by value: outputs by pytree path, gradients and params by key,
and the module's own slots (the same objects, registered as before, with eager's values)."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree
from tensordict import TensorDictBase
from torch import nn

from ._layout import flat_items


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """A value that differs: where (``"output['logits']"``, ``"grad of `0.weight`"``),
    the largest absolute difference (``nan`` when shapes, dtypes or None-ness differ),
    and torch's own description."""

    path: str
    max_abs_diff: float
    detail: str


def _copy_leaf(value: torch.Tensor) -> torch.Tensor:
    data = value.detach().clone()
    if isinstance(value, nn.Parameter):
        return nn.Parameter(data, requires_grad=value.requires_grad)
    return data.requires_grad_(value.requires_grad)


def copy_set(params: Any) -> Any:
    """An independent copy of a param set: same container, keys, leaf types and
    ``requires_grad``, new storage (so that compiled and eager runs do not share buffers
    that a train-mode forward updates)."""
    try:
        return copy.deepcopy(params)
    except RuntimeError:  # a non-leaf tensor: rebuild leaf by leaf
        if isinstance(params, TensorDictBase):
            return params.apply(_copy_leaf)
        if isinstance(params, Mapping):
            return {k: copy_set(v) for k, v in params.items()}
        return _copy_leaf(params) if isinstance(params, torch.Tensor) else params


def requiring_grad(params: Any) -> list[tuple[str, torch.Tensor]]:
    """The set's values that require grad, by key (a tensor given under two keys once)."""
    seen: set[int] = set()
    out = []
    for key, value in flat_items(params):
        if value.requires_grad and id(value) not in seen:
            seen.add(id(value))
            out.append((key, value))
    return out


def loss_weights(out: torch.Tensor) -> torch.Tensor:
    """The fixed weights of ``out``'s elements in the loss the gradients are taken of:
    ``0.5`` to ``1.5``, evenly spaced. Not all ones: ``out.sum()`` after a train-mode
    BatchNorm (or any normalization over what is summed) is constant in its input, so the
    gradients above it would be rounding noise, compared as if they were values."""
    count = out.numel()
    return torch.linspace(0.5, 1.5, count, dtype=out.dtype, device=out.device).reshape(out.shape)


def weighted_sum(out: torch.Tensor) -> torch.Tensor:
    """The loss the gradients are taken of: ``out``, as float, weighed by ``loss_weights``."""
    out = out.float()
    return (out * loss_weights(out)).sum()


def loss_of(outputs: list[torch.Tensor]) -> torch.Tensor:
    """The loss gradients are taken of: the sum of each output's ``weighted_sum``."""
    return torch.stack([weighted_sum(t) for t in outputs]).sum()


def grads(out: Any, params: Any) -> dict[str, torch.Tensor | None]:
    """``d(weighted sum of the floating outputs)/d(value)`` for each value of the set
    requiring grad (``loss_weights``)."""
    wrt = requiring_grad(params)
    leaves = [
        t
        for t in pytree.tree_leaves(out)
        if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()
    ]
    if not wrt or not leaves:
        return {}
    loss = loss_of(leaves)
    got = torch.autograd.grad(loss, [v for _, v in wrt], allow_unused=True)
    return {k: g for (k, _), g in zip(wrt, got)}


def _max_abs_diff(got: torch.Tensor, expected: torch.Tensor) -> float:
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return float("nan")
    if got.numel() == 0:
        return 0.0
    diff = (got.detach().double() - expected.detach().double()).abs()
    return float(diff.nan_to_num(float("inf")).max())


def compare(
    path: str, got: Any, expected: Any, atol: float | None, rtol: float | None
) -> Mismatch | None:
    """The first mismatch between two values (tensors, or pytrees of them), or ``None``."""
    got_leaves, got_spec = pytree.tree_flatten_with_path(got)
    exp_leaves, exp_spec = pytree.tree_flatten_with_path(expected)
    if got_spec != exp_spec:
        return Mismatch(path, float("nan"), f"structure {got_spec} vs eager's {exp_spec}")
    for (where, g), (_, e) in zip(got_leaves, exp_leaves):
        name = path + pytree.keystr(where)
        if not isinstance(e, torch.Tensor) or not isinstance(g, torch.Tensor):
            if g != e:
                return Mismatch(name, float("nan"), f"{g!r} vs eager's {e!r}")
            continue
        try:
            torch.testing.assert_close(g.detach(), e.detach(), atol=atol, rtol=rtol, equal_nan=True)
        except AssertionError as exc:
            return Mismatch(name, _max_abs_diff(g, e), str(exc).strip())
    return None


@dataclasses.dataclass(frozen=True)
class Slot:
    """One parameter or buffer slot of the module: where, the object held, its type."""

    path: str
    value: torch.Tensor | None
    kind: str
    requires_grad: bool | None


def module_slots(module: nn.Module) -> list[Slot]:
    """Every parameter and buffer slot of every submodule, in registration order."""
    out = []
    for prefix, sub in module.named_modules(remove_duplicate=False):
        for slots in (sub._parameters, sub._buffers):
            for name, value in slots.items():
                path = f"{prefix}.{name}" if prefix else name
                rg = None if value is None else value.requires_grad
                out.append(Slot(path, value, type(value).__name__, rg))
    return out


def restore_problem(
    before: list[Slot], after: list[Slot], order: list[str] | None = None
) -> str | None:
    """How the module's slots differ from before the swaps (objects, types, flags), and
    their order from ``order`` (``to_module`` registers the names it writes again, at the
    end of their dict, as tensordict's does: the order eager left), else from before's."""
    if order is not None:
        if [s.path for s in after] != order:
            return "the order of the module's parameters and buffers differs from eager's"
        before = sorted(before, key=lambda s: s.path)
        after = sorted(after, key=lambda s: s.path)
    if [s.path for s in before] != [s.path for s in after]:
        gone = sorted({s.path for s in before} - {s.path for s in after})
        new = sorted({s.path for s in after} - {s.path for s in before})
        return f"the module's slots changed: gone {gone}, new {new}"
    for b, a in zip(before, after):
        if a.value is not b.value:
            return f"`{b.path}` holds another object than before the swap ({a.kind})"
        if (a.kind, a.requires_grad) != (b.kind, b.requires_grad):
            return f"`{b.path}` changed: {b.kind}/{b.requires_grad} -> {a.kind}/{a.requires_grad}"
    return None


def values_of(slots: list[Slot]) -> dict[str, torch.Tensor]:
    """A copy of each slot's value (for the values a forward writes in place)."""
    return {s.path: s.value.detach().clone() for s in slots if s.value is not None}


def changed_values(slots: list[Slot], initial: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy of the values that differ from ``initial`` (what a forward wrote in place)."""
    return {
        s.path: s.value.detach().clone()
        for s in slots
        if s.value is not None and not torch.equal(s.value, initial[s.path])
    }


def put_values(slots: list[Slot], values: dict[str, torch.Tensor]) -> None:
    """Writes saved values back into the module's own tensors, in place."""
    with torch.no_grad():
        for s in slots:
            if s.value is not None:
                s.value.copy_(values[s.path])
