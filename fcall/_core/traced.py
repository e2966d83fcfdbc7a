"""The traced front: a swap's plan is decided in eager while Dynamo traces, and the trace
only reads, writes and restores.

Under Dynamo every Python step of the plan builder is compile time, per leaf. So the plan
is not traced: ``comptime`` hands Dynamo's view of the caller's locals to ``_decide`` at
trace time, which runs the one builder (``build.build``) in eager on the real module and
keys, and hands its layout to the trace in a ``Route``: names and indexes only, no object of
this instance, so that one compiled frame serves every instance of the architecture.
``_decided`` (an ``assume_constant_result`` function of no argument) gives the Route to
the trace as a constant, with no guard. The trace then binds the layout (``bind.reach``,
``bind.bind``: the owner modules level by level, their dicts) and reaches the params' nodes,
and reads and writes the slots, through builtins (``map``, ``getattr``, ``dict.__getitem__``)
that Dynamo runs without stepping through bytecode.

Those same reads are the guards that keep the Route sound: each owner is reached through
its parent's ``_modules`` (the path, the module types), each owner's ``_parameters`` keys
(and ``_buffers`` keys where a buffer is swapped) and each params node's keys are read in
full, and compared with what the Route was built on. A module whose structure differs on a
later call fails one of them and recompiles; the new trace decides again.

Anything the Route does not cover is decided as a ``Generic`` reason (``routes.Generic``: an
unknown key, tied names given or aliased, a submodule at two paths, a plain tensor attribute,
FSDP2 and DDP trees, values that are not tensors, a module or params already changed in the
trace, Dynamo's aliasing guards turned on, ...; ``strict`` returns before the decision):
``resolve`` returns ``None`` and the caller takes the generic traced path (``build`` traced),
which raises the eager errors. The decision catches one exception only, the builder's own
``Fault`` (the generic path raises it, traced): any other error of a Route fails the compile.
``resolve`` also returns ``None`` when the trace's reads differ from what the Route was decided
on (the trace changed the params or the module's dicts before the swap).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .._compat import (
    UNSKIPPABLE_ATTRIBUTE,
    comptime,
    has_pending_mutations,
    inside_higher_order_op,
    local_items,
    real_object,
    tensor_facts,
)
from .bind import bind, descend, entries_of, pick, reach
from .flatten import Leaves, wrapped
from .routes import (
    Generic,
    Route,
    ValueFacts,
    route_of_dict,
    route_of_tensordict,
)
from .slot_values import TRACEABLE_PARAMETER
from .tree import unwrap
from .types import DictGroup, DictLevel, Plan

_repeat = itertools.repeat


def resolve(
    params: Any,
    module: nn.Module,
    tie_weights: bool,
    strict: bool,
    make_parameters: bool = False,
    group_by_dict: bool = False,
) -> tuple[Plan, Leaves] | None:
    """Traced only: the plan and leaves of ``params`` in ``module`` through a Route, or
    ``None`` for the generic path. ``make_parameters`` (``to_module``'s ``PRESERVE``): what
    each leaf goes in as (``plan.preserved``); ``group_by_dict`` (``to_module``): the names
    written into each dict (``plan.dict_groups``)."""
    if strict:  # missing keys are a whole-tree question: the generic path asks it
        return None
    # a dict's key structure is read in the trace, a level at a time (`shape`, which _decide
    # reads in `request`); a TensorDict's outside it, from the real object, then checked
    # against the traced one (_tensordict_values)
    ordered = make_parameters or group_by_dict  # to_module: the order is tensordict's order
    shape, level_values = _dict_shape(params, ordered) if isinstance(params, dict) else (None, None)
    # what _decide is given: one tuple, its items' names first (a literal: no guard)
    names = ("module", "params", "shape", "level_values", "tie_weights", "make_parameters")
    request = (names, module, params, shape, level_values, tie_weights, make_parameters)
    comptime(_decide)  # reads `request`
    del request  # read by _decide only (a call here would add guards to every swap)
    route = _decided()
    if route is None:
        return None
    if level_values is not None:
        values: Sequence[Any] | None = pick(level_values, route.leaf_nodes)
    else:
        values = _tensordict_values(params, route)
    if values is None:
        return None
    if make_parameters:  # each value read as its Parameter is made (_parameters_made)
        made = _parameters_made(route, values)
    else:
        made = ()
        if level_values is None:  # a TensorDict's values read now (a dict's: _dict_shape)
            tuple(map(isinstance, values, _repeat(torch.Tensor)))  # see fcall/README.md
    layout = route.layout
    owners, dicts = reach(layout, unwrap(module)[0])
    if not _same(tuple(map(tuple, dicts[: len(owners)])), route.owner_keys):
        return None
    buffers = dicts[len(owners) :]  # a Route's layout has no attribute's slot
    if buffers and not _same(tuple(map(tuple, buffers)), route.buffer_keys):
        return None
    plan = bind(layout, owners, dicts, True)
    plan.names = list(route.dotted)  # the keys as given: no prefix was stripped
    plan.names_are_keys = True
    if make_parameters:
        plan.preserved = _preserved(route, values, plan.slots, made)
        if plan.preserved is None:
            return None
    if group_by_dict:
        groups = zip(pick(dicts, route.group_slots), map(list, route.group_names))
        plan.dict_groups = list(map(tuple.__new__, _repeat(DictGroup), groups))
    leaves = Leaves(params)
    leaves.values = list(values)  # one extend of a tuple: no side effect per value
    return plan, leaves


def _parameters_made(route: Route, values: Sequence[Any]) -> tuple:
    """``to_module``'s ``PRESERVE`` decisions (``slot_values.into``), as the Route made them
    on the real values (``Preserve``), applied: each value bound to become a Parameter is made
    one, with its old tensor's ``requires_grad``, in one ``map`` that reads each value
    just before making its Parameter, and before the module's dicts are read. Dynamo's
    ``nn.Parameter(graph_input)`` rebuilds the whole guard set
    (``GuardsSet.remove_guards_with_source``): N Parameters made after N values and the
    module's dicts are read cost N times all their guards."""
    rule = route.preserve
    assert rule is not None  # to_module's Route
    with TRACEABLE_PARAMETER:  # once, not per Parameter
        return tuple(map(nn.Parameter, pick(values, rule.wrap), rule.wrap_requires_grad))


def _preserved(
    route: Route, values: Sequence[Any], slots: Sequence[dict], made: tuple
) -> list | None:
    """What each leaf goes in as, once the old tensors the Route decided on are read and
    checked, and every value is read, so that Dynamo guards the decisions' inputs (the
    values' types and ``requires_grad``, the old tensors' ``requires_grad``, a slot holding
    ``None``). ``None``: a check failed (the generic path decides)."""
    rule = route.preserve
    assert rule is not None
    names = route.layout.slot_names
    read = _slot_values(slots, names, rule.wrap + rule.kept)
    expected = rule.wrap_requires_grad + rule.kept_requires_grad
    if not _same(tuple(map(getattr, read, _repeat("requires_grad"))), expected):
        return None
    if rule.unskippable:  # Dynamo 2.11 would skip their requires_grad guards
        tuple(map(getattr, read, _repeat(UNSKIPPABLE_ATTRIBUTE)))
    empty = tuple(map(operator.is_, _slot_values(slots, names, rule.empty), _repeat(None)))
    if False in empty:  # a slot that held None holds a tensor now
        return None
    tuple(map(isinstance, values, _repeat(torch.Tensor)))  # every value read: guarded
    return list(pick((*values, *made), rule.order))


def _slot_values(slots: Sequence[dict], names: tuple[str, ...], entries: tuple[int, ...]) -> tuple:
    return tuple(map(dict.__getitem__, pick(slots, entries), pick(names, entries)))


def _dict_shape(params: dict, ordered: bool) -> tuple[list[tuple], list[Any]]:
    """A (nested) dict's structure as constants, a level at a time: per level, each
    node's keys and which values are dicts and which tensors; and every level's values,
    in that order (a Route picks the leaves from them). Unless ``ordered``, each value is
    read by its key: Dynamo then guards each node's length and keys, not their order, so
    one compiled frame serves the same keys in any order (the Route reads by name too).
    A level is a plain tuple in the trace, a ``DictLevel`` once read at trace time: Dynamo
    (torch 2.11) cannot read a NamedTuple made in the trace as a constant."""
    shape: list[tuple] = []
    everything: list[Any] = []
    level: Sequence[Any] = [params]
    while level:
        level_keys = tuple(map(tuple, level))
        values: list[Any] = []
        if ordered:
            for node in level:  # per node, not per leaf
                values.extend(node.values())
        else:
            for node, keys in zip(level, level_keys):
                values.extend(map(dict.__getitem__, _repeat(node), keys))
        is_dict = tuple(map(isinstance, values, _repeat(dict)))
        is_tensor = tuple(map(isinstance, values, _repeat(torch.Tensor)))
        shape.append((level_keys, is_dict, is_tensor))  # a DictLevel's fields
        everything.extend(values)
        level = pick(values, _where(is_dict))
    return shape, everything


@torch.compiler.assume_constant_result
def _where(flags: tuple[bool, ...]) -> tuple[int, ...]:
    return tuple(index for index, flag in enumerate(flags) if flag)


def _tensordict_values(params: Any, route: Route) -> Sequence[Any] | None:
    """The leaves of a TensorDict in the Route's order; ``None`` if its keys differ from
    those the Route was built on (the TensorDict was changed in the trace)."""
    assert route.nodes is not None  # a TensorDict's Route
    nodes = descend([wrapped(params)._tensordict], route.nodes, entries_of)
    if not _same(tuple(map(tuple, nodes)), route.node_keys):
        return None
    return tuple(map(dict.__getitem__, pick(nodes, route.leaf_nodes), route.leaf_names))


# --- decided in eager, at trace time ---------------------------------------------------

_DECIDED: list[Route | None] = []  # what _decide found, until _decided takes it


def _decide(ctx: Any) -> None:
    """``comptime`` callback: the Route of the swap that ``resolve`` is tracing, from the
    real module and params behind Dynamo's variables; the trace is given ``None`` for a
    ``Generic`` reason (an enum member would be a guarded constant)."""
    route = _route_of(ctx)
    _DECIDED.append(route if isinstance(route, Route) else None)


@torch.compiler.assume_constant_result
def _decided() -> Route | None:
    """The Route ``_decide`` found, as a constant of the trace (no argument: no guard).
    Outside Dynamo (``torch.export(strict=False)``) nothing was decided: ``None``."""
    route = _DECIDED.pop() if _DECIDED else None
    _DECIDED.clear()  # nothing of an abandoned trace is left for the next one
    return route


@torch.compiler.assume_constant_result
def _same(seen: tuple, expected: tuple) -> bool:
    """Constant tuples compared in eager: traced, ``==`` on tuples steps per item."""
    return seen == expected


def _route_of(ctx: Any) -> Route | Generic:
    if has_pending_mutations(ctx):  # the module's real state is not the traced one
        return Generic.CHANGED_IN_TRACE
    if not torch._dynamo.config.skip_no_tensor_aliasing_guards_on_parameters:
        return Generic.ALIASING_GUARDS  # the generic path reads the module's tensors
    request = local_items(ctx, "request")  # resolve's, by name
    module = real_object(request["module"])
    tie_weights = request["tie_weights"].as_python_constant()
    if not isinstance(module, nn.Module):
        return Generic.NOT_A_MODULE
    shape = request["shape"].as_python_constant()
    shape = None if shape is None else [DictLevel(*level) for level in shape]
    preserve = request["make_parameters"].as_python_constant()
    if preserve and inside_higher_order_op(ctx):  # under vmap the values are batched
        return Generic.UNDER_VMAP
    if shape is None:
        params = real_object(request["params"])
        return route_of_tensordict(params, module, tie_weights, preserve)
    values = request["level_values"]
    facts_at = (lambda where: tensor_facts(values, where, ValueFacts)) if preserve else None
    return route_of_dict(shape, module, tie_weights, facts_at)
