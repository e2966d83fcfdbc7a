"""What goes into a slot: the value a swap writes for each leaf, per mode.

``swap`` / ``functional_call`` put every value in as it is (torch.func's rule). ``to_module``
with ``preserve_module_state=True`` (``PRESERVE``, tensordict's rule) wraps a value bound for a
parameter slot that tracks no gradient in a Parameter with the slot's ``requires_grad`` (a
Parameter whose ``requires_grad`` is not the slot's, too), keeps one that tracks gradients as it
is (a new Parameter would cut them off), and registers a Parameter given for a buffer as a buffer
(``nn.Buffer``). One rule, in three shapes: ``preserved`` for an eager plan whose entry i takes
leaf i (with a bulk path in C loops for the common case), ``_registered_per_entry`` for tied
aliases and for the generic traced path; the traced front (``fcall/_core/traced.py``) applies the
rule a Route decided on the real values.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from itertools import repeat
from typing import Any

import torch
from torch import nn
from torch._dynamo.decorators import DynamoConfigPatchProxy

from .types import Plan, SlotKind, attributes_of

_Tensor, _Parameter = torch.Tensor, nn.Parameter
PARAMETER, BUFFER = SlotKind.PARAMETER, SlotKind.BUFFER
_make_subclass = torch.Tensor._make_subclass


_REQUIRES_GRAD = operator.attrgetter("requires_grad")


def parameter_for_a_buffer(plan: Plan, values: list[Any]) -> bool:
    """Whether some value bound for a buffer slot is a Parameter (PRESERVE registers it
    as a buffer, as tensordict does)."""
    indexes = plan.buffer_leaves
    return bool(indexes) and any(isinstance(values[index], _Parameter) for index in indexes)


_is_batched = torch._C._functorch.is_batchedtensor


_ONLY_TENSORS, _ONLY_PARAMETERS = {_Tensor}, {_Parameter}


def preserved(plan: Plan, values: list[Any], old: Sequence[Any]) -> list[Any]:
    """``PRESERVE`` in eager for a direct plan (entry i takes leaf i): ``values`` with each
    one bound for a parameter slot as ``_as_parameter_slot`` makes it. The common cases
    run in C loops over the leaves (``map``) instead of Python per leaf: no buffer gets a
    Parameter and every value bound for a parameter slot is a plain tensor that tracks
    gradients (all go in as they are), or a plain tensor that tracks none (each becomes a
    Parameter with its slot's ``requires_grad``: a target network's values), or a
    Parameter whose ``requires_grad`` is its slot's (all go in as they are). Anything else
    is decided leaf by leaf (``_per_leaf``)."""
    indexes = plan.parameter_leaves  # None: every entry is a parameter slot
    if indexes is None:
        bound, held = values, old
    elif not indexes or parameter_for_a_buffer(plan, values):
        return _per_leaf(plan, values, old)
    else:
        bound, held = list(map(values.__getitem__, indexes)), list(map(old.__getitem__, indexes))
    types = set(map(type, bound))
    try:
        if types == _ONLY_PARAMETERS:
            same = list(map(_REQUIRES_GRAD, bound)) == list(map(_REQUIRES_GRAD, held))
            return values if same else _per_leaf(plan, values, old)
        if types != _ONLY_TENSORS:
            return _per_leaf(plan, values, old)
        if all(map(_REQUIRES_GRAD, bound)):
            return values  # they track gradients: a new Parameter would cut them off
        if any(map(_REQUIRES_GRAD, bound)) or any(map(_is_batched, bound)):
            return _per_leaf(plan, values, old)
        requires_grad = list(map(_REQUIRES_GRAD, held))
    except AttributeError:  # a slot holding None: the per-leaf loop decides
        return _per_leaf(plan, values, old)
    made = list(map(_make_subclass, repeat(_Parameter, len(bound)), bound, requires_grad))
    if indexes is None:
        return made
    new = list(values)
    for index, parameter in zip(indexes, made):
        new[index] = parameter
    return new


def _per_leaf(plan: Plan, values: list, old: Sequence[Any]) -> list:
    """``preserved`` leaf by leaf, for what its C loops do not cover."""
    new = values  # copied on the first conversion only
    for index, entry, value, old_value in zip(range(len(values)), plan.entries, values, old):
        if entry.kind is not PARAMETER or old_value is None or value is None:
            if entry.kind is not BUFFER or not isinstance(value, _Parameter):
                continue
            value = _as_buffer(value, attributes_of(plan, index), entry.name)  # as a buffer
        elif (cls := type(value)) is _Tensor:
            if value.requires_grad or _is_batched(value):
                continue  # it tracks gradients: it goes in as it is
            # what nn.Parameter(value, requires_grad) runs for a plain tensor, without the
            # frame of Parameter.__new__; a new Parameter per swap, never a cached one
            value = _make_subclass(_Parameter, value, old_value.requires_grad)
        elif cls is _Parameter and value.requires_grad == old_value.requires_grad:
            continue  # the common case: a Parameter as the slot's stays (tensordict's rule)
        else:
            value = _as_parameter_slot(value, old_value)  # may raise
            if value is new[index]:
                continue
        if new is values:
            new = list(values)
        new[index] = value
    return new


def registered_values(plan: Plan, values: list[Any], old: Sequence[Any]) -> list[Any]:
    if plan.direct and not plan.traced:
        return preserved(plan, values, old)
    made = plan.route.preserved if plan.route is not None else None
    if made is not None:  # traced: the Route made them (fcall/_core/traced.py)
        if plan.direct:
            return made
        return [made[entry.leaf] for entry in plan.entries]
    if plan.traced:
        with TRACEABLE_PARAMETER:  # once, not per Parameter: each `with` is traced
            return _registered_per_entry(plan, values, old, True)
    return _registered_per_entry(plan, values, old, False)


def _registered_per_entry(
    plan: Plan, values: Sequence[Any], old: Sequence[Any], traced: bool
) -> list:
    # Traced, or with tied aliases (one conversion per leaf, so tied names stay one tensor).
    converted: dict[int, Any] = {}  # per leaf index, so tied names stay one tensor
    new = []
    for index, entry, old_value in zip(range(len(old)), plan.entries, old):
        value = converted.get(entry.leaf)
        if value is None:
            value = values[entry.leaf]
            if entry.kind is PARAMETER and value is not None:
                value = _as_parameter_slot(value, old_value, traced)
            elif entry.kind is BUFFER and isinstance(value, nn.Parameter):
                value = _as_buffer(value, attributes_of(plan, index), entry.name)
            converted[entry.leaf] = value
        new.append(value)
    return new


def _as_parameter_slot(
    value: torch.Tensor, old: torch.Tensor | None, traced: bool = False
) -> torch.Tensor:
    if not isinstance(value, nn.Parameter) and tracks_gradients(value):
        # A new Parameter would be a new leaf and cut the gradients off; keep
        # the value as it is in the parameter slot, as functional_call does.
        # Asked before anything of `old`: traced, reading the old tensor (even
        # `old is None`) makes it a graph input guarded on every call. A Parameter
        # whose requires_grad is not the slot's is wrapped in one that has the slot's
        # (tensordict's _maybe_preserve_module_state), in as_parameter.
        return value
    return as_parameter(value, old, traced)


def as_parameter(value: torch.Tensor, old: torch.Tensor | None, traced: bool) -> torch.Tensor:
    """``_as_parameter_slot`` for a value that tracks no gradients."""
    if old is None:  # a parameter slot holding None (no bias): the value goes in as it is
        return value
    is_parameter = _isinstance_parameter if traced else _is_parameter
    if is_parameter(value) and value.requires_grad == old.requires_grad:
        return value
    # traced, the caller has entered TRACEABLE_PARAMETER
    return nn.Parameter(value, requires_grad=old.requires_grad)


# Under Dynamo, nn.Parameter(t) on a tensor made in the graph (a value that a
# load_state_dict pre-hook computed, `p * 2`) graph-breaks by default
# (config.graph_break_on_nn_param_ctor); with the flag off Dynamo takes its
# traceable path (torch/_dynamo/create_parameter_op.py: a placeholder Parameter
# is a graph input, set_() to the value in the graph, gradients flow into it as
# into an input), which gives eager's Parameter, requires_grad and gradients in
# one graph. The flag is patched only around this constructor, while tracing, with
# the context manager Dynamo restores itself (torch._dynamo.patch_dynamo_config's
# proxy; patch_dynamo_config's own allow-list does not name this flag).
TRACEABLE_PARAMETER = DynamoConfigPatchProxy(
    torch._dynamo.config.patch(graph_break_on_nn_param_ctor=False)
)


def _as_buffer(value: nn.Parameter, attributes: dict, name: str) -> torch.Tensor:
    # tensordict's to_module(preserve_module_state=True) does the same: Buffer(p) is a
    # plain tensor sharing p's storage, a new leaf with p's requires_grad
    persistent = name not in attributes["_non_persistent_buffers_set"]
    return nn.Buffer(value, persistent=persistent)


def _isinstance_parameter(value: Any) -> bool:
    # Under Dynamo, type() on a Parameter made in the graph crashes the guard
    # builder (NameError: SYNTHETIC_LOCAL); isinstance is safe.
    return isinstance(value, nn.Parameter)


def _is_parameter(value: Any) -> bool:
    # In eager, skip Parameter's Python-level __instancecheck__ for the common types.
    cls = type(value)
    if cls is nn.Parameter:
        return True
    return False if cls is torch.Tensor else isinstance(value, nn.Parameter)


def tracks_gradients(value: torch.Tensor) -> bool:
    return value.requires_grad or torch._C._functorch.is_batchedtensor(value)
