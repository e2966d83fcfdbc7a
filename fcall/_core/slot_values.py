"""What goes into a slot: the value a swap writes for each leaf, per mode.

``swap`` / ``functional_call`` put every value in as it is (torch.func's rule). ``to_module``
with ``preserve_module_state=True`` (``PRESERVE``) follows tensordict's rule, written once:
``into``, facts in (the slot's kind, whether the value is a Parameter, whether it requires grad
or is batched, the old tensor), a decision out (``Into``). It is applied leaf by leaf in eager
(``_per_leaf``, with a bulk path in C loops for the cases where every decision is the same),
entry by entry for tied aliases and the generic traced path (``_registered_per_entry``), and at
trace time on the real values by the traced front (``routes._preserve``).
"""

from __future__ import annotations

import enum
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


class Into(enum.Enum):
    """What ``PRESERVE`` puts into a slot for a value (``into``)."""

    AS_IS = "the value as it is"
    NEW_PARAMETER = "a new Parameter of the value, with the old tensor's requires_grad"
    AS_BUFFER = "the value registered as a buffer (nn.Buffer)"


def reads_old(kind: SlotKind, is_parameter: bool, requires_grad: bool, batched: bool) -> bool:
    """Whether ``into`` reads the old tensor: only for a parameter slot and a value that is a
    Parameter or tracks no gradient. Traced, reading the old tensor (even ``old is None``)
    makes it a graph input guarded on every call."""
    return kind is PARAMETER and (is_parameter or not (requires_grad or batched))


def into(kind: SlotKind, is_parameter: bool, requires_grad: bool, batched: bool, old: Any) -> Into:
    """tensordict's ``PRESERVE`` rule (``_maybe_preserve_module_state``): a Parameter given for
    a buffer slot is registered as a buffer; a value bound for a parameter slot that tracks
    gradients (requires grad, or is batched by ``vmap``) goes in as it is (a new Parameter
    would be a new leaf and cut them off), and so does a value for a slot holding ``None``
    (no bias) and a Parameter whose ``requires_grad`` is the slot's; any other becomes a new
    Parameter with the old tensor's ``requires_grad``. ``old`` is read last (``reads_old``).

    >>> into(SlotKind.PARAMETER, False, False, False, torch.nn.Parameter(torch.ones(1)))
    <Into.NEW_PARAMETER: "a new Parameter of the value, with the old tensor's requires_grad">
    """
    if kind is BUFFER:
        return Into.AS_BUFFER if is_parameter else Into.AS_IS
    if not reads_old(kind, is_parameter, requires_grad, batched) or old is None:
        return Into.AS_IS
    if is_parameter and requires_grad == old.requires_grad:
        return Into.AS_IS
    return Into.NEW_PARAMETER


AS_IS, NEW_PARAMETER = Into.AS_IS, Into.NEW_PARAMETER


_REQUIRES_GRAD = operator.attrgetter("requires_grad")


def parameter_for_a_buffer(plan: Plan, values: list[Any]) -> bool:
    """Whether some value bound for a buffer slot is a Parameter (PRESERVE registers it
    as a buffer, as tensordict does)."""
    indexes = plan.buffer_leaves
    return bool(indexes) and any(isinstance(values[index], _Parameter) for index in indexes)


_is_batched = torch._C._functorch.is_batchedtensor


_ONLY_TENSORS, _ONLY_PARAMETERS = {_Tensor}, {_Parameter}


def preserved(plan: Plan, values: list[Any], old: Sequence[Any]) -> list[Any]:
    """``PRESERVE`` in eager for a direct plan (entry i takes leaf i): ``values`` with
    ``into``'s decision applied to each. Where every decision is the same it is made in C
    loops over the leaves (``map``) instead of Python per leaf: no buffer gets a Parameter
    and every value bound for a parameter slot is a plain tensor that tracks gradients (all
    go in as they are), or a plain tensor that tracks none (each becomes a Parameter with its
    slot's ``requires_grad``: a target network's values), or a Parameter whose
    ``requires_grad`` is its slot's (all go in as they are). Anything else is decided leaf by
    leaf (``_per_leaf``)."""
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
    """``preserved`` leaf by leaf, for what its C loops do not cover: ``into``'s decision for
    each leaf, its commonest answers asked inline first (a call per leaf is measurable in an
    eager swap of a TensorDictParams with buffers; tests/test_preserve_parameters.py checks
    every path's answers against ``into`` and tensordict)."""
    new = values  # copied on the first conversion only
    for index, kind, value, old_value in zip(range(len(values)), plan.kinds, values, old):
        if value is None:
            continue
        cls = type(value)
        if kind is PARAMETER and old_value is not None:
            if cls is _Tensor and not (value.requires_grad or _is_batched(value)):
                value = _make_subclass(_Parameter, value, old_value.requires_grad)  # NEW_PARAMETER
            elif cls is _Parameter and value.requires_grad == old_value.requires_grad:
                continue  # AS_IS: a Parameter as the slot's
            else:  # the rest of the rule; an exact Tensor is plain here (docs/conformance.md)
                is_parameter = cls is _Parameter or (
                    cls is not _Tensor and isinstance(value, _Parameter)
                )
                requires_grad = value.requires_grad
                batched = not (is_parameter or requires_grad) and _is_batched(value)
                if into(kind, is_parameter, requires_grad, batched, old_value) is AS_IS:
                    continue
                value = _parameter(value, old_value.requires_grad)  # NEW_PARAMETER
        elif kind is BUFFER and isinstance(value, _Parameter):  # tensordict's isinstance
            value = _as_buffer(value, attributes_of(plan, index), plan.slot_names[index])
        else:
            continue  # AS_IS: an attribute, a slot holding None, a plain tensor for a buffer
        if new is values:  # copied on the first conversion only
            new = list(values)
        new[index] = value
    return new


def _parameter(value: torch.Tensor, requires_grad: bool) -> nn.Parameter:
    """``Into.NEW_PARAMETER`` in eager: a new Parameter per swap, never a cached one; for a plain
    tensor what ``nn.Parameter(value, requires_grad)`` runs, without the frame of
    ``Parameter.__new__``."""
    if type(value) is _Tensor:
        return _make_subclass(_Parameter, value, requires_grad)
    return nn.Parameter(value, requires_grad=requires_grad)


def registered_values(plan: Plan, values: list[Any], old: Sequence[Any]) -> list[Any]:
    if plan.direct and not plan.traced:
        return preserved(plan, values, old)
    made = plan.preserved
    if made is not None:  # traced: the Route made them (fcall/_core/traced.py)
        if plan.direct:
            return made
        return [made[leaf] for leaf in plan.leaves]
    if plan.traced:
        with TRACEABLE_PARAMETER:  # once, not per Parameter: each `with` is traced
            return _registered_per_entry(plan, values, old, True)
    return _registered_per_entry(plan, values, old, False)


def _registered_per_entry(
    plan: Plan, values: Sequence[Any], old: Sequence[Any], traced: bool
) -> list:
    """``into`` entry by entry: traced (the generic path), or with tied aliases (one
    conversion per leaf, so tied names stay one tensor)."""
    converted: dict[int, Any] = {}  # per leaf index
    new = []
    for index, kind, leaf, old_value in zip(range(len(old)), plan.kinds, plan.leaves, old):
        value = converted.get(leaf)
        if value is None:
            value = values[leaf]
            if value is not None:
                # traced, isinstance: type() of a Parameter made in the graph crashes Dynamo's
                # guard builder (NameError: SYNTHETIC_LOCAL)
                fast = not traced and kind is not BUFFER  # a buffer: see _per_leaf
                is_parameter = _is_parameter(value) if fast else isinstance(value, nn.Parameter)
                requires_grad = value.requires_grad
                # batched: asked only where the rule needs it, as into() would
                batched = not (is_parameter or requires_grad) and _is_batched(value)
                decision = into(kind, is_parameter, requires_grad, batched, old_value)
                if decision is NEW_PARAMETER:  # traced, the caller entered TRACEABLE_PARAMETER
                    value = nn.Parameter(value, requires_grad=old_value.requires_grad)
                elif decision is not AS_IS:
                    value = _as_buffer(value, attributes_of(plan, index), plan.slot_names[index])
            converted[leaf] = value
        new.append(value)
    return new


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


def _is_parameter(value: Any) -> bool:
    # In eager, skip Parameter's Python-level __instancecheck__ for the common types.
    cls = type(value)
    if cls is nn.Parameter:
        return True
    return False if cls is torch.Tensor else isinstance(value, nn.Parameter)


def tracks_gradients(value: torch.Tensor) -> bool:
    """Whether ``value`` requires grad or is batched by ``vmap`` (what a copy into another
    tensor would cut off: the distributed checks)."""
    return value.requires_grad or _is_batched(value)
