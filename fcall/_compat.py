"""What differs between the torch and tensordict releases fcall supports.

Supported: torch 2.11-2.15 and tensordict 0.14.3-0.15.x (``noxfile.py`` runs the
matrix). Every version check lives here (a version compared, a feature probed), each
with the versions it names, so that the rest of fcall is written against one behaviour:
tensordict 0.15.3's. Elsewhere, code whose form one version requires works on every version
and says in a comment which version needs that form (Dynamo 2.11's limits, mostly).

* ``register_exit_op``: tensordict >= 0.15 undoes the ops named in
  ``tensordict.base._UNDO_ON_ERROR_OPS`` when a ``with`` block raises
  (``to_module`` restores the module). tensordict 0.14.3 has no such set: its
  ``TensorDictBase.__exit__`` returns ``False`` on an exception without undoing
  anything (and leaves the op on the queue). fcall's own ``OldValues`` (what an
  eager ``to_module`` returns) undoes fcall's ops on an exception on every version;
  a plain TensorDict (``swap_dest=``, or one returned while compiling) behaves as
  its tensordict's ``__exit__`` does: on 0.14 a block that raises is not undone,
  as with tensordict 0.14's own ``to_module``. fcall does not replace tensordict's
  ``__exit__`` (``docs/versions.md``).
* ``BufferLegacy``: the buffer class that keeps the autograd history of the tensor it
  marks, ``tensordict.utils._BufferLegacy`` in 0.15, ``tensordict.utils.BufferLegacy``
  in 0.14.
* ``validate_value``: ``TensorDictBase._validate_value`` takes the key (for its error
  message) in 0.15, not in 0.14.
* ``comptime``, ``local_items``, ``real_object``, ``has_pending_mutations``,
  ``inside_higher_order_op``, ``tensor_facts``: the Dynamo internals the traced front
  (``fcall/_core/traced.py``) reads at trace time, the same in torch 2.11-2.15:
  ``torch._dynamo.comptime``, a ``ComptimeVar``'s VariableTracker (a tuple's ``items``), its
  real ``value`` or a traced tensor's type and ``requires_grad``, the
  side-effect tracker's pending mutations of objects that existed before the trace, and
  whether the tracer is a higher-order op's (``vmap``).
* ``hold_dicts``, ``settle_dicts``: the same tracker's record of a dict that existed before
  the trace (``ConstDictVariable.items``, ``mutation_type.is_modified``, read by
  ``SideEffects.is_modified``), the same in torch 2.11-2.15: a swapped dict that ends the
  trace as it began is marked unchanged, so Dynamo replays nothing into it after the graph.
* ``MODULE_DICT_TRACED``: torch < 2.12 traces a module's ``__dict__`` a key at a time (no
  iteration, ``pop`` or ``del``): a traced ``to_module`` leaves a plain tensor attribute in its
  place where eager moves it last (``registration._groups``).
* ``SKIPPED_TENSOR_GUARDS``: torch < 2.12 skips the guards on a module's tensors while the
  module's dicts are unchanged (pytorch/pytorch#139476): where ``to_module`` decides on an
  old tensor's ``requires_grad``, fcall gives that tensor a guard that cannot be skipped.
* ``forget_added_attributes``: torch < 2.13 replays a module attribute that the trace added
  to the module's ``__dict__`` and deleted again (``to_module(preserve_module_state=False)``
  and its undo) as ``del module.name``, which ``nn.Module.__delattr__`` turns into deleting
  the parameter of that name. torch >= 2.13 drops such an add/delete pair
  (``AttrMutationKind.INSTANCE_DICT``); on older torch fcall drops it from the tracker.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import tensordict.base as _td_base
import torch
from tensordict import TensorDictBase
from tensordict._contextlib import LAST_OP_MAPS
from torch import nn
from torch._dynamo.comptime import comptime
from torch._dynamo.variables import base as _dynamo_variables

__all__ = [
    "BufferLegacy",
    "comptime",
    "local_items",
    "real_object",
    "has_pending_mutations",
    "forget_added_attributes",
    "MODULE_DICT_TRACED",
    "SKIPPED_TENSOR_GUARDS",
    "UNSKIPPABLE_ATTRIBUTE",
    "hold_dicts",
    "settle_dicts",
    "inside_higher_order_op",
    "tensor_facts",
    "FCALL_OPS",
    "register_exit_op",
    "validate_value",
]

try:  # tensordict >= 0.15
    from tensordict.utils import _BufferLegacy as BufferLegacy
except ImportError:  # tensordict 0.14.x
    from tensordict.utils import BufferLegacy  # type: ignore[no-redef]

# tensordict >= 0.15: _validate_value(..., key=) names the key in its errors.
_VALIDATE_TAKES_KEY = "key" in inspect.signature(TensorDictBase._validate_value_generic).parameters


def validate_value(td: TensorDictBase, value: Any, key: str) -> Any:
    """``value`` as ``td`` would store it at ``key`` (device, batch size checked)."""
    if _VALIDATE_TAKES_KEY:
        return td._validate_value(value, check_shape=True, key=key)
    return td._validate_value(value, check_shape=True)


# tensordict >= 0.15: the ops that TensorDict.__exit__ undoes when the block raises.
_TD_UNDOES_ON_ERROR = hasattr(_td_base, "_UNDO_ON_ERROR_OPS")
FCALL_OPS: set[str] = set()  # fcall's own, each undone on exit and on error


def register_exit_op(name: str, inverse: Callable[[Any, tuple, dict, Any], Any]) -> None:
    """Make ``name`` a ``_last_op`` that a TensorDict's ``__exit__`` undoes with
    ``inverse``, when the block ends and when it raises, on every tensordict."""
    LAST_OP_MAPS[name] = inverse
    FCALL_OPS.add(name)
    if _TD_UNDOES_ON_ERROR:
        _td_base._UNDO_ON_ERROR_OPS = frozenset(_td_base._UNDO_ON_ERROR_OPS | {name})


def no_previous() -> None:
    """The ``ref`` of an fcall op's ``_last_op = (name, (args, kwargs, ref))``: tensordict's
    ``__exit__`` calls it for the previous value, which fcall's exit ops do not take
    (``flatten.OldValues.__exit__`` skips the call)."""
    return None


def local_items(ctx: Any, name: str) -> dict[str, Any]:
    """At trace time (a ``comptime`` callback): the items of the caller's local ``name``, a
    tuple built in the trace, by the names in its own first item (a tuple of strings)."""
    from torch._dynamo.variables.lazy import LazyVariableTracker

    var = ctx.get_local(name)._i_will_not_complain_if_bc_breaks_VariableTracker()
    if isinstance(var, LazyVariableTracker):
        var = var.realize()
    names, *items = var.items
    return dict(zip(names.as_python_constant(), items))


def real_object(var: Any) -> Any:
    """At trace time: the real object behind Dynamo's variable ``var``, or ``None`` if Dynamo
    has none (an object made in the trace)."""
    from torch._dynamo.variables.lazy import LazyVariableTracker

    if isinstance(var, LazyVariableTracker):
        var = var.realize()
    if getattr(var, "source", None) is None:
        return None
    return getattr(var, "value", None)


def has_pending_mutations(ctx: Any) -> bool:
    """At trace time: whether the trace so far changed an object that existed before it
    (a module's dicts, a TensorDict's entries): their real state is then not the traced one."""
    from torch._dynamo.variables.base import (
        AttributeMutationExisting,
        ValueMutationExisting,
    )

    tx = ctx._i_will_not_complain_if_bc_breaks_InstructionTranslator()
    effects = tx.output.side_effects
    existing = (AttributeMutationExisting, ValueMutationExisting)
    return any(
        isinstance(var.mutation_type, existing) and effects.is_modified(var)
        for var in effects.id_to_variable.values()
    )


def inside_higher_order_op(ctx: Any) -> bool:
    """At trace time: whether Dynamo traces the body of a higher-order op (``vmap``)."""
    tx = ctx._i_will_not_complain_if_bc_breaks_InstructionTranslator()
    return tx.output.current_tracer.parent is not None


_Facts = TypeVar("_Facts")


def tensor_facts(
    var: Any, positions: tuple[int, ...], facts: Callable[[bool, bool], _Facts]
) -> list[_Facts] | None:
    """At trace time: for the items at ``positions`` of Dynamo's list variable ``var``,
    ``facts(is_parameter, requires_grad)`` as Dynamo traces each; ``None`` if one is not a
    traced tensor."""
    from torch import nn
    from torch._dynamo.variables.lazy import LazyVariableTracker
    from torch._dynamo.variables.tensor import TensorVariable

    if isinstance(var, LazyVariableTracker):
        var = var.realize()
    items = var.items
    found = []
    for position in positions:
        var = items[position]
        if isinstance(var, LazyVariableTracker):
            var = var.realize()
        if not isinstance(var, TensorVariable):
            return None
        found.append(facts(issubclass(var.python_type(), nn.Parameter), bool(var.requires_grad)))
    return found


# --- a swapped dict that ends as it began is not replayed ----------------------------------
# Dynamo replays after the graph every dict that existed before the trace and was changed in
# it (``clear(); update(...)``), even if the trace undid the change: one write per leaf per
# call for a module reached as a global (pytorch/pytorch#133487). ``hold_dicts`` records, as
# a swap commits, each dict it writes; ``settle_dicts``, after the restore, marks unchanged
# each one that holds exactly what it held (keys in order, the very same value variables)
# and that the trace had not changed before the swap. Anything else ``forward`` did to a
# dict (a buffer reassigned, a key added or deleted) leaves it changed, and replayed.


def _dict_variables(ctx: Any, name: str) -> list[Any]:
    """At trace time: the distinct dict variables of the caller's sequence ``name``."""
    from torch._dynamo.variables.dicts import ConstDictVariable
    from torch._dynamo.variables.lazy import LazyVariableTracker

    found: list[Any] = []
    try:
        var = ctx.get_local(name)._i_will_not_complain_if_bc_breaks_VariableTracker()
    except KeyError:  # not in the frame's state: nothing held or settled, Dynamo replays
        return found
    if isinstance(var, LazyVariableTracker):
        var = var.realize()
    for item in getattr(var, "items", ()):
        if isinstance(item, LazyVariableTracker):
            item = item.realize()
        if isinstance(item, ConstDictVariable) and not any(item is seen for seen in found):
            found.append(item)
    return found


def _items_of(var: Any) -> list[tuple[Any, Any]]:
    return [(key.vt.as_python_constant(), value) for key, value in var.items.items()]


def _unwrapped(value: Any) -> Any:
    """A lazy variable that was read is the variable reading it made (what a restore
    writes back); an unread one is itself."""
    from torch._dynamo.variables.lazy import LazyVariableTracker

    return value.unwrap() if isinstance(value, LazyVariableTracker) else value


def _held(ctx: Any) -> tuple[Any, dict[int, list[tuple[Any, list, bool]]]]:
    """The side-effect tracker of this trace, and the records ``hold_dicts`` left on it
    (they go with it: a trace restarted or abandoned starts with none)."""
    tx = ctx._i_will_not_complain_if_bc_breaks_InstructionTranslator()
    effects = tx.output.side_effects
    return effects, effects.__dict__.setdefault("_fcall_held", {})


def hold_dicts(dicts: tuple[dict, ...]) -> None:
    """Traced, before a swap writes ``dicts``: each one's items, and whether the trace had
    changed it already (``settle_dicts`` reads them)."""
    comptime(_hold)  # reads `dicts`
    _keep_local(dicts)


def settle_dicts(dicts: tuple[dict, ...]) -> None:
    """Traced, after a swap's restore: each of ``dicts`` that holds what ``hold_dicts``
    saw, and that the trace had not changed then, is marked unchanged."""
    comptime(_settle)  # reads `dicts`
    _keep_local(dicts)


def _keep_local(value: Any) -> None:
    """Called with a local that a ``comptime`` callback reads, after the ``comptime`` call,
    so that the local is live there: Dynamo 2.14 drops from its frame state, in some frames
    (an exception's ``__exit__``), the locals that no later code reads."""


def _hold(ctx: Any) -> None:
    effects, held = _held(ctx)
    for var in _dict_variables(ctx, "dicts"):
        held.setdefault(id(var), []).append((var, _items_of(var), effects.is_modified(var)))


def _settle(ctx: Any) -> None:
    _, held = _held(ctx)
    for var in _dict_variables(ctx, "dicts"):
        records = held.get(id(var))
        if not records:  # held in another trace, or not by this swap
            continue
        _, before, changed_before = records.pop()
        now = _items_of(var)
        same = len(now) == len(before) and all(
            key == key_then and _unwrapped(value) is _unwrapped(value_then)
            for (key, value), (key_then, value_then) in zip(now, before)
        )
        if same and not changed_before:
            var.mutation_type.is_modified = False


# --- torch < 2.12: a module's __dict__ is traced a key at a time ---------------------------
# Dynamo 2.11 traces ``k in d``, ``d[k]``, ``d.get(k)`` and ``d[k] = v`` on a module's
# ``__dict__`` (a ``GetAttrVariable``), nothing else: no iteration, ``pop``, ``del`` or
# ``dict.__getitem__(d, k)``. There, traced, fcall reads and writes an attribute's slot one
# entry at a time (``engine._write``, ``engine.restore``, ``plan.read_slots``), takes a name
# out of a ``__dict__`` by ``delattr`` on its owner (``engine._leave_attributes``; on torch
# >= 2.12 Dynamo would replay that ``delattr`` as a deletion of the parameter the restore put
# back), and leaves a plain tensor attribute in its place in the ``__dict__`` where eager
# moves it last (``registration._groups``).
MODULE_DICT_TRACED = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 12)


# --- torch < 2.12: a module's tensors' guards are skipped while its dicts are unchanged -----
# Dynamo 2.11 (``use_recursive_dict_tags_for_guards``, on by default there only;
# pytorch/pytorch#139476) skips every guard under a module whose dicts' version tags are
# unchanged since the last call, the guards on its tensors' ``requires_grad`` included: a flag
# flipped in place recompiles nothing. A tensor guard is skipped only where the tensor has no
# guard of its own below it (``GuardBuilder.find_tag_safe_roots``); a traced read of an
# attribute that every tensor has and that never changes (``__torch_function__``, one
# ``ID_MATCH``) gives it one. ``to_module``'s PRESERVE rule reads the old tensors'
# ``requires_grad`` (``traced._preserved``); there, on 2.11, each one read gets that guard.
SKIPPED_TENSOR_GUARDS = not MODULE_DICT_TRACED
UNSKIPPABLE_ATTRIBUTE = "__torch_function__"


# --- torch < 2.13: a module attribute added and deleted in the trace is not replayed -------
_ADDED_ATTRIBUTES_REPLAYED = not hasattr(_dynamo_variables, "AttrMutationKind")


def forget_added_attributes() -> None:
    """Traced, after a swap moved values into or out of a module's ``__dict__``: on torch
    < 2.13, each module attribute the trace deleted that the real module's ``__dict__`` does
    not hold is no change (an add/delete pair), and is dropped from Dynamo's tracker."""
    if _ADDED_ATTRIBUTES_REPLAYED:
        comptime(_forget_added)


def _forget_added(ctx: Any) -> None:
    from torch._dynamo.variables import DeletedVariable

    tx = ctx._i_will_not_complain_if_bc_breaks_InstructionTranslator()
    for var, changes in tx.output.side_effects.store_attr_mutations.items():
        module = getattr(var, "value", None)
        if not isinstance(module, nn.Module):
            continue
        for name, value in list(changes.items()):
            if isinstance(value, DeletedVariable) and name not in module.__dict__:
                del changes[name]
