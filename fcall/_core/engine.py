"""Apply a plan: write the new values into the module's slots, and undo it exactly.

A swap runs in two steps so that the module is never left half-swapped: ``prepare`` reads
the old values, decides what each slot receives (and checks in-place copies): anything that
can fail fails there. ``commit`` writes (``_write``: one builtin pass over the slots, or a
loop by entry where a value changes dict). ``restore`` puts back the very objects that were
there, in their slots and in their order (the same two forms), and writes a
buffer that ``forward`` reassigned back into the params container. For ``to_module``, commit
and restore then give the dicts tensordict's order (``registration.py``). ``swap_in`` is the
pipeline ``swap`` and ``functional_call`` share: resolve, prepare, commit.

The modes (``types.Mode``): ``AS_IS`` for ``swap`` / ``functional_call``; ``PRESERVE``,
``REPLACE`` and ``INPLACE`` (copies into the module's own tensors, which keep their identity;
the restore copies the saved old values back: ``inplace.py``) for ``to_module``; ``SHARDED``
for FSDP2 trees, whose copies ``distributed.py`` makes.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import count, repeat
from operator import is_, setitem
from typing import Any

from torch import nn
from torch.nn.modules.module import _global_parameter_registration_hooks as _hooks

from .. import _errors
from .._compat import MODULE_DICT_TRACED, forget_added_attributes, hold_dicts, settle_dicts
from .._errors import Fault
from . import distributed
from .flatten import Leaves
from .inplace import check_inplace, copy_inplace
from .plan import forget, read_slots, resolve
from .registration import move_to_end, reregister, reregister_restored, run_hooks
from .slot_values import preserved, registered_values
from .types import (
    GONE,
    DictOrder,
    Distributed,
    Mode,
    Plan,
    SlotKind,
    StalePlan,
    Swap,
    attributes_of,
)

AS_IS, PRESERVE, REPLACE, INPLACE = Mode.AS_IS, Mode.PRESERVE, Mode.REPLACE, Mode.INPLACE
NONE = Distributed.NONE
PARAMETER, ATTRIBUTE = SlotKind.PARAMETER, SlotKind.ATTRIBUTE


def swap_in(params: Any, module: nn.Module, strict: bool, tie_weights: bool) -> tuple[Swap, Leaves]:
    """``swap`` and ``functional_call``: ``params`` written into ``module`` as they are.
    Made again with a new plan if a cached plan of ``module`` named a slot that is gone
    (``StalePlan``: nothing was written)."""
    if not isinstance(module, nn.Module):
        raise Fault(TypeError, _errors.not_a_module, module)
    try:
        plan, leaves = resolve(params, module, tie_weights=tie_weights, strict=strict)
        for indexes in plan.tie_sources:  # tied names given: one value for all of them
            first = leaves.values[indexes[0]]
            if any(leaves.values[i] is not first for i in indexes[1:]):
                names = [".".join(leaves.keys[i]) for i in indexes]
                raise Fault(ValueError, _errors.tied_conflict, names)
        swapped = prepare(module, plan, leaves, AS_IS, False)
    except StalePlan:
        forget(module)
        return swap_in(params, module, strict, tie_weights)
    commit(swapped)
    return swapped, leaves


def prepare(module: nn.Module, plan: Plan, leaves: Leaves, mode: Mode, non_blocking: bool) -> Swap:
    """Read the old values and decide what each slot receives; nothing is written.
    ``StalePlan`` if a cached plan names a slot that is gone."""
    if plan.distributed is not NONE:
        sharded = distributed.prepare(module, plan, leaves, mode, non_blocking, read_slots)
        if sharded is not None:
            return sharded
    swap = Swap(plan, mode, leaves, non_blocking)
    values = leaves.values
    if mode is INPLACE:
        swap.old = check_inplace(plan, values)
        swap.new = [values[leaf] for leaf in plan.leaves[: plan.given]]
        return swap
    # Traced, `slot[name]` is Dynamo's unread (lazy) entry of the module's dict: the old
    # tensor is neither a graph input nor guarded, and restore writes that same entry back,
    # so the dict is left as Dynamo found it and nothing is replayed after the call
    # (fcall/README.md, where the code bends to Dynamo).
    swap.old = read_slots(plan)
    if mode is PRESERVE:
        if plan.direct and not plan.traced:  # an eager plan whose entry i takes leaf i
            swap.new = preserved(plan, values, swap.old)
        else:
            swap.new = registered_values(plan, values, swap.old)
    elif plan.direct:
        swap.new = values
    else:
        swap.new = [values[leaf] for leaf in plan.leaves]
    if mode is REPLACE or plan.has_attributes:
        swap.targets = _targets(plan, swap.new, mode)
    return swap


def commit(swap: Swap) -> None:
    if swap.sharded is not None:  # an FSDP2 tree: copies into its shards
        return distributed.copy_in(swap, swap.new)
    plan = swap.plan
    if swap.mode is INPLACE:
        copy_inplace(plan, swap.new, swap.non_blocking)
        to_end = False
    else:
        if swap.targets is not None:
            swap.orders = [DictOrder(slot, list(slot)) for slot in _dicts_left(plan, swap.targets)]
        # the writes give tensordict's registration order themselves: a to_module swap whose
        # slots are each named once, in eager (registration.py)
        to_end = swap.reorder_in is not None and not plan.traced and not plan.repeated
        if plan.traced:  # nothing for Dynamo to replay after the graph (fcall/README.md)
            hold_dicts((*plan.slots, *(swap.targets or ())))
        _write(swap, swap.new, to_end)
        if plan.traced and swap.targets is not None:  # a value left a module's __dict__
            forget_added_attributes()
    if swap.reorder_in is not None and (_hooks or not to_end):  # to_end: the order is given
        _reregister(swap, swap.reorder_in, swap.new, to_end)


def _dicts_left(plan: Plan, targets: list[dict | None]) -> list[dict]:
    """Each slot dict that some value leaves for another dict, once."""
    moving = [i for i, target in enumerate(targets) if target is not None]
    if not plan.traced:
        return list({id(plan.slots[i]): plan.slots[i] for i in moving}.values())
    # Traced: `id()` of a module's dict guards on that object (another instance of the
    # architecture would recompile), and Dynamo 2.11 cannot trace `is` between two dicts:
    # a dict is told by its owner's path and its kind, constants (registration._groups).
    # A submodule at two paths may be listed twice: its order is restored twice, alike.
    # Where Dynamo cannot read a module's __dict__ (_compat.MODULE_DICT_TRACED), not an
    # attribute's slot: Dynamo writes an attribute back after the graph in its place there.
    left = {
        (plan.names[i].rpartition(".")[0], plan.kinds[i]): plan.slots[i]
        for i in moving
        if MODULE_DICT_TRACED or plan.kinds[i] is not ATTRIBUTE
    }
    return list(left.values())


def _reregister(swap: Swap, module: nn.Module, new: list[Any], to_end: bool) -> None:
    """tensordict's registration order and hooks after ``swap``'s writes of ``new``."""
    if to_end:  # the writes gave the order: only the hooks, if any
        if _hooks:
            run_hooks(swap.plan, module, swap.targets, range(len(swap.plan.slots)), new)
    else:
        reregister(swap.plan, module, swap.targets, new)


def _write(swap: Swap, values: Sequence[Any], to_end: bool) -> None:
    """The writes: each value into its slot (``swap.targets``: the dict each value goes
    into, when some value changes dict, ``None`` where it stays; a value that moves leaves
    its slot's dict).
    ``to_end``: every name written goes to the end of its dict, in order, as tensordict's
    ``del d[name]; d[name] = value`` puts it. With no value changing dict and no name
    moved, the writes are one builtin call: in eager a C loop (``operator.setitem``, so a
    slot of a ``dict`` subclass keeps its own ``__setitem__``), traced a call that Dynamo
    runs without stepping (fcall/README.md), unless a slot is a module's ``__dict__`` where
    Dynamo traces it a key at a time (``_compat.MODULE_DICT_TRACED``: one entry at a time,
    ``d[k] = v``; ``plan.has_attributes`` tested first, so that no global, a guard, is read in
    a trace where no slot is an attribute's)."""
    plan, targets = swap.plan, swap.targets
    if targets is None and not to_end and not plan.by_entry:
        write = dict.__setitem__ if plan.traced else setitem
        tuple(map(write, plan.slots, plan.slot_names, values))
        return
    for index, target, slot, name, value in zip(
        count(), targets or repeat(None), plan.slots, plan.slot_names, values
    ):
        if to_end or target is not None:  # a pop, not del: a slot at two paths moves once
            if not MODULE_DICT_TRACED and plan.traced and plan.kinds[index] is ATTRIBUTE:
                _leave_attributes(swap, index, slot)
            else:
                slot.pop(name, None)
        (slot if target is None else target)[name] = value


def restore(swap: Swap) -> Sequence[Any]:
    """Undo ``swap``; returns what the slots held just before (the given entries first)."""
    if swap.done:
        return []
    swap.done = True
    if swap.sharded is not None:  # an FSDP2 tree: the saved shards copied back
        distributed.copy_in(swap, swap.old)
        return []
    plan = swap.plan
    if swap.mode is INPLACE:
        copy_inplace(plan, swap.old, swap.non_blocking)
        if swap.reorder_in is not None:  # copies: every slot holds what it held
            reregister_restored(plan, swap.reorder_in, False)
        return []
    # The restore: the very same objects back into their slots (a value that
    # moved leaves the dict it went into; a slot deleted in the block is registered
    # again), what each slot held, and whether any held another value than the swap put
    # there. `get`: a deleted slot is GONE (traced, a missing key in `d[name]` is a graph
    # break, not a KeyError). Inline, not a helper: a call less on every restore.
    if swap.targets is None and not plan.repeated and not plan.by_entry:
        # builtin calls: C loops in eager, and traced calls that Dynamo runs without stepping
        # (fcall/README.md); the writes as in _write
        write = dict.__setitem__ if plan.traced else setitem
        current: Sequence[Any] = tuple(map(dict.get, plan.slots, plan.slot_names, repeat(GONE)))
        tuple(map(write, plan.slots, plan.slot_names, swap.old))
        changed = False in tuple(map(is_, current, swap.new))
    else:
        current, changed = _restore_by_entry(swap)
    for order in swap.orders:  # a value that left a dict comes back in its place
        move_to_end(order.slot, [key for key in order.keys if key in order.slot])
    for rnn in plan.rnns:
        # arg-type: a dead reference (the RNN dropped during the swap) fails here, as always.
        # Not typing.cast: traced, Dynamo would rebuild the module it folds the cast through.
        _reset_rnn_flat_weights(rnn())  # type: ignore[arg-type]
    if swap.reorder_in is not None and (changed or _hooks):
        reregister_restored(plan, swap.reorder_in, changed)
    if plan.traced:
        settle_dicts((*plan.slots, *(swap.targets or ())))
    if changed:
        _write_back(swap, current)
        for now in current:  # `is`, not `GONE in current`: traced, `in` would compare
            if now is GONE:  # GONE with tensors
                _check_deleted_slots(plan, current)
                break
    return current


def _restore_by_entry(swap: Swap) -> tuple[list[Any], bool]:
    """``restore``'s loop where a value changed dict, a slot is named twice, or (traced on
    torch 2.11) an attribute's ``__dict__`` is written a key at a time: what each slot held,
    and whether any held another value than the swap put there."""
    plan = swap.plan
    held: list[Any] = []
    changed = swap.targets is not None  # a value changed dict
    for index, target, slot, name, old, new in zip(
        count(), swap.targets or repeat(None), plan.slots, plan.slot_names, swap.old, swap.new
    ):
        now = (slot if target is None else target).get(name, GONE)
        held.append(now)
        if now is not new:  # forward reassigned it (a buffer), or deleted it
            changed = True
        if target is None:
            pass
        elif not MODULE_DICT_TRACED and plan.traced and plan.kinds[index] is PARAMETER:
            _leave_attributes(swap, index, target)  # a Parameter slot's only target
        else:
            target.pop(name, None)
        slot[name] = old
    if plan.repeated:  # a slot two entries name was read again after its restore
        for index, first in plan.repeated.items():
            held[index] = held[first]
        changed = swap.targets is not None or any(a is not b for a, b in zip(held, swap.new))
    if plan.traced and swap.targets is not None:  # a value left a module's __dict__
        forget_added_attributes()  # before anything reads the module's attributes
    return held, changed


def _leave_attributes(swap: Swap, index: int, attributes: dict) -> None:
    """Traced, where Dynamo traces no ``pop`` on a module's ``__dict__``
    (``_compat.MODULE_DICT_TRACED``): the name of entry ``index`` leaves its owner's
    ``attributes`` by ``delattr`` on the owner (a traced plan's owners are the modules,
    ``bind.bind``), which removes from the ``__dict__`` a name that no slot dict holds. (On
    torch >= 2.12 Dynamo would replay that ``delattr`` after the graph as a deletion of the
    parameter the restore put back: there ``pop`` does it.)"""
    plan = swap.plan
    name = plan.slot_names[index]
    if name in attributes:  # not: forward deleted it, or registered the name elsewhere
        assert plan.owners_are_modules  # a traced plan's
        delattr(plan.owners[plan.owner_of_entry[index]], name)


def _check_deleted_slots(plan: Plan, current: Sequence[Any]) -> None:
    """The old value of a slot deleted in the block went back into its dict (as torch.func
    registers it again); a name that the block gave to something else raises."""
    taken = []
    for index in range(len(current)):
        if current[index] is GONE:
            name = plan.slot_names[index]
            if _taken_elsewhere(attributes_of(plan, index), plan.kinds[index], name):
                del plan.slots[index][name]  # not registered twice: the new owner stays
                taken.append(plan.names[index])
    if taken:
        raise RuntimeError(_errors.slot_taken_in_block(taken))


_OTHER_DICTS = {
    SlotKind.PARAMETER: ("_buffers", "_modules"),
    SlotKind.BUFFER: ("_parameters", "_modules"),
    SlotKind.ATTRIBUTE: ("_parameters", "_buffers", "_modules"),
}


def _taken_elsewhere(attributes: dict, kind: SlotKind, name: str) -> bool:
    """Whether another dict of the owner (``attributes``: its ``__dict__``) than the one
    of slot ``kind`` holds ``name``: told by kind, not by comparing dicts (Dynamo 2.11
    cannot trace ``is`` between two dicts)."""
    if name in attributes:  # a plain attribute now (pruning's recomputed weight)
        return True
    for other in _OTHER_DICTS[kind]:
        if name in attributes[other]:
            return True
    parametrizations = attributes["_modules"].get("parametrizations")
    return parametrizations is not None and name in parametrizations._modules


def reapply(swap: Swap, current: Sequence[Any]) -> None:
    """Undo ``restore(swap)``, which returned ``current``: the slots get ``current`` back,
    and the swap can be restored again."""
    # an exact undo's swap (to_module(old, m)): its restore kept the dicts' order, and so
    # does this (_fronts/to_module.py sets reorder_in to None before the restore)
    assert swap.reorder_in is None
    _write(swap, current, False)
    swap.new = list(current)
    swap.done = False


def _reset_rnn_flat_weights(rnn: nn.RNNBase) -> None:
    """RNN/GRU/LSTM ``forward`` re-points ``_flat_weights`` at the swapped-in tensors
    (``RNNBase._weights_have_changed``): point it back at the module's own, or the module
    keeps the params alive and Dynamo recompiles on the next param set."""
    rnn._init_flat_weights()


def _write_back(swap: Swap, current: Sequence[Any]) -> None:
    """A value that ``forward`` reassigned (a buffer, say) goes back into params."""
    repeated = swap.plan.repeated  # their slot is an earlier entry's
    leaves = swap.plan.leaves
    write_back(
        swap.leaves,
        [
            (leaves[i], current[i])
            for i in range(swap.plan.given)
            if current[i] is not swap.new[i] and current[i] is not GONE and i not in repeated
        ],
    )


def write_back(leaves: Leaves, changed: list[tuple[int, Any]]) -> None:
    """The one write-back into a params container: each ``(leaf index, value)`` of
    ``changed`` where that leaf of ``leaves`` lives (``Leaves.holders``)."""
    if not changed:
        return
    holders = leaves.holders()
    for leaf, value in changed:
        container, key = holders[leaf]
        container[key] = value


def _targets(plan: Plan, new: list, mode: Mode) -> list[dict | None] | None:
    """Per entry, the dict its value goes into where that is not its slot's (else
    ``None``); ``None`` if every value stays in its slot's dict."""
    targets = [
        _target_slot(kind, attributes_of(plan, index), value, mode)
        for index, kind, value in zip(range(len(new)), plan.kinds, new)
    ]
    if all(target is None for target in targets):
        return None
    return targets


def _target_slot(kind: SlotKind, attributes: dict, value: Any, mode: Mode) -> dict | None:
    """Told by the slot's kind, not by comparing dicts (Dynamo 2.11 cannot trace ``is``
    between two dicts): ``attributes`` is the owner's ``__dict__``, an attribute's slot."""
    is_parameter = isinstance(value, nn.Parameter)
    if mode is REPLACE:
        if is_parameter:
            return None if kind is PARAMETER else attributes["_parameters"]
        return attributes if kind is PARAMETER else None
    if kind is ATTRIBUTE and is_parameter:
        return attributes["_parameters"]
    return None
