"""``to_module(inplace=True)``: values are copied into the module's own tensors, which
keep their identity; the restore copies the saved old values back.

``check_inplace`` runs before anything is written (every value is a tensor that
broadcasts to its target), and saves a copy of each target.
"""

from __future__ import annotations

import torch

from .. import _errors
from .plan import Plan, read_slots


def check_inplace(plan: Plan, values: list, api: str) -> list:
    saved: list[torch.Tensor] = []
    with torch.no_grad():
        for entry, key, target in zip(plan.entries, plan.names, read_slots(plan)):
            value = values[entry.leaf]
            if value is None:
                raise TypeError(_errors.not_a_tensor(api, key, value))
            if target is None:
                raise ValueError(_errors.inplace_none_target(api, key))
            if not _fits(value.shape, target.shape):
                raise RuntimeError(
                    _errors.inplace_shape(api, key, tuple(value.shape), tuple(target.shape))
                )
            if len(saved) < plan.given:
                saved.append(target.detach().clone())
    return saved


def _fits(shape: torch.Size, target: torch.Size) -> bool:
    """Whether ``target.copy_(value)`` accepts a value of ``shape`` (it broadcasts)."""
    if len(shape) > len(target):
        return False
    return all(size in (1, want) for size, want in zip(reversed(shape), reversed(target)))


def copy_inplace(plan: Plan, values: list, non_blocking: bool) -> None:
    """``inplace=True``: copy ``values`` into the module's own tensors; while Dynamo traces,
    outside the graph where autograd may have saved those tensors (see ``_copy_eagerly``)."""
    if plan.traced and torch.is_grad_enabled():
        for slot, name in plan.pairs:
            target = slot[name]
            if target is not None and target.requires_grad:
                return _copy_eagerly(plan, values, non_blocking)
    return _copy_into(plan, values, non_blocking)


def _copy_into(plan: Plan, values: list, non_blocking: bool) -> None:
    with torch.no_grad():
        for (slot, name), value in zip(plan.pairs, values):
            slot[name].copy_(value, non_blocking=non_blocking)


# A copy into tensors that require grad, with grad mode on, may overwrite tensors that
# autograd saved for backward (the restore of `with to_module(p, m, inplace=True): y =
# m(x)` does: backward needs the values the block used). Eager raises in backward ("one
# of the variables needed for gradient computation has been modified by an inplace
# operation"). In one graph AOTAutograd raises that while compiling, and hiding the
# copy from autograd (torch.autograd._unsafe_preserve_version_counter) gives wrong
# gradients. Outside the graph, compiled matches eager: same outputs, same gradients
# where eager has them, the same error in backward where eager raises.
_copy_eagerly = torch.compiler.disable(
    _copy_into,
    reason=(
        "fcall.to_module(inplace=True) with grad mode on copies into parameters that "
        "require grad, which autograd may have saved for backward: the copies run outside "
        "the graph, as in eager (a graph break each; fullgraph=True refuses them). For a "
        "forward without gradients run the block under torch.no_grad(); for gradients "
        "swap without inplace=True"
    ),
)
