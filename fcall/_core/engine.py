"""Apply a plan: write the new values into the module's slots, and undo it exactly.

A swap runs in two steps so that the module is never left half-swapped:
``prepare`` reads the old values, decides what each slot receives (and checks
in-place copies): anything that can fail fails there. ``commit`` writes, in one loop
(``_write``). ``restore`` puts back the very objects that were there, in their slots and
in their order, in one loop, and writes a buffer that ``forward`` reassigned back into
the params container. For ``to_module``,
commit and restore then give the dicts tensordict's order (``fcall/_registration.py``).

The modes (``Mode`` in ``fcall/_kinds.py``): ``AS_IS`` for ``swap`` /
``functional_call``; ``PRESERVE``, ``REPLACE`` and ``INPLACE`` for ``to_module``;
``SHARDED`` for FSDP2 trees, whose writes a ``Strategy`` makes.
"""

from __future__ import annotations

from itertools import repeat
from operator import is_
from typing import Any, Protocol

from torch import nn

from .. import _errors
from .flatten import Leaves
from .inplace import check_inplace, copy_inplace
from .plan import Plan, attributes_of, read_slots
from .registration import reregister, reregister_restored, run_hooks
from .slot_values import registered_values
from .types import Entry, Mode, SlotKind

AS_IS, PRESERVE, REPLACE, INPLACE = Mode.AS_IS, Mode.PRESERVE, Mode.REPLACE, Mode.INPLACE


class _Gone:
    """What restore reports for a slot that the block deleted (``del m.weight``)."""

    def __repr__(self) -> str:
        return "<deleted in the block>"


GONE = _Gone()


class Strategy(Protocol):
    """How a swap that is not a loop of slot writes is made and undone (FSDP2's sharded
    parameters, ``fcall/_distributed.py``): ``commit`` and ``restore`` hand it the swap."""

    def commit(self, swap: Swap) -> None: ...

    def restore(self, swap: Swap) -> None: ...


class Swap:
    """One applied swap, with what it takes to undo it."""

    __slots__ = (
        "done",
        "leaves",
        "mode",
        "new",
        "non_blocking",
        "old",
        "orders",
        "plan",
        "reorder_in",
        "strategy",
        "targets",
    )

    def __init__(self, plan: Plan, mode: Mode, leaves: Leaves, non_blocking: bool) -> None:
        self.plan = plan
        self.mode = mode
        self.leaves = leaves
        self.non_blocking = non_blocking
        self.old: list[Any] = []
        self.new: list[Any] = []
        # per entry, only when a value changes dict (sharded, fcall/_distributed.py: the
        # tensor each value is copied into)
        self.targets: list[Any] | None = None
        # (dict, its key order) of each dict a value left (sharded: the FSDP modules)
        self.orders: list[Any] = []
        self.done = False  # restored already: a second restore must not undo later swaps
        self.strategy: Strategy | None = None  # set by _distributed for FSDP2 trees
        # to_module's swaps: the module whose dicts get tensordict's registration order,
        # on commit and on restore (fcall/_registration.py); None: the order is kept
        self.reorder_in: nn.Module | None = None

    def old_given(self) -> list[Any]:
        return self.old[: self.plan.given]


def prepare(plan: Plan, leaves: Leaves, mode: Mode, api: str, non_blocking: bool) -> Swap:
    """Read the old values and decide what each slot receives; nothing is written.
    ``StalePlan`` if a cached plan names a slot that is gone."""
    swap = Swap(plan, mode, leaves, non_blocking)
    values = leaves.values
    if mode is INPLACE:
        swap.old = check_inplace(plan, values, api)
        swap.new = [values[entry.leaf] for entry in plan.entries[: plan.given]]
        return swap
    # Traced, `slot[name]` is Dynamo's unread (lazy) entry of the module's dict: the old
    # tensor is neither a graph input nor guarded, and restore writes that same entry back,
    # so the dict is left as Dynamo found it and nothing is replayed after the call
    # (fcall/README.md, where the code bends to Dynamo).
    swap.old = read_slots(plan)
    if mode is PRESERVE:
        swap.new = registered_values(plan, values, swap.old)
    elif plan.direct:
        swap.new = values
    else:
        swap.new = [values[entry.leaf] for entry in plan.entries]
    if mode is REPLACE or plan.has_attributes:
        swap.targets = _targets(plan, swap.new, mode)
    return swap


def commit(swap: Swap) -> None:
    if swap.strategy is not None:  # FSDP2 modules, see fcall/_distributed.py
        return swap.strategy.commit(swap)
    if swap.mode is INPLACE:
        copy_inplace(swap.plan, swap.new, swap.non_blocking)
    else:
        if swap.targets is not None:
            swap.orders = [(slot, list(slot)) for slot in _dicts_left(swap.plan, swap.targets)]
        _write(swap.plan, swap.new, swap.targets, _to_end(swap))
    if swap.reorder_in is not None:
        _reregister(swap, swap.reorder_in, swap.new)


def _dicts_left(plan: Plan, targets: list[dict]) -> list[dict]:
    """Each slot dict that some value leaves for another dict, once."""
    moving = [e.slot for e, target in zip(plan.entries, targets) if target is not e.slot]
    if not plan.traced:
        return list({id(slot): slot for slot in moving}.values())
    # Traced: `id()` of a module's dict guards on that object (another instance of the
    # architecture would recompile); identity comparisons do not.
    left: list[dict] = []
    for slot in moving:
        if not any(slot is seen for seen in left):
            left.append(slot)
    return left


def _to_end(swap: Swap) -> bool:
    """Whether the writes give tensordict's registration order themselves: an eager
    ``to_module`` that is no in-place copy, whose slots are each named once
    (fcall/_registration.py)."""
    plan = swap.plan
    return (
        swap.reorder_in is not None
        and swap.mode is not INPLACE
        and not plan.traced
        and not plan.repeated
    )


def _reregister(swap: Swap, module: nn.Module, new: list[Any]) -> None:
    """tensordict's registration order and hooks after ``swap``'s writes of ``new``."""
    if _to_end(swap):  # the writes gave the order
        run_hooks(swap.plan, module, swap.targets, range(len(swap.plan.entries)), new)
    else:
        reregister(swap.plan, module, swap.targets, new)


def _write(plan: Plan, values: list[Any], targets: list[dict] | None, to_end: bool) -> None:
    """The one write loop: each value into its slot (``targets``: the dict each value goes
    into, when some value changes dict; a value that moves leaves its slot's dict).
    ``to_end``: every name written goes to the end of its dict, in order, as tensordict's
    ``del d[name]; d[name] = value`` puts it. Traced, with no value changing dict, the
    writes are one builtin call that Dynamo runs without stepping (fcall/README.md)."""
    if plan.traced and targets is None and not to_end:
        list(map(dict.__setitem__, plan.slots, plan.slot_names, values))
        return
    for target, (slot, name), value in zip(targets or plan.slots, plan.pairs, values):
        if to_end or target is not slot:
            # pop, not del: a slot reached by two paths is moved once
            slot.pop(name, None)
        target[name] = value


def restore(swap: Swap) -> list[Any]:
    """Undo ``swap``; returns what the slots held just before (the given entries first)."""
    if swap.done:
        return []
    swap.done = True
    if swap.strategy is not None:  # FSDP2 modules, see fcall/_distributed.py
        swap.strategy.restore(swap)
        return []
    plan = swap.plan
    if swap.mode is INPLACE:
        copy_inplace(plan, swap.old, swap.non_blocking)
        if swap.reorder_in is not None:  # copies: every slot holds what it held
            reregister_restored(plan, swap.reorder_in, False)
        return []
    # The one restore loop: the very same objects back into their slots (a value that
    # moved leaves the dict it went into; a slot deleted in the block is registered
    # again), and what each slot held. `get`: a deleted slot is GONE (traced, a missing
    # key in `d[name]` is a graph break, not a KeyError).
    current, changed = _put_back(swap)
    if plan.repeated:  # a slot two entries name was read again after its restore
        for index, first in plan.repeated.items():
            current[index] = current[first]
        changed = swap.targets is not None or any(a is not b for a, b in zip(current, swap.new))
    for slot, order in swap.orders:  # a value that left a dict comes back in its place
        for key in order:
            if key in slot:
                slot[key] = slot.pop(key)
    for rnn in plan.rnns:
        # arg-type: a dead reference (the RNN dropped during the swap) fails here, as always.
        # Not typing.cast: traced, Dynamo would rebuild the module it folds the cast through.
        _reset_rnn_flat_weights(rnn())  # type: ignore[arg-type]
    if swap.reorder_in is not None:
        reregister_restored(plan, swap.reorder_in, changed)
    if changed:
        _write_back(swap, current)
        for now in current:  # `is`, not `GONE in current`: traced on torch 2.12, that
            if now is GONE:  # compares GONE with tensors, which Dynamo cannot
                _check_deleted_slots(plan, current)
                break
    return current


def _put_back(swap: Swap) -> tuple[list[Any], bool]:
    """The one restore loop: the old objects into their slots; what each slot held, and
    whether any held another value than the swap put there."""
    plan = swap.plan
    if plan.traced and swap.targets is None and not plan.repeated:
        # builtin calls that Dynamo runs without stepping (fcall/README.md)
        current = list(map(dict.get, plan.slots, plan.slot_names, repeat(GONE)))
        list(map(dict.__setitem__, plan.slots, plan.slot_names, swap.old))
        return current, False in list(map(is_, current, swap.new))
    current = []
    changed = swap.targets is not None  # some slot holds another value than the swap put
    for target, (slot, name), old, new in zip(
        swap.targets or plan.slots, plan.pairs, swap.old, swap.new
    ):
        now = target.get(name, GONE)
        current.append(now)
        if now is not new:  # forward reassigned it (a buffer), or deleted it
            changed = True
        if target is not slot:
            target.pop(name, None)
        slot[name] = old
    return current, changed


def _check_deleted_slots(plan: Plan, current: list[Any]) -> None:
    """The old value of a slot deleted in the block went back into its dict (as torch.func
    registers it again); a name that the block gave to something else raises."""
    taken = []
    for index in range(len(current)):
        if current[index] is GONE:
            slot, name, _, _, _ = plan.entries[index]
            if _taken_elsewhere(attributes_of(plan, index), slot, name):
                del slot[name]  # not registered twice: the block's new owner of the name stays
                taken.append(plan.names[index])
    if taken:
        raise RuntimeError(_errors.slot_taken_in_block(taken))


def _taken_elsewhere(attributes: dict, slot: dict, name: str) -> bool:
    if name in attributes:  # a plain attribute now (pruning's recomputed weight)
        return True
    for other in ("_parameters", "_buffers", "_modules"):
        if attributes[other] is not slot and name in attributes[other]:
            return True
    parametrizations = attributes["_modules"].get("parametrizations")
    return parametrizations is not None and name in parametrizations._modules


def reapply(swap: Swap, current: list[Any]) -> None:
    """Undo ``restore(swap)``, which returned ``current``: the slots get ``current`` back,
    and the swap can be restored again."""
    _write(swap.plan, current, swap.targets, _to_end(swap))
    swap.new = current
    if swap.reorder_in is not None:
        _reregister(swap, swap.reorder_in, current)
    swap.done = False


def _reset_rnn_flat_weights(rnn: nn.RNNBase) -> None:
    """RNN/GRU/LSTM ``forward`` re-points ``_flat_weights`` at the swapped-in tensors
    (``RNNBase._weights_have_changed``): point it back at the module's own, or the module
    keeps the params alive and Dynamo recompiles on the next param set."""
    rnn._init_flat_weights()


def _write_back(swap: Swap, current: list[Any]) -> None:
    """A value that ``forward`` reassigned (a buffer, say) goes back into params."""
    holders = None
    repeated = swap.plan.repeated  # their slot is an earlier entry's
    for i in range(swap.plan.given):
        if current[i] is not swap.new[i] and current[i] is not GONE and i not in repeated:
            if holders is None:
                holders = swap.leaves.holders()
            container, key = holders[swap.plan.entries[i].leaf]
            container[key] = current[i]


def _targets(plan: Plan, new: list, mode: Mode) -> list[dict] | None:
    targets = [
        _target_slot(entry, attributes_of(plan, index), value, mode)
        for index, entry, value in zip(range(len(new)), plan.entries, new)
    ]
    if all(target is entry.slot for target, entry in zip(targets, plan.entries)):
        return None
    return targets


def _target_slot(entry: Entry, attributes: dict, value: Any, mode: Mode) -> dict:
    is_parameter = isinstance(value, nn.Parameter)
    if mode is REPLACE:
        if is_parameter:
            return attributes["_parameters"]
        return attributes if entry.kind is not SlotKind.BUFFER else entry.slot
    if entry.kind is SlotKind.ATTRIBUTE and is_parameter:
        return attributes["_parameters"]
    return entry.slot
