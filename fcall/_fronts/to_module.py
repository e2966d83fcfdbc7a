"""``fcall.to_module``: tensordict's ``to_module``, every keyword, compile-clean; and the
TensorDict it returns, which restores the module when used in ``with``.

tensordict turns some of its methods into context managers: the returned TensorDict
carries ``_last_op = (name, (args, kwargs, ref))`` and its ``__exit__`` calls
``LAST_OP_MAPS[name]``. fcall registers its own op names there (``_compat.register_exit_op``),
so that a plain ``TensorDict`` (or the user's ``swap_dest``) restores the module through
fcall's exact ``restore``, and adds them to the ops that are undone when the block raises. No
TensorDict subclass is needed, which keeps Dynamo on the TensorDict paths it already traces
(in eager, fcall's own ``OldValues`` takes a shorter path to the same dispatch:
``flatten.OldValues.__exit__``). ``to_module(old, module)`` while that swap is in is its exact
undo (``_exact_inverse``, recognised by the very objects).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, overload

from tensordict import TensorDict, TensorDictBase
from torch import nn

from .. import _errors
from .._compat import no_previous, register_exit_op
from .._core.engine import commit, prepare, reapply, restore
from .._core.flatten import Leaves, flatten, old_tensordict
from .._core.plan import forget, resolve
from .._core.registration import reregister_as_given
from .._core.types import GONE, Mode, Plan, StalePlan, Swap
from .._errors import Fault
from . import tensordict_peer

Params = TensorDictBase | Mapping[str, Any]
AS_IS, PRESERVE, REPLACE, INPLACE = Mode.AS_IS, Mode.PRESERVE, Mode.REPLACE, Mode.INPLACE


# The type checker's view: with return_swap=True (the default) the result is a TensorDict, so
# `with fcall.to_module(params, module):` checks.
@overload
def to_module(
    params: Params,
    module: nn.Module,
    *,
    inplace: bool | None = None,
    return_swap: Literal[True] = True,
    swap_dest: TensorDictBase | None = None,
    use_state_dict: bool = False,
    non_blocking: bool = False,
    preserve_module_state: bool = True,
    memo: None = None,
) -> TensorDictBase: ...


@overload
def to_module(
    params: Params,
    module: nn.Module,
    *,
    inplace: bool | None = None,
    return_swap: bool,
    swap_dest: TensorDictBase | None = None,
    use_state_dict: bool = False,
    non_blocking: bool = False,
    preserve_module_state: bool = True,
    memo: None = None,
) -> TensorDictBase | None: ...


def to_module(
    params: Params,
    module: nn.Module,
    *,
    inplace: bool | None = None,
    return_swap: bool = True,
    swap_dest: TensorDictBase | None = None,
    use_state_dict: bool = False,
    non_blocking: bool = False,
    preserve_module_state: bool = True,
    memo: None = None,
) -> TensorDictBase | None:
    """Write ``params`` into the parameters and buffers of ``module``.

    tensordict's ``TensorDictBase.to_module`` with every keyword, traceable by
    ``torch.compile(fullgraph=True)`` without graph breaks or recompiles.

    Args:
        params: a TensorDict (nested keys), a TensorDictParams, or a dict (nested,
            or with flat ``"a.b.weight"`` keys). Keys name parameters and buffers as
            ``module.named_parameters()`` does; for a ``torch.compile``-d or
            DDP-wrapped module the ``_orig_mod.`` / ``module.`` prefix is optional.
            Keys that ``params`` lacks keep the module's own value (partial swap).
        module: the module to write into.
        inplace: copy the values into the module's own tensors, which keep their
            identity. ``None`` behaves like ``False``.
        return_swap: return the values the module held before the call.
        swap_dest: with ``return_swap``, a TensorDict to write the old values
            into and to return.
        use_state_dict: run the ``load_state_dict`` pre-hooks of the module and of
            its submodules once, on a flat state dict, before swapping.
        non_blocking: passed to the copies of ``inplace=True``. A swap without
            ``inplace`` copies nothing.
        preserve_module_state: parameters stay parameters with their
            ``requires_grad`` and buffers stay buffers. A value that requires grad
            or is batched by ``vmap`` goes into a parameter slot as it is, so
            gradients reach it. If ``False``, a plain tensor that replaces a
            parameter becomes a plain attribute (tensordict's historical
            behaviour).
        memo: no longer accepted: passing it raises ``RuntimeError``.

    Returns:
        A TensorDict of the old values (or ``swap_dest``), or ``None`` with
        ``return_swap=False``. The returned TensorDict is a context manager: on
        exit, normal or by exception, the module gets back the very objects it
        held, registered as before.

    Raises:
        KeyError: a key names no parameter or buffer; the message lists the
            nearest existing keys.
        TypeError: a value is not a tensor, or ``module`` is not an ``nn.Module``.
        RuntimeError: ``memo`` is given, or ``inplace`` with ``use_state_dict``.

    In every error case the module is left exactly as it was. When the module
    ties two names to one tensor and ``params`` gives only one, both names see
    the new value.

    Examples:
        >>> import torch
        >>> from torch import nn
        >>> import fcall
        >>> module = nn.Linear(3, 4)
        >>> zeros = fcall.from_module(module).detach().clone().zero_()
        >>> old = fcall.to_module(zeros, module)
        >>> bool((module.weight == 0).all()), isinstance(module.weight, nn.Parameter)
        (True, True)
        >>> _ = fcall.to_module(old, module)  # the very same Parameter objects come back
        >>> module.weight is old["weight"]
        True
        >>> with fcall.to_module(zeros, module):
        ...     y = module(torch.ones(2, 3))
        >>> bool((y == 0).all()), module.weight is old["weight"]
        (True, True)
    """
    api = "fcall.to_module"
    if memo is not None:
        raise RuntimeError(_errors.memo_given(api))
    if not isinstance(module, nn.Module):
        raise TypeError(_errors.not_a_module(api, module))
    if swap_dest is not None and not isinstance(swap_dest, TensorDictBase):
        raise TypeError(_errors.bad_swap_dest(api, swap_dest))
    if use_state_dict and inplace is not None:
        raise RuntimeError(_errors.inplace_with_state_dict(api))
    mode = INPLACE if inplace else PRESERVE if preserve_module_state else REPLACE
    try:  # the core's faults, worded once, outside the except clause
        if use_state_dict:
            params = _through_load_state_dict_pre_hooks(params, module)
        if isinstance(module, TensorDictBase):  # a TensorDictParams: its TensorDict is replaced
            return tensordict_peer.into_tensordict_module(params, module, return_swap)
        try:
            return _to_module(params, module, mode, return_swap, swap_dest, non_blocking)
        except StalePlan:  # a cached plan named a slot that is gone: nothing was written
            forget(module)
            return _to_module(params, module, mode, return_swap, swap_dest, non_blocking)
    except Fault as fault:  # nothing was written
        crossing = fault.is_unknown_key() and tensordict_peer.crosses_tensordict_module(
            params, module
        )
        error = None if crossing else fault.worded(api)
    if error is not None:
        raise error
    # A key through a TensorDictParams held as a submodule (`m.params = TensorDictParams(..)`)
    # has no slot of its own: tensordict's own to_module swaps it (the peer's semantics).
    return tensordict_peer.to_module(
        params,
        module,
        inplace=inplace,
        return_swap=return_swap,
        swap_dest=swap_dest,
        non_blocking=non_blocking,
        preserve_module_state=preserve_module_state,
    )


def _to_module(
    params: Params,
    module: nn.Module,
    mode: Mode,
    return_swap: bool,
    swap_dest: TensorDictBase | None,
    non_blocking: bool,
) -> TensorDictBase | None:
    plan, leaves = resolve(
        params,
        module,
        tie_weights=False,
        strict=False,
        make_parameters=mode is PRESERVE,
        group_by_dict=True,
    )
    if mode is not INPLACE and swap_dest is None:
        undone = _exact_inverse(params, module, plan, leaves)
        if undone is not None:  # to_module(old, module): put everything back in its place
            undone.reorder_in = None  # in the order of `params`, as tensordict writes them
            current = restore(undone)
            reregister_as_given(undone.plan, module, plan.names[: plan.given])
            if not return_swap:
                return None
            redo = old_tensordict(plan, leaves, current[: undone.plan.given])
            _attach_redo(redo, undone, current)  # `with`: on exit, the swap is back in
            return redo
    swap = prepare(module, plan, leaves, mode, non_blocking)
    if swap.sharded is None:  # tensordict's order and hooks (FSDP2 copies into shards)
        swap.reorder_in = module
    old = swap.old[: plan.given]
    out: TensorDictBase | None = None
    if return_swap and swap_dest is None:
        out = old_tensordict(plan, leaves, old)
    elif return_swap and swap_dest is not None:  # written first: a failure there leaves
        for key, value in zip(leaves.keys, old):  # the module as it is
            swap_dest[key] = value
        out = swap_dest
    commit(swap)
    if out is not None:  # `with out:` restores the swap on exit
        _record(out, OP_NAME, (swap, module))
        out.__dict__[RECORD] = (swap, module)  # what _exact_inverse reads while tracing
    return out


def _exact_inverse(params: Params, module: nn.Module, plan: Plan, leaves: Leaves) -> Swap | None:
    """The swap that ``to_module(params, module)`` exactly undoes, if any.

    ``params`` is the TensorDict an earlier ``to_module(p, module)`` returned (or filled as
    ``swap_dest``), not yet restored, and still holding the very objects it was returned
    with, under the same names: position first; by name when the order differs (a
    ``swap_dest`` groups each submodule's buffers with its parameters, where a flat dict
    listed every parameter first). Restoring through the record puts every name back in its
    dict and in its place, which a generic swap cannot do for a parameter that a
    ``preserve_module_state=False`` swap had turned into a plain attribute.

    Traced, ``_last_op`` is never read. On a TensorDict that comes into the compiled
    function, that read makes Dynamo guard that ``_last_op`` stays out of the object's
    ``__dict__`` (TensorDictBase has a class-level ``None``), and tensordict's
    ``clear_refs_for_compile_()`` breaks the guard by writing ``_last_op = None`` there: one
    recompile, in every TorchRL loss (it calls it after each step). fcall's own key
    ``RECORD`` is read instead, from exact TensorDicts (and ``OldValues``) only: nothing but
    fcall writes it, so its guard holds, and a TensorDictParams is not asked at all.
    """
    if plan.traced:
        record = params.__dict__.get(RECORD) if isinstance(params, TensorDict) else None
    else:
        last_op = getattr(params, "_last_op", None) if isinstance(params, TensorDictBase) else None
        record = last_op[1][0] if last_op and last_op[0] == OP_NAME else None
    if record is None:
        return None
    undone, owner = record
    if owner is not module or undone.done or undone.mode not in (PRESERVE, REPLACE):
        return None
    old, values = undone.old[: undone.plan.given], leaves.values
    if len(old) != len(values):
        return None
    if all(a is b for a, b in zip(old, values)):
        return undone
    taken = dict(zip(undone.plan.names, old))
    for name, value in zip(plan.names, values):
        if taken.get(name, GONE) is not value:
            return None  # the TensorDict was changed since: a plain swap of what it holds
    return undone


def _through_load_state_dict_pre_hooks(params: Params, module: nn.Module) -> dict:
    """Run every ``load_state_dict`` pre-hook once, as ``module.load_state_dict`` would."""
    leaves = flatten(params)
    state = {".".join(key): value for key, value in zip(leaves.keys, leaves.values)}
    for prefix, submodule in module.named_modules():
        for hook in submodule._load_state_dict_pre_hooks.values():
            hook(state, f"{prefix}." if prefix else "", {}, True, [], [], [])
    return state


# The `with` of the returned TensorDict

OP_NAME = "_fcall_to_module"  # the record of a swap: restored on exit
REDO_OP_NAME = "_fcall_to_module_redo"  # the record of an exact undo: the swap back on exit
RECORD = "_fcall_swap"  # (swap, module) of the swap a TensorDict undoes, see _exact_inverse


def _restore_on_exit(td: Any, args: tuple, kwargs: dict, prev: Any) -> None:
    swap, _ = args
    restore(swap)


def _reapply_on_exit(td: Any, args: tuple, kwargs: dict, prev: Any) -> None:
    swap, current = args
    reapply(swap, current)


def _keep_refs() -> None:
    return None


def _attach_redo(out: Any, swap: Swap, current: Sequence[Any]) -> None:
    """``out``, returned by ``to_module(old, module)`` that undid ``swap`` (which left
    ``current`` in the slots), puts the swap back in on exit of a ``with`` block, as
    tensordict's ``to_module`` swaps back the values it took out."""
    _record(out, REDO_OP_NAME, (swap, current))


def _record(out: Any, op_name: str, args: tuple) -> None:
    out._last_op = (op_name, (args, {}, no_previous))
    # Under Dynamo, TensorDict.__exit__ first calls clear_refs_for_compile_(),
    # which calls type() on every leaf; on a Parameter created in the graph (a
    # nested to_module wraps values in Parameters) that crashes the guard
    # builder (NameError: SYNTHETIC_LOCAL). The refs it clears are weakrefs that
    # fcall never records, so the call is skipped for this TensorDict.
    out.clear_refs_for_compile_ = _keep_refs


register_exit_op(OP_NAME, _restore_on_exit)
register_exit_op(REDO_OP_NAME, _reapply_on_exit)
