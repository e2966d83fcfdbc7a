"""Swaps into distributed modules: FSDP2 (``fully_shard``) and DDP.

FSDP2. Before each forward, ``fully_shard``'s pre-forward hook all-gathers the
*sharded* DTensor parameters it owns and registers the unsharded result in the
modules' ``_parameters``, over anything a dict swap put there. So for a module
tree that contains an ``FSDPModule``, every swap (``swap``, ``functional_call``,
``to_module`` with any ``inplace``) is done as an in-place copy into the sharded
parameters (mode ``SHARDED``):

* prepare: every FSDP module of the tree is resharded (the sharded parameters
  are then the registered ones), each value is checked and laid out like its
  parameter (a DTensor with the same mesh and placements is used as it is, one
  with other placements is redistributed, a full tensor is cut locally with
  ``distribute_tensor(..., src_data_rank=None)``: no communication), and a clone
  of each local shard is kept;
* commit: reshard, copy the values in under ``no_grad``;
* restore: reshard (drops an unsharded copy holding the swapped values), copy
  the clones back. The Parameter objects, their storage and registrations never
  change, so FSDP's state and later forwards are as before.

Buffers (not managed by FSDP) are copied the same way. A value that requires
grad (or is batched by ``vmap``) is refused for ``swap``/``functional_call`` and
non-inplace ``to_module``: its gradient would reach the module's own parameters,
not the value.

DDP. Swaps go into ``ddp.module`` (keys with or without ``module.``) and the
outputs are right, but DDP's reducer watches only its own parameters: gradients
of swapped leaves would not be all-reduced. Values that require grad are
therefore refused when ``module`` is the DDP wrapper; swapping into
``ddp.module`` is the explicit opt-out (then all-reduce the gradients yourself).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch import nn

from .. import _errors
from .._errors import Fault
from .slot_values import tracks_gradients
from .tree import unwrap
from .types import Distributed, Mode, Plan, Sharded, Swap

INPLACE = Mode.INPLACE

try:  # torch built without distributed support
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor, distribute_tensor
except ImportError:  # pragma: no cover
    FSDPModule = DTensor = distribute_tensor = None  # type: ignore[assignment,misc]


def prepare(
    module: nn.Module,
    plan: Plan,
    leaves: Any,
    mode: Mode,
    non_blocking: bool,
    read_slots: Callable[[Plan], Sequence[Any]],
) -> Swap | None:
    """A ``SHARDED`` swap for an FSDP2 tree, a check for DDP, else ``None`` (a plain swap).
    ``read_slots``: ``plan.read_slots``, called once the tree is resharded (before, the slots
    hold the unsharded parameters, whose storage FSDP frees)."""
    if plan.distributed is Distributed.FSDP:
        root = unwrap(module)[0]
        return _prepare_sharded(root, plan, leaves, mode, non_blocking, read_slots)
    if plan.distributed is Distributed.DDP and mode is not INPLACE:
        _refuse_grad_through_ddp(plan, leaves)
    return None


def classified(module: nn.Module, owners: list[nn.Module]) -> Distributed:
    """What the tree of a plan is (``plan.distributed``): ``owners``, its owner modules (the
    root and each module on a key's path), found by ``bind.reach``."""
    if FSDPModule is None:  # torch built without distributed support
        return Distributed.NONE
    if _is_fsdp(owners):
        return Distributed.FSDP
    return Distributed.DDP if "module" in unwrap(module)[1] else Distributed.NONE


def copy_in(swap: Swap, values: Sequence[Any]) -> None:
    """An FSDP2 swap's commit (``values``: the new ones) and restore (the saved shards):
    every FSDP module resharded, then the values copied into the module's own shards."""
    sharded = cast("Sharded", swap.sharded)  # a SHARDED swap's
    reshard(sharded.fsdp_modules)
    copy_into(sharded.shards, values, swap.non_blocking)


def _is_fsdp(owners: list[nn.Module]) -> bool:
    for owner in owners:  # a loop, not any(generator): traced on every compile
        if isinstance(owner, FSDPModule):
            return True
    return False


def fsdp_modules(root: nn.Module) -> list[nn.Module]:
    """Every FSDP2 module of the tree (none on a torch built without distributed support)."""
    if FSDPModule is None:
        return []
    return [m for m in root.modules() if isinstance(m, FSDPModule)]


def reshard(modules: list[nn.Module]) -> None:
    """FSDP2 registers full (unsharded) parameters between forward and reshard: put the
    sharded ones back in each of ``modules`` (``fsdp_modules``), so they are the ones read
    and written."""
    for fsdp_module in modules:
        fsdp_module.reshard()  # type: ignore[operator]


def copy_into(targets: Sequence[Any], values: Sequence[Any], non_blocking: bool) -> None:
    """The one copy loop: each value into its target tensor, under ``no_grad``."""
    with torch.no_grad():
        for target, value in zip(targets, values):
            target.copy_(value, non_blocking=non_blocking)


def _prepare_sharded(
    root: nn.Module,
    plan: Plan,
    leaves: Any,
    mode: Mode,
    non_blocking: bool,
    read_slots: Callable[[Plan], Sequence[Any]],
) -> Swap:
    modules = fsdp_modules(root)
    reshard(modules)
    held = read_slots(plan)
    swap = Swap(plan, Mode.SHARDED, leaves, non_blocking)
    swap.sharded = Sharded(modules, [])
    root_name = type(root).__name__
    new, old = [], []
    with torch.no_grad():
        for leaf, key, target in zip(plan.leaves, plan.names, held):
            value = leaves.values[leaf]
            if not isinstance(value, torch.Tensor):
                raise Fault(TypeError, _errors.not_a_tensor, key, value)
            if target is None:
                raise Fault(ValueError, _errors.inplace_none_target, key)
            if mode is not INPLACE and tracks_gradients(value):
                raise Fault(RuntimeError, _errors.requires_grad_on_fsdp, key, root_name)
            swap.sharded.shards.append(target)
            new.append(_laid_out_like(value, target, key))
            old.append(target.detach().clone())
    swap.new, swap.old = new, old
    return swap


def _laid_out_like(value: torch.Tensor, target: torch.Tensor, key: str) -> torch.Tensor:
    value = value.detach()
    if not isinstance(target, DTensor):  # a buffer, or a parameter FSDP does not shard
        if isinstance(value, DTensor):
            value = value.full_tensor()
        if value.shape != target.shape:
            raise _wrong_shape(key, value, target)
        return value
    if isinstance(value, DTensor):
        if value.device_mesh != target.device_mesh:
            raise Fault(RuntimeError, _errors.fsdp_mesh, key, value.device_mesh, target.device_mesh)
        if value.shape != target.shape:
            raise _wrong_shape(key, value, target)
        if tuple(value.placements) != tuple(target.placements):
            value = value.redistribute(target.device_mesh, target.placements)
        return value
    if value.shape != target.shape:
        raise _wrong_shape(key, value, target)
    return distribute_tensor(
        value.to(target.device), target.device_mesh, target.placements, src_data_rank=None
    )


def _wrong_shape(key: str, value: torch.Tensor, target: torch.Tensor) -> Fault:
    local = tuple(target.to_local().shape) if isinstance(target, DTensor) else None
    return Fault(RuntimeError, _errors.fsdp_shape, key, value.shape, target.shape, local)


def _refuse_grad_through_ddp(plan: Plan, leaves: Any) -> None:
    for leaf, key in zip(plan.leaves[: plan.given], plan.names):
        value = leaves.values[leaf]
        if isinstance(value, torch.Tensor) and tracks_gradients(value):
            raise Fault(RuntimeError, _errors.grad_through_ddp, key)
