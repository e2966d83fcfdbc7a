"""The TensorDict returned by ``to_module`` restores the module when used in ``with``.

tensordict already turns some of its methods into context managers: the
returned TensorDict carries ``_last_op = (name, (args, kwargs, ref))`` and its
``__exit__`` calls ``LAST_OP_MAPS[name]``. fcall registers its own op name there,
so that a plain ``TensorDict`` (or the user's ``swap_dest``) restores the module
through fcall's exact ``restore``, and adds the name to the ops that are undone
when the block raises. No TensorDict subclass is needed, which keeps Dynamo on
the TensorDict paths it already traces (in eager, fcall's own ``OldValues`` takes
a shorter path to the same dispatch: ``_flatten.OldValues.__exit__``).
"""

from __future__ import annotations

from typing import Any, TypeGuard

from tensordict import TensorDict, TensorDictBase

from .._compat import register_exit_op
from .._core.engine import PRESERVE, REPLACE, Swap, reapply, restore

OP_NAME = "_fcall_to_module"  # the record of a swap: restored on exit
REDO_OP_NAME = "_fcall_to_module_redo"  # the record of an exact undo: the swap back on exit
RECORD = "_fcall_swap"  # (swap, module) of the swap a TensorDict undoes, see undone_by


def _restore_on_exit(td: Any, args: tuple, kwargs: dict, prev: Any) -> None:
    swap, _ = args
    restore(swap)


def _reapply_on_exit(td: Any, args: tuple, kwargs: dict, prev: Any) -> None:
    swap, current = args
    reapply(swap, current)


def undone_by(params: Any, module: Any, traced: bool = False) -> Swap | None:
    """The swap that ``to_module(params, module)`` exactly undoes, if any.

    ``params`` is the TensorDict an earlier ``to_module(p, module)`` returned (or
    filled as ``swap_dest``), not yet restored, and still holding the very objects it
    was returned with. Restoring through the record puts every name back in its dict
    and in its place, which a generic swap cannot do for a parameter that a
    ``preserve_module_state=False`` swap had turned into a plain attribute.

    ``traced`` (Dynamo is tracing): ``_last_op`` is never read. On a TensorDict that
    comes into the compiled function, that read makes Dynamo guard that ``_last_op``
    stays out of the object's ``__dict__`` (TensorDictBase has a class-level ``None``),
    and tensordict's ``clear_refs_for_compile_()`` breaks the guard by writing
    ``_last_op = None`` there: one recompile, in every TorchRL loss (it calls it after
    each step). fcall's own key ``RECORD`` is read instead, from exact TensorDicts
    (and ``OldValues``) only: nothing but fcall writes it, so its guard holds, and a
    TensorDictParams is not asked at all.
    """
    if traced:
        record = params.__dict__.get(RECORD) if isinstance(params, TensorDict) else None
    else:
        last_op = getattr(params, "_last_op", None) if isinstance(params, TensorDictBase) else None
        record = last_op[1][0] if records_a_swap(last_op) else None
    if record is None:
        return None
    swap, owner = record
    if owner is not module or swap.done or swap.mode not in (PRESERVE, REPLACE):
        return None
    return swap


def records_a_swap(last_op: Any) -> TypeGuard[tuple[str, tuple[Any, ...]]]:
    """Whether a TensorDict's ``_last_op`` is the record of an fcall swap (``attach``)."""
    return bool(last_op) and last_op[0] == OP_NAME


def _no_previous() -> None:
    return None


def _keep_refs() -> None:
    return None


def attach(out: Any, swap: Swap, module: Any) -> None:
    """``out`` restores ``swap`` on exit of a ``with`` block."""
    _record(out, OP_NAME, (swap, module))
    out.__dict__[RECORD] = (swap, module)  # what undone_by reads while tracing


def attach_redo(out: Any, swap: Swap, current: list[Any]) -> None:
    """``out``, returned by ``to_module(old, module)`` that undid ``swap`` (which left
    ``current`` in the slots), puts the swap back in on exit of a ``with`` block, as
    tensordict's ``to_module`` swaps back the values it took out."""
    _record(out, REDO_OP_NAME, (swap, current))


def _record(out: Any, op_name: str, args: tuple) -> None:
    out._last_op = (op_name, (args, {}, _no_previous))
    # Under Dynamo, TensorDict.__exit__ first calls clear_refs_for_compile_(),
    # which calls type() on every leaf; on a Parameter created in the graph (a
    # nested to_module wraps values in Parameters) that crashes the guard
    # builder (NameError: SYNTHETIC_LOCAL). The refs it clears are weakrefs that
    # fcall never records, so the call is skipped for this TensorDict.
    out.clear_refs_for_compile_ = _keep_refs


register_exit_op(OP_NAME, _restore_on_exit)
register_exit_op(REDO_OP_NAME, _reapply_on_exit)
