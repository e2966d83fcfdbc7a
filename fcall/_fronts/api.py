"""``to_module`` and ``swap``, and ``_swap_in``: the pipeline ``functional_call`` shares."""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Any, Literal, overload

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from .. import _errors
from .._core import distributed as _distributed
from .._core import flatten as _flatten
from .._core import traced as _traced
from .._core.build import build
from .._core.engine import AS_IS, GONE, INPLACE, PRESERVE, REPLACE, Swap, commit, prepare, restore
from .._core.plan import Plan, StalePlan
from .._core.plan_cache import forget, plan_for
from .._core.registration import reregister_as_given
from .._core.types import Mode
from . import peer_to_module as _peer_to_module
from .context import attach, attach_redo, undone_by
from .tensordict_module import into_tensordict_module

Params = TensorDictBase | Mapping[str, Any]


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
    _check_module(module, api)
    if swap_dest is not None and not isinstance(swap_dest, TensorDictBase):
        raise TypeError(_errors.bad_swap_dest(api, swap_dest))
    if use_state_dict:
        if inplace is not None:
            raise RuntimeError(_errors.inplace_with_state_dict(api))
        params = _through_load_state_dict_pre_hooks(params, module, api)
    if isinstance(module, TensorDictBase):  # a TensorDictParams: its TensorDict is replaced
        return into_tensordict_module(params, module, return_swap, api)
    mode = INPLACE if inplace else PRESERVE if preserve_module_state else REPLACE
    try:
        return _retried_if_stale(
            module, _to_module, params, module, mode, return_swap, swap_dest, non_blocking
        )
    except _errors.UnknownKey:  # nothing was written
        if not _peer_to_module.crosses_tensordict_module(params, module):
            raise
    # A key through a TensorDictParams held as a submodule (`m.params = TensorDictParams(..)`)
    # has no slot of its own: tensordict's own to_module swaps it (the peer's semantics).
    return _peer_to_module.to_module(
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
    api = "fcall.to_module"
    plan, leaves = _resolve(
        params,
        module,
        api,
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
            out: TensorDictBase | None = _old_tensordict(plan, leaves, current[: undone.plan.given])
            attach_redo(out, undone, current)  # `with`: on exit, the swap is back in
            return out
    swap = _distributed.prepare(module, plan, leaves, mode, api, non_blocking)
    swap = swap or prepare(plan, leaves, mode, api, non_blocking)
    if swap.strategy is None:  # tensordict's order and hooks (FSDP2 copies into shards)
        swap.reorder_in = module
    # swap_dest is written first: a failure there leaves the module untouched
    out = _old_values(plan, leaves, swap.old_given(), swap_dest) if return_swap else None
    commit(swap)
    if out is not None:  # OldValues or swap_dest
        attach(out, swap, module)
    return out


class swap:
    """Swap ``params`` into ``module`` for the duration of a ``with`` block.

    ``with fcall.swap(params, model) as old:`` runs the block with ``params`` in
    the module and binds ``old`` to a TensorDict of the values it held. On exit,
    normal or by exception, the module gets back the very same Parameter and
    buffer objects, registered as before. Values go into their slots as they are,
    like ``torch.func.functional_call``: no new Parameter is made, so gradients
    reach every leaf that requires grad. In-place updates during the block
    (BatchNorm running stats) land in the params' tensors, and a buffer that
    ``forward`` reassigns is written back into ``params`` on exit.

    Args:
        params: a TensorDict, a TensorDictParams, or a dict (nested or flat keys).
        module: the module to swap into.
        strict: if ``True``, every parameter and buffer of the module must have a
            value in ``params`` (``RuntimeError`` listing the missing keys).
        tie_weights: names that the module ties to one tensor all see the value
            given for any of them; different values for tied names raise
            ``ValueError``. With ``False`` each name takes only its own value.

    Unknown keys raise ``KeyError`` and non-tensor values ``TypeError``, before
    anything is written.

    Examples:
        >>> import torch
        >>> from torch import nn
        >>> import fcall
        >>> model = nn.Linear(2, 2)
        >>> ones = {"weight": torch.ones(2, 2), "bias": torch.zeros(2)}
        >>> with fcall.swap(ones, model) as old:
        ...     model(torch.tensor([1.0, 2.0]))
        tensor([3., 3.])
        >>> model.weight is old["weight"]
        True
    """

    def __init__(
        self, params: Params, module: nn.Module, *, strict: bool = False, tie_weights: bool = True
    ) -> None:
        self._params = params
        self._module = module
        self._strict = strict
        self._tie_weights = tie_weights
        self._swap: Swap | None = None
        self._outer: list[Swap] = []  # the swaps of enclosing enters of this object

    def __enter__(self) -> TensorDict:
        swapped, leaves = _swap_in(
            self._params, self._module, "fcall.swap", self._strict, self._tie_weights
        )
        if self._swap is not None:  # entered again inside its own block: nested restores
            self._outer.append(self._swap)
        self._swap = swapped
        return _old_tensordict(swapped.plan, leaves, swapped.old_given())

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]:
        if self._swap is not None:
            swapped = self._swap
            self._swap = self._outer.pop() if self._outer else None
            restore(swapped)
        return False


def _swap_in(
    params: Params, module: nn.Module, api: str, strict: bool, tie_weights: bool
) -> tuple[Swap, _flatten.Leaves]:
    _check_module(module, api)
    return _retried_if_stale(module, _swap_in_once, params, module, api, strict, tie_weights)


def _retried_if_stale(module: nn.Module, swap_in: Any, *args: Any) -> Any:
    """``swap_in(*args)``, made again with new plans if a cached plan of ``module`` named
    a slot that is gone (``StalePlan``: its writes were undone)."""
    try:
        return swap_in(*args)
    except StalePlan:
        forget(module)
        return swap_in(*args)


def _swap_in_once(
    params: Params, module: nn.Module, api: str, strict: bool, tie_weights: bool
) -> tuple[Swap, _flatten.Leaves]:
    plan, leaves = _resolve(params, module, api, tie_weights=tie_weights, strict=strict)
    _check_tied_values(plan, leaves, api)
    swapped = _distributed.prepare(module, plan, leaves, AS_IS, api, False)
    swapped = swapped or prepare(plan, leaves, AS_IS, api, False)
    commit(swapped)
    return swapped, leaves


def _resolve(
    params: Params,
    module: nn.Module,
    api: str,
    *,
    tie_weights: bool,
    strict: bool,
    make_parameters: bool = False,
    group_by_dict: bool = False,
) -> tuple[Plan, _flatten.Leaves]:
    """The plan for ``params`` in ``module`` (cached in eager), and the leaves of ``params``.
    Traced, a Route decides it (``fcall/_traced.py``), else the generic path: ``build``
    traced. ``make_parameters``, ``group_by_dict``: see ``_traced.resolve``."""
    # The one is_compiling() check of a swap: past it, plan.traced tells.
    if torch.compiler.is_compiling():
        routed = _traced.resolve(
            params, module, api, tie_weights, strict, make_parameters, group_by_dict
        )
        if routed is not None:
            return routed
        leaves = _flatten.flatten_generic(params, api)
        return build(module, leaves.keys, api, tie_weights=tie_weights, strict=strict), leaves
    leaves = _flatten.flatten_eager(params, api)
    return plan_for(module, leaves, api, tie_weights=tie_weights, strict=strict), leaves


def _exact_inverse(
    params: Params, module: nn.Module, plan: Plan, leaves: _flatten.Leaves
) -> Swap | None:
    """The swap that ``params`` (in ``plan``) exactly undoes, or ``None``: ``params`` holds
    the very objects that swap took out, under the same names. Position first; by name
    when the order differs (a ``swap_dest`` groups each submodule's buffers with its
    parameters, where a flat dict listed every parameter first)."""
    undone = undone_by(params, module, plan.traced)
    if undone is None:
        return None
    old, values = undone.old_given(), leaves.values
    if len(old) != len(values):
        return None
    if all(a is b for a, b in zip(old, values)):
        return undone
    taken = dict(zip(undone.plan.names, old))
    for name, value in zip(plan.names, values):
        if taken.get(name, GONE) is not value:
            return None  # the TensorDict was changed since: a plain swap of what it holds
    return undone


def _check_tied_values(plan: Plan, leaves: _flatten.Leaves, api: str) -> None:
    for indexes in plan.tie_sources:
        first = leaves.values[indexes[0]]
        if any(leaves.values[i] is not first for i in indexes[1:]):
            names = [".".join(leaves.keys[i]) for i in indexes]
            raise ValueError(_errors.tied_conflict(api, names))


def _check_module(module: Any, api: str) -> None:
    if not isinstance(module, nn.Module):
        raise TypeError(_errors.not_a_module(api, module))


def _old_values(
    plan: Plan, leaves: _flatten.Leaves, old: list[Any], swap_dest: TensorDictBase | None
) -> TensorDictBase:
    if swap_dest is None:
        return _old_tensordict(plan, leaves, old)
    for key, value in zip(leaves.keys, old):
        swap_dest[key] = value
    return swap_dest


def _old_tensordict(plan: Plan, leaves: _flatten.Leaves, old: list[Any]) -> TensorDict:
    # Lazy in eager and under Dynamo alike: tracing one TensorDict per submodule
    # that nobody reads would cost more compile time than the rest of the swap.
    if plan.names_are_keys:  # built while tracing (fcall/_build.py): no layout yet
        return _flatten.old_values(None, plan.names[: plan.given], old)
    if plan.layout is None:
        plan.layout = _flatten.layout_of(leaves.keys)  # cached with the plan, per key structure
    return _flatten.old_values(plan.layout, None, old, leaves.signature)


def _through_load_state_dict_pre_hooks(params: Params, module: nn.Module, api: str) -> dict:
    """Run every ``load_state_dict`` pre-hook once, as ``module.load_state_dict`` would."""
    leaves = _flatten.flatten(params, api)
    state = {".".join(key): value for key, value in zip(leaves.keys, leaves.values)}
    for prefix, submodule in module.named_modules():
        for hook in submodule._load_state_dict_pre_hooks.values():
            hook(state, f"{prefix}." if prefix else "", {}, True, [], [], [])
    return state
