"""Routes: a swap's layout and what its trace checks, decided in eager at trace time.

A ``Route`` is what a traced swap (``fcall/_core/traced.py``) needs of a plan and nothing of the
instance it was built on: the one builder's layout (which owner modules to reach from the root,
which of their dicts each value goes into, under which name), the keys of those dicts the
trace compares, and where each value is in the params. The layout is bound here, in eager, by
the trace's own code (``bind.py``), to read what the trace will check.
It is built at trace time from the real module and keys: ``route_of_dict`` for a dict (whose
structure the trace read), ``route_of_tensordict`` for a TensorDict (read here); where no
Route covers the swap, the reason it takes the generic path (``Generic``).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictParams as _TensorDictParamsBase
from torch import nn

from .._compat import SKIPPED_TENSOR_GUARDS
from .._errors import Fault
from .bind import bind, reach
from .build import build, levels_of
from .registration import dict_groups, ends_with
from .slot_values import Into, into, reads_old
from .tree import unwrap
from .types import ROOT_NODE, DictLevel, Key, Levels, Node, Plan, PlanLayout


class Generic(enum.Enum):
    """Why a traced swap takes the generic path (``build`` traced, fcall/README.md) and not a
    Route. Decided at trace time, in eager; the trace gets only "no Route"."""

    CHANGED_IN_TRACE = "the trace changed the module or the params before the swap"
    ALIASING_GUARDS = "Dynamo guards the aliasing of Parameters: the module's tensors are read"
    NOT_A_MODULE = "the module is not an nn.Module that existed before the trace"
    UNDER_VMAP = "to_module's PRESERVE under vmap: the values are batched"
    CONTAINER = "neither a dict nor an exact TensorDict (or TensorDictParams of one)"
    KEY_FORM = "a key that is not a non-empty string (or, in a TensorDict, has a dot)"
    NOT_TENSORS = "a value that is neither a tensor nor a nested container"
    NO_KEYS = "no key at all"
    DDP = "a DistributedDataParallel wrapper"
    FSDP = "an FSDP2 tree"
    BUILDER_RAISED = "the builder raised (an unknown key, a name twice, a scripted module)"
    ATTRIBUTE = "a plain tensor attribute"
    TIED = "a tied name given, or a given name aliased"
    REPEATED = "a submodule at two paths, or a slot named twice"
    DICT_SUBCLASS = "a slot dict of a dict subclass"
    PARAMETER_FOR_BUFFER = "to_module's PRESERVE: a Parameter bound for a buffer slot"
    NOT_TRACED_TENSORS = "to_module's PRESERVE: a value that is not a traced tensor"


class Preserve(NamedTuple):
    """``to_module``'s ``PRESERVE`` rule for a Route's entries, decided on the real values
    and old tensors (``fcall/_core/slot_values.py``'s rule)."""

    wrap: tuple[int, ...]
    """The entries whose value becomes a Parameter with its old tensor's ``requires_grad``..."""
    wrap_requires_grad: tuple[bool, ...]
    """... which is this (checked in the trace)."""
    kept: tuple[int, ...]
    """The entries whose value, a Parameter, stays: its old tensor has its ``requires_grad``..."""
    kept_requires_grad: tuple[bool, ...]
    """... which is this (checked in the trace)."""
    empty: tuple[int, ...]
    """The parameter slots that hold ``None``: their value goes in as it is (checked)."""
    order: tuple[int, ...]
    """Where each leaf's value is in ``values + made`` (``made``: the ``wrap`` Parameters)."""
    unskippable: bool
    """Whether the trace gives each old tensor it reads a guard that Dynamo cannot skip
    (``_compat.SKIPPED_TENSOR_GUARDS``: Dynamo 2.11 skips a module's tensor guards)."""


class Route(NamedTuple):
    """A plan for the trace: the builder's layout, and what the trace checks and reads of the
    module and the params, as indexes and names."""

    layout: PlanLayout
    """Where each value goes (``bind.bind`` binds it in the trace)."""
    owner_keys: tuple[tuple[str, ...], ...]
    """Per owner, the names in its ``_parameters``, as the Route was built on."""
    buffer_keys: tuple[tuple[str, ...], ...]
    """Per buffer owner (``PlanLayout.buffer_owners``), the names in its ``_buffers``."""
    dotted: tuple[str, ...]
    """Per entry, its params key, dotted (the old values' keys)."""
    nodes: Levels | None
    """A TensorDict's nodes below the root; ``None``: a dict (``_dict_shape``)."""
    node_keys: tuple[tuple[str, ...], ...]
    """A TensorDict's: per node, its keys, as the Route was built on."""
    leaf_nodes: tuple[int, ...]
    """Per leaf, its TensorDict node; a dict's: its place among ``_dict_shape``'s values."""
    leaf_names: tuple[str, ...]
    """Per leaf, its name in that node."""
    group_slots: tuple[int, ...]
    """``to_module``: the dicts whose names written are not already last in them, in order
    (tensordict's registration order moves them, fcall/_core/registration.py)..."""
    group_names: tuple[tuple[str, ...], ...]
    """... and those names, in order."""
    preserve: Preserve | None
    """``to_module``'s ``PRESERVE``: what each value goes in as."""


def route_of_dict(
    shape: list[DictLevel],
    module: nn.Module,
    tie_weights: bool,
    facts_at: Callable[[tuple[int, ...]], list[ValueFacts] | None] | None = None,
) -> Route | Generic:
    """The Route of a dict whose structure is ``shape`` (``_dict_shape``): its leaves in
    ``flatten_generic``'s order (depth first, each name split at its dots). ``facts_at``
    (``to_module``'s ``PRESERVE``): the facts of the values at these places of the trace's
    values, or ``None`` where one is not a traced tensor."""
    keys: list[Key] = []
    positions: list[int] = []
    starts = []  # per level, where its values begin among every level's values
    total = 0
    for level in shape:
        starts.append(total)
        total += sum(map(len, level.keys))

    def visit(depth: int, node: int, prefix: Key) -> Generic | None:
        level = shape[depth]
        node_keys, is_dict, is_tensor = level.keys, level.is_dict, level.is_tensor
        offset = sum(map(len, node_keys[:node]))
        for place, name in enumerate(node_keys[node]):
            if not isinstance(name, str) or not name:
                return Generic.KEY_FORM
            key = (*prefix, *name.split("."))
            index = offset + place
            if is_tensor[index]:
                keys.append(key)
                positions.append(starts[depth] + index)
            elif not is_dict[index]:
                return Generic.NOT_TENSORS
            elif (below := visit(depth + 1, sum(is_dict[:index]), key)) is not None:
                return below
        return None

    declined = visit(0, 0, ())
    if declined is not None:
        return declined
    where = tuple(positions)
    facts = None if facts_at is None else lambda: facts_at(where)
    route = _route(module, keys, tie_weights, facts)
    if isinstance(route, Generic):
        return route
    return route._replace(leaf_nodes=where)


def route_of_tensordict(
    params: Any, module: nn.Module, tie_weights: bool, preserve: bool = False
) -> Route | Generic:
    if type(params) is TensorDict:
        entries = params._tensordict
    elif isinstance(params, _TensorDictParamsBase) and type(params._param_td) is TensorDict:
        entries = params._param_td._tensordict
    else:
        return Generic.CONTAINER
    tree = _TensorDictTree()
    declined = _walk(entries, (), 0, 0, tree)
    if declined is not None:
        return declined
    levels, order = levels_of(tree.nodes)
    facts = functools.partial(_facts_of, tree.values) if preserve else None
    route = _route(module, tree.keys, tie_weights, facts)
    if isinstance(route, Generic):
        return route
    return route._replace(
        nodes=levels,
        node_keys=tuple(tree.node_keys[i] for i in order),
        leaf_nodes=tuple(order.index(node) for node in tree.leaf_nodes),
        leaf_names=tuple(tree.leaf_names),
    )


@dataclass(slots=True)
class _TensorDictTree:
    """What ``_walk`` finds in exact TensorDicts: per leaf its key, node, name and value;
    per node (the root first) its place in the tree and its keys."""

    keys: list[Key] = field(default_factory=list)
    leaf_nodes: list[int] = field(default_factory=list)
    leaf_names: list[str] = field(default_factory=list)
    values: list[Any] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=lambda: [ROOT_NODE])
    node_keys: list[tuple[str, ...]] = field(default_factory=lambda: [()])


def _walk(
    entries: dict, prefix: Key, node: int, depth: int, tree: _TensorDictTree
) -> Generic | None:
    """The leaves of exact TensorDicts of plain tensors and Parameters, in
    ``flatten_eager``'s order, into ``tree``; why not, on anything else."""
    tree.node_keys[node] = tuple(entries)
    for name, value in entries.items():
        if not isinstance(name, str) or "." in name or not name:
            return Generic.KEY_FORM
        cls = type(value)
        if cls is torch.Tensor or cls is nn.Parameter:
            tree.keys.append((*prefix, name))
            tree.leaf_nodes.append(node)
            tree.leaf_names.append(name)
            tree.values.append(value)
        elif cls is TensorDict:
            child = len(tree.nodes)
            tree.nodes.append(Node(node, name, depth + 1))
            tree.node_keys.append(())
            declined = _walk(value._tensordict, (*prefix, name), child, depth + 1, tree)
            if declined is not None:
                return declined
        else:
            return Generic.NOT_TENSORS
    return None


def _facts_of(values: list[Any]) -> list[ValueFacts]:
    return [ValueFacts(isinstance(value, nn.Parameter), value.requires_grad) for value in values]


def _route(
    module: nn.Module,
    keys: list[Key],
    tie_weights: bool,
    facts: Callable[[], list[ValueFacts] | None] | None,
) -> Route | Generic:
    """The Route of ``keys`` in ``module``: the one builder's layout, bound here in eager to
    read what the trace checks; with ``facts`` (``to_module``'s ``PRESERVE``), what each
    value goes in as."""
    root, prefixes = unwrap(module)
    if "module" in prefixes:
        return Generic.DDP
    if _has_fsdp(root):
        return Generic.FSDP
    if not keys:
        return Generic.NO_KEYS
    try:
        layout = build(module, keys, tie_weights=tie_weights, strict=False)
    except Fault:  # the builder's own errors: the generic path raises them, traced
        return Generic.BUILDER_RAISED
    declined = _declined(layout)
    if declined is not None:
        return declined
    owners, dicts = reach(layout, root)
    if len({id(owner) for owner in owners}) != len(owners):
        return Generic.REPEATED  # a module at two paths (no slot of it named twice)
    if any(type(dicts[slot]) is not dict for slot in set(layout.slots)):
        return Generic.DICT_SUBCLASS
    plan = bind(layout, owners, dicts, False)
    preserve: Preserve | None = None
    if facts is not None:
        found = facts()
        if found is None:
            return Generic.NOT_TRACED_TENSORS
        decided = _preserve(plan, found)
        if isinstance(decided, Generic):
            return decided
        preserve = decided
    moved = _moved_groups(plan, dicts)
    return Route(
        layout=layout,
        owner_keys=tuple(map(tuple, dicts[: len(owners)])),
        buffer_keys=tuple(map(tuple, dicts[len(owners) :])),
        dotted=tuple(".".join(key) for key in keys),
        nodes=None,
        node_keys=(),
        leaf_nodes=(),
        leaf_names=(),
        group_slots=tuple(group.slot for group in moved),
        group_names=tuple(tuple(group.names) for group in moved),
        preserve=preserve,
    )


def _declined(layout: PlanLayout) -> Generic | None:
    """Why the builder's ``layout`` takes the generic path, if it does."""
    if layout.repeated:
        return Generic.REPEATED
    if layout.tie_groups or len(layout.slots) != layout.given:  # the tied names added
        return Generic.TIED
    if layout.has_attributes:
        return Generic.ATTRIBUTE
    return None


class _Group(NamedTuple):
    """A dict (as its slot index) whose names the registration order moves last."""

    slot: int
    names: list[str]


def _moved_groups(plan: Plan, dicts: tuple[dict, ...]) -> list[_Group]:
    """to_module's registration order: registration's groups, each dict as its index in
    ``dicts`` (``bind.reach``'s). A dict that already ends with its names, in order, is left
    as it is (the trace checks its keys, in order, against these: ``traced.resolve``)."""
    index_of = {id(slot): index for index, slot in enumerate(dicts)}
    groups = (_Group(index_of[id(group.slot)], group.names) for group in dict_groups(plan))
    return [group for group in groups if not ends_with(dicts[group.slot], group.names)]


def _has_fsdp(root: nn.Module) -> bool:
    from .distributed import fsdp_modules

    return bool(fsdp_modules(root))


class ValueFacts(NamedTuple):
    """What ``PRESERVE`` reads of a value (``slot_values.into``)."""

    is_parameter: bool
    requires_grad: bool


def _preserve(plan: Plan, facts: list[ValueFacts]) -> Preserve | Generic:
    """``PRESERVE`` decided for each entry of ``plan`` on its value's ``facts`` and its slot's
    old tensor (the builder's slots), by ``slot_values.into``; the generic path for a
    Parameter bound for a buffer slot. Not batched: no Route is made under vmap. The trace
    checks what the rule read: the old tensors' ``requires_grad`` (``wrap``, ``kept``), a
    slot holding ``None`` (``empty``)."""
    wrap, wrap_requires_grad, kept, kept_requires_grad, empty = [], [], [], [], []
    for index, (fact, kind, slot, name) in enumerate(
        zip(facts, plan.kinds, plan.slots, plan.slot_names)
    ):
        if not reads_old(kind, fact.is_parameter, fact.requires_grad, False):
            if into(kind, fact.is_parameter, fact.requires_grad, False, None) is not Into.AS_IS:
                return Generic.PARAMETER_FOR_BUFFER
            continue  # in as it is, the old tensor unread
        old = slot[name]
        decision = into(kind, fact.is_parameter, fact.requires_grad, False, old)
        if old is None:
            empty.append(index)
        elif decision is Into.AS_IS:
            kept.append(index)
            kept_requires_grad.append(old.requires_grad)
        else:
            wrap.append(index)
            wrap_requires_grad.append(old.requires_grad)
    count = len(facts)
    position = {index: count + i for i, index in enumerate(wrap)}
    return Preserve(
        wrap=tuple(wrap),
        wrap_requires_grad=tuple(wrap_requires_grad),
        kept=tuple(kept),
        kept_requires_grad=tuple(kept_requires_grad),
        empty=tuple(empty),
        order=tuple(position.get(index, index) for index in range(count)),
        unskippable=SKIPPED_TENSOR_GUARDS,
    )
