"""``to_module(inplace=True)``: values copied into the module's own tensors, which keep their
identity (``engine.py``'s ``INPLACE`` mode); the restore copies the saved old values back.
``check_inplace`` checks every value and saves the old ones before anything is copied."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .. import _errors
from .._errors import Fault
from . import distributed
from .plan import read_slots
from .types import Plan


def check_inplace(plan: Plan, values: list) -> list:
    saved: list[torch.Tensor] = []
    with torch.no_grad():
        for leaf, key, target in zip(plan.leaves, plan.names, read_slots(plan)):
            value = values[leaf]
            if value is None:
                raise Fault(TypeError, _errors.not_a_tensor, key, value)
            if target is None:
                raise Fault(ValueError, _errors.inplace_none_target, key)
            if not _fits(value.shape, target.shape):
                got, expected = tuple(value.shape), tuple(target.shape)
                raise Fault(RuntimeError, _errors.inplace_shape, key, got, expected)
            if len(saved) < plan.given:
                saved.append(target.detach().clone())
    return saved


def _fits(shape: torch.Size, target: torch.Size) -> bool:
    """Whether ``target.copy_(value)`` accepts a value of ``shape`` (it broadcasts)."""
    if len(shape) > len(target):
        return False
    return all(size in (1, want) for size, want in zip(reversed(shape), reversed(target)))


def copy_inplace(plan: Plan, values: Sequence[Any], non_blocking: bool) -> None:
    """``inplace=True``: copy ``values`` into the module's own tensors; while Dynamo traces,
    outside the graph where autograd may have saved those tensors (see ``_copy_eagerly``)."""
    if plan.traced and torch.is_grad_enabled():
        for slot, name in zip(plan.slots, plan.slot_names):
            target = slot[name]
            if target is not None and target.requires_grad:
                return _copy_eagerly(plan, values, non_blocking)
    return _copy_into(plan, values, non_blocking)


def _copy_into(plan: Plan, values: Sequence[Any], non_blocking: bool) -> None:
    distributed.copy_into(read_slots(plan), values, non_blocking)


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
