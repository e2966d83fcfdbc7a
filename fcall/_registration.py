"""tensordict's registration order, for ``to_module``'s swaps.

tensordict's ``to_module`` writes each name as ``del d[name]; d[name] = value``, so a
name it writes (and its restore writes back) moves to the end of its dict, and torch's
global parameter registration hooks run for each Parameter it writes
(``torch.nn.modules.module.register_module_parameter_registration_hook``; a hook's
result replaces the value). ``fcall.to_module`` does the same, after its writes: each
run of consecutive entries in one dict is moved to the end of that dict, unless the
dict already ends with those names in that order (then the moves would change
nothing; while tracing, this is decided on the order Dynamo sees, and leaves the
module's dicts untouched, so no dict is rebuilt after the graph). ``swap`` and
``functional_call`` write in place, as ``torch.func`` does: they keep the order and
run no hook.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn.modules.module import _global_parameter_registration_hooks

from ._plan import Plan, unwrap


def reregister(plan: Plan, module: nn.Module, targets: list[dict] | None, new: list[Any]) -> None:
    """Give the dicts that ``plan`` wrote tensordict's order, and run the registration
    hooks on each Parameter written; ``targets``: the dict each value went into, when
    some value changed dict; ``new``: what each slot received (a hook's result replaces
    its value there)."""
    if targets is None:
        slots = [entry.slot for entry in plan.entries]
        _reregister(plan, module, slots, list(range(len(slots))), new, False)
    else:
        _reregister(plan, module, targets, list(range(len(targets))), new, True)


def reregister_as_given(plan: Plan, module: nn.Module, given: list[str]) -> None:
    """``reregister`` after ``to_module(old, module)`` undid the swap of ``plan``: its
    slots, in the order of the names ``given`` (those of ``old``), as tensordict writes
    them."""
    index = {name: i for i, name in enumerate(plan.names)}
    slots = [entry.slot for entry in plan.entries]
    _reregister(plan, module, slots, [index[name] for name in given], [], False)


def _reregister(
    plan: Plan,
    module: nn.Module,
    slots: list[dict],
    order: list[int],
    new: list[Any],
    compare_slots: bool,
) -> None:
    order = [i for i in order if i not in plan.repeated]  # tensordict writes a slot once
    start = 0
    for at in range(1, len(order) + 1):  # each run of entries in one dict
        if at == len(order) or not _same_dict(plan, slots, order[start], order[at], compare_slots):
            _move_to_end(slots[order[start]], [plan.entries[i].name for i in order[start:at]])
            start = at
    if _global_parameter_registration_hooks:
        _run_hooks(plan, unwrap(module)[0], slots, order, new)


def _same_dict(plan: Plan, slots: list[dict], i: int, j: int, compare_slots: bool) -> bool:
    if compare_slots:  # some value changed dict (_engine._targets compared the dicts)
        return slots[i] is slots[j]
    # Traced, `d1 is d2` on two module dicts reads their tensors into guarded graph inputs
    # (the old ones too): the owner's name and the kind of slot are constants.
    first, second = plan.entries[i], plan.entries[j]
    return first.kind is second.kind and (
        plan.names[i].rpartition(".")[0] == plan.names[j].rpartition(".")[0]
    )


def _move_to_end(slot: dict, run: list[str]) -> None:
    # tuple(slot), not list(slot): traced, the list's items are the dict's (lazy) entries,
    # and comparing them reads the module's own tensors into guarded graph inputs
    keys = tuple(slot)
    if keys[len(keys) - len(run) :] == tuple(run):
        return  # already last, in this order: the moves would leave the dict as it is
    for name in run:
        slot[name] = slot.pop(name)


def _run_hooks(plan: Plan, root: nn.Module, slots: list[dict], order: list[int], new: list) -> None:
    for index in order:
        slot, name = slots[index], plan.entries[index].name
        value = slot[name]
        if not isinstance(value, nn.Parameter):
            continue
        owner = root.get_submodule(plan.names[index].rpartition(".")[0])
        for hook in list(_global_parameter_registration_hooks.values()):
            output = hook(owner, name, value)
            if output is not None:
                value = output
        slot[name] = value
        if index < len(new):
            new[index] = value
