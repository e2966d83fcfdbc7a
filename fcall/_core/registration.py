"""tensordict's registration order, for ``to_module``'s swaps.

tensordict's ``to_module`` writes each name as ``del d[name]; d[name] = value``, so a
name it writes (and its restore writes back) moves to the end of its dict, and torch's
global parameter registration hooks run for each Parameter it writes
(``torch.nn.modules.module.register_module_parameter_registration_hook``; a hook's
result replaces the value). ``fcall.to_module`` does the same, after its writes: in
eager each name written is popped and set again, in order; while tracing, the names
written into each dict are moved only if the dict does not already end with them, in
that order (decided on the order Dynamo sees: a dict left as it was is not rebuilt
after the graph). ``swap`` and ``functional_call`` write in place, as ``torch.func``
does: they keep the order and run no hook.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn
from torch.nn.modules.module import _global_parameter_registration_hooks

from .._compat import MODULE_DICT_TRACED
from .tree import owner_of, unwrap
from .types import DictGroup, Plan, SlotKind, new_entry

ATTRIBUTE = SlotKind.ATTRIBUTE


def reregister(
    plan: Plan, module: nn.Module, targets: list[dict | None] | None, new: list[Any]
) -> None:
    """Give the dicts that ``plan`` wrote tensordict's order, and run the registration
    hooks on each Parameter written; ``targets``: the dict each value went into, when
    some value changed dict (``None`` where it stayed); ``new``: what each slot received
    (a hook's result replaces its value there). An eager swap whose slots are each named
    once needs only the hooks (``run_hooks``): its writes gave the order
    (``engine._write``)."""
    order = range(len(plan.slots))
    if targets is None:
        # In-place copies, a restore that found a slot changed, or traced (the Route
        # grouped the names to move, fcall/_core/routes.py): the groups are the plan's
        if plan.dict_groups is None or plan.has_attributes or plan.repeated:
            plan.dict_groups = _groups(plan, order, None)
        for group in plan.dict_groups:
            if group.names:
                move_to_end(group.slot, group.names)
    else:  # a value that changed dict was just written last into it, in this order
        for group in _groups(plan, order, targets, stayed_only=True):
            move_to_end(group.slot, group.names)
    run_hooks(plan, module, targets, order, new)


def reregister_restored(plan: Plan, module: nn.Module, changed: bool) -> None:
    """``reregister`` after a restore; ``changed``: some slot held another value than the
    swap had put there (a slot deleted in the block comes back at the end of its dict).
    Unchanged, the names written are still last in their dicts, in order (the commit put
    them there, the restore wrote in place): only the hooks run."""
    if changed:
        plan.dict_groups = None  # the block changed the dicts' order: grouped again
        reregister(plan, module, None, [])
    else:
        run_hooks(plan, module, None, range(len(plan.slots)), [])


def reregister_as_given(plan: Plan, module: nn.Module, given: list[str]) -> None:
    """``reregister`` after ``to_module(old, module)`` undid the swap of ``plan``: its
    slots, in the order of the names ``given`` (those of ``old``), as tensordict writes
    them."""
    index = {name: i for i, name in enumerate(plan.names)}
    order = [index[name] for name in given]
    for group in _groups(plan, order, None):
        move_to_end(group.slot, group.names)
    run_hooks(plan, module, None, order, [])


def dict_groups(plan: Plan) -> list[DictGroup]:
    """The names ``plan`` writes into each of its slot dicts, in its entries' order (a Route
    takes them as slot indexes, routes.py)."""
    return _groups(plan, range(len(plan.slots)), None)


def _groups(
    plan: Plan, order: Sequence[int], targets: list[dict | None] | None, stayed_only: bool = False
) -> list[DictGroup]:
    """The names written into each dict, in ``order``.

    The order of a dict after the moves depends only on those: the other names keep
    theirs, before them. A dict is told from the others by its owner's name and the kind
    of slot, constants (traced, ``id()`` of a module's dict guards on it, and ``d1 is d2``
    reads its tensors into guarded graph inputs), and whether the value left the slot's
    dict (``targets``: the dict it went into, ``None`` where it stayed); ``stayed_only``: the
    values that stayed in their slot's dict only. A value that left it was written into a
    dict that did not hold its name (engine._write), so it is last there, in order: Dynamo
    2.11 cannot read the order of a module's ``__dict__``, where such values go."""
    by_dict: dict[tuple, DictGroup] = {}
    for index in order:
        if index in plan.repeated:
            continue  # a submodule at two paths: tensordict writes its slot once
        kind = plan.kinds[index]
        target = None if targets is None else targets[index]
        if stayed_only and target is not None:
            continue
        if target is None and kind is ATTRIBUTE and plan.traced and not MODULE_DICT_TRACED:
            continue  # a module's __dict__ (_compat.MODULE_DICT_TRACED)
        key = (plan.names[index].rpartition(".")[0], kind, target is not None)
        group = by_dict.get(key)
        if group is None:
            group = new_entry(DictGroup, (plan.slots[index] if target is None else target, []))
            by_dict[key] = group
        group.names.append(plan.slot_names[index])
    return list(by_dict.values())


def move_to_end(slot: dict, names: list[str]) -> None:
    """The one move: ``names`` last in ``slot``, in this order, as tensordict's
    ``del d[name]; d[name] = value`` leaves them (the other names keep their order)."""
    if ends_with(slot, names):
        return  # already last, in this order: the moves would leave the dict as it is
    for name in names:
        slot[name] = slot.pop(name)


def ends_with(slot: dict, names: Sequence[str]) -> bool:
    """Whether ``slot``'s last keys are ``names``, in this order."""
    # tuple(slot), not list(slot): traced, the list's items are the dict's (lazy) entries,
    # and comparing them reads the module's own tensors into guarded graph inputs
    keys = tuple(slot)
    return keys[len(keys) - len(names) :] == tuple(names)


def run_hooks(
    plan: Plan,
    module: nn.Module,
    targets: list[dict | None] | None,
    order: Sequence[int],
    new: list,
) -> None:
    """Torch's global parameter registration hooks on each Parameter written, in ``order``
    (``targets``: the dict each value went into); a hook's result replaces the value, in
    its slot and in ``new``. Nothing to do, and nothing read, when no hook is registered."""
    if not _global_parameter_registration_hooks:
        return
    root = unwrap(module)[0]
    slots: list[dict] = list(plan.slots)
    if targets is not None:
        slots = [slot if target is None else target for slot, target in zip(slots, targets)]
    for index in order:
        if index in plan.repeated:
            continue
        slot, name = slots[index], plan.slot_names[index]
        value = slot[name]
        if not isinstance(value, nn.Parameter):
            continue
        owner = owner_of(root, plan.names[index])
        for hook in list(_global_parameter_registration_hooks.values()):
            output = hook(owner, name, value)
            if output is not None:
                value = output
        slot[name] = value
        if index < len(new):
            new[index] = value
