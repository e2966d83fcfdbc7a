"""The traced front: a swap's plan is decided in eager while Dynamo traces, and the trace
only reads, writes and restores.

Under Dynamo every Python step of the plan builder is compile time, per leaf. So the plan
is not traced: ``comptime`` hands Dynamo's view of the caller's locals to ``_decide`` at
trace time, which runs the one builder (``_build.build``) in eager on the real module and
keys, and turns its plan into a ``Route``: names and indexes only, no object of this
instance, so that one compiled frame serves every instance of the architecture.
``_decided`` (an ``assume_constant_result`` function of no argument) gives the Route to
the trace as a constant, with no guard. The trace then reaches the owner modules and the
params' nodes level by level, and reads and writes the slots, through builtins (``map``,
``getattr``, ``dict.__getitem__``) that Dynamo runs without stepping through bytecode.

Those same reads are the guards that keep the Route sound: each owner is reached through
its parent's ``_modules`` (the path, the module types), each owner's ``_parameters`` keys
(and ``_buffers`` keys where a buffer is swapped) and each params node's keys are read in
full, and compared with what the Route was built on. A module whose structure differs on a
later call fails one of them and recompiles; the new trace decides again.

Anything the Route does not cover returns ``None``, and the caller takes the generic
traced path (``build`` traced), which raises the eager errors: an unknown key, ``strict``,
tied names given or aliased, a submodule at two paths, a plain tensor attribute, RNNs,
FSDP2 and DDP trees, values that are not tensors, a module or params already changed in
the trace, and Dynamo's aliasing guards turned on (the generic path reads the module's
tensors, so that Dynamo guards their aliasing).
"""

from __future__ import annotations

import itertools
import operator
from typing import Any, NamedTuple

import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictParams as _TensorDictParamsBase
from torch import nn

from ._build import build
from ._compat import comptime, dynamo_variable, has_pending_mutations
from ._flatten import Key, Leaves, wrapped
from ._kinds import Entry, SlotKind, new_entry
from ._plan import Plan, unwrap

_repeat = itertools.repeat


class Levels(NamedTuple):
    """How the trace reaches the nodes of a tree below its root, a level at a time: the
    nodes of a level are ``node[name]`` of nodes of the level above."""

    parents: tuple[tuple[int, ...], ...]
    """Per level, the index of each node's parent in the level above."""
    names: tuple[tuple[str, ...], ...]
    """Per level, each node's name in its parent."""


class Route(NamedTuple):
    """A plan for the trace: where each value goes, as indexes and names."""

    owners: Levels
    """The owner modules below the root; the trace lists them root first, level by level."""
    owner_keys: tuple[tuple[str, ...], ...]
    """Per owner, the names in its ``_parameters``, as the Route was built on."""
    buffer_owners: tuple[int, ...]
    """The owners whose ``_buffers`` hold a swapped name."""
    buffer_keys: tuple[tuple[str, ...], ...]
    """Per buffer owner, the names in its ``_buffers``."""
    slots: tuple[int, ...]
    """Per entry, its dict: an owner's ``_parameters``, or (from ``len(owner_keys)`` on) the
    ``_buffers`` of ``buffer_owners[i - len(owner_keys)]``."""
    names: tuple[str, ...]
    """Per entry, its name in that dict."""
    kinds: tuple[SlotKind, ...]
    """Per entry, its kind (parameter or buffer)."""
    owner_of_entry: tuple[int, ...]
    """Per entry, its owner."""
    dotted: tuple[str, ...]
    """Per entry, its params key, dotted (the old values' keys)."""
    nodes: Levels | None
    """A TensorDict's nodes below the root; ``None``: a flat dict."""
    node_keys: tuple[tuple[str, ...], ...]
    """Per params node, its keys, as the Route was built on."""
    leaf_nodes: tuple[int, ...]
    """Per leaf, its params node."""
    leaf_names: tuple[str, ...]
    """Per leaf, its name in that node."""


def resolve(
    params: Any, module: nn.Module, api: str, tie_weights: bool, strict: bool
) -> tuple[Plan, Leaves] | None:
    """Traced only: the plan and leaves of ``params`` in ``module`` through a Route, or
    ``None`` for the generic path."""
    if strict:  # missing keys are a whole-tree question: the generic path asks it
        return None
    flat = isinstance(params, dict)
    names = tuple(params) if flat else None
    flags = tuple(map(isinstance, params.values(), _repeat(torch.Tensor))) if flat else None
    comptime(_decide)  # reads module, params, names, flags, api, tie_weights (locals here)
    route = _decided()
    if route is None:
        return None
    values = _values(params, route)
    if values is None:
        return None
    root, _ = unwrap(module)
    owners = _descend([root], route.owners, _modules_of)
    parameters = list(map(getattr, owners, _repeat("_parameters")))
    if not _same(tuple(map(tuple, parameters)), route.owner_keys):
        return None
    dicts = parameters
    if route.buffer_owners:
        buffers = list(map(getattr, _pick(owners, route.buffer_owners), _repeat("_buffers")))
        if not _same(tuple(map(tuple, buffers)), route.buffer_keys):
            return None
        dicts = parameters + buffers
    leaves = Leaves(params, api)
    leaves.values = values
    return _plan(route, _pick(dicts, route.slots), owners), leaves


def _values(params: Any, route: Route) -> list[Any] | None:
    """The leaves of ``params`` in the Route's order; ``None`` if its keys differ."""
    if route.nodes is None:
        if not _same((tuple(params),), route.node_keys):
            return None
        return list(params.values())
    nodes = _descend([wrapped(params)._tensordict], route.nodes, _entries_of)
    if not _same(tuple(map(tuple, nodes)), route.node_keys):
        return None
    return list(map(dict.__getitem__, _pick(nodes, route.leaf_nodes), route.leaf_names))


def _modules_of(level: list) -> list:
    return list(map(getattr, level, _repeat("_modules")))


def _entries_of(level: list) -> list:
    return level


def _descend(top: list, levels: Levels, containers: Any) -> list:
    """The nodes of ``levels`` below ``top``: ``top`` first, then each level."""
    found = list(top)
    level = top
    for parents, names in zip(levels.parents, levels.names):
        level = list(map(dict.__getitem__, containers(_pick(level, parents)), names))
        if containers is _entries_of:  # a TensorDict node: its entries
            level = list(map(getattr, level, _repeat("_tensordict")))
        found.extend(level)
    return found


def _pick(items: list, indexes: tuple[int, ...]) -> list:
    """``[items[i] for i in indexes]`` in one builtin call (``operator.itemgetter`` is a
    polyfill that Dynamo steps through per item)."""
    return list(map(operator.getitem, _repeat(items), indexes))


def _plan(route: Route, slots: list[dict], owners: list[nn.Module]) -> Plan:
    """The engine's Plan of ``route`` in the traced module: entry ``i`` takes leaf ``i``."""
    plan = Plan()
    count = len(route.names)
    attributes = list(map(getattr, _pick(owners, route.owner_of_entry), _repeat("__dict__")))
    plan.entries = list(
        map(
            new_entry,
            _repeat(Entry),
            zip(slots, route.names, range(count), attributes, route.kinds),
        )
    )
    plan.given = count
    plan.names = list(route.dotted)
    plan.slots = slots
    plan.slot_names = list(route.names)
    plan.pairs = list(zip(slots, route.names))
    plan.names_are_keys = True
    plan.traced = True
    plan.distributed = ""  # neither FSDP2 nor DDP: _decide checked
    return plan


# --- decided in eager, at trace time ---------------------------------------------------

_DECIDED: list[Route | None] = []  # what _decide found, until _decided takes it


def _decide(ctx: Any) -> None:
    """``comptime`` callback: the Route of the swap that ``resolve`` is tracing, from the
    real module and params behind Dynamo's variables (``None``: the generic path)."""
    try:
        route = _route_of(ctx)
    except Exception:  # whatever this cannot decide, the generic path decides (and raises)
        route = None
    _DECIDED.append(route)


@torch.compiler.assume_constant_result
def _decided() -> Route | None:
    """The Route ``_decide`` found, as a constant of the trace (no argument: no guard).
    Outside Dynamo (``torch.export(strict=False)``) nothing was decided: ``None``."""
    return _DECIDED.pop() if _DECIDED else None


@torch.compiler.assume_constant_result
def _same(seen: tuple, expected: tuple) -> bool:
    """Constant tuples compared in eager: traced, ``==`` on tuples steps per item."""
    return seen == expected


def _route_of(ctx: Any) -> Route | None:
    if has_pending_mutations(ctx):  # the module's real state is not the traced one
        return None
    if not torch._dynamo.config.skip_no_tensor_aliasing_guards_on_parameters:
        return None  # the generic path reads the module's tensors: Dynamo guards aliasing
    module = dynamo_variable(ctx, "module")
    api = ctx.get_local("api").as_python_constant()
    tie_weights = ctx.get_local("tie_weights").as_python_constant()
    if not isinstance(module, nn.Module):
        return None
    names = ctx.get_local("names").as_python_constant()
    if names is not None:
        if not all(ctx.get_local("flags").as_python_constant()):
            return None
        if not names or not all(isinstance(name, str) and name for name in names):
            return None
        return _route(module, [tuple(name.split(".")) for name in names], api, tie_weights)
    params = dynamo_variable(ctx, "params")
    return _tensordict_route(params, module, api, tie_weights)


def _tensordict_route(params: Any, module: nn.Module, api: str, tie_weights: bool) -> Any:
    if type(params) is TensorDict:
        entries = params._tensordict
    elif isinstance(params, _TensorDictParamsBase) and type(params._param_td) is TensorDict:
        entries = params._param_td._tensordict
    else:
        return None
    keys: list[Key] = []
    nodes: list[tuple[int, str, int]] = []  # (node, name in its parent, depth), root first
    node_keys: list[tuple[str, ...]] = []
    leaf_nodes: list[int] = []
    leaf_names: list[str] = []
    if not _walk(entries, (), 0, 0, keys, nodes, node_keys, leaf_nodes, leaf_names):
        return None
    levels, order = _levels([(parent, name, depth) for parent, name, depth in nodes])
    route = _route(module, keys, api, tie_weights)
    if route is None:
        return None
    return route._replace(
        nodes=levels,
        node_keys=tuple(node_keys[i] for i in order),
        leaf_nodes=tuple(order.index(node) for node in leaf_nodes),
        leaf_names=tuple(leaf_names),
    )


def _walk(
    entries: dict,
    prefix: Key,
    node: int,
    depth: int,
    keys: list[Key],
    nodes: list[tuple[int, str, int]],
    node_keys: list[tuple[str, ...]],
    leaf_nodes: list[int],
    leaf_names: list[str],
) -> bool:
    """The leaves of exact TensorDicts of plain tensors and Parameters, in
    ``flatten_eager``'s order; ``False`` on anything else."""
    if node == 0:
        nodes.append((-1, "", 0))
        node_keys.append(())
    node_keys[node] = tuple(entries)
    for name, value in entries.items():
        if not isinstance(name, str) or "." in name or not name:
            return False
        cls = type(value)
        if cls is torch.Tensor or cls is nn.Parameter:
            keys.append((*prefix, name))
            leaf_nodes.append(node)
            leaf_names.append(name)
        elif cls is TensorDict:
            child = len(nodes)
            nodes.append((node, name, depth + 1))
            node_keys.append(())
            if not _walk(
                value._tensordict,
                (*prefix, name),
                child,
                depth + 1,
                keys,
                nodes,
                node_keys,
                leaf_nodes,
                leaf_names,
            ):
                return False
        else:
            return False
    return True


def _levels(nodes: list[tuple[int, str, int]]) -> tuple[Levels, list[int]]:
    """``nodes`` (parent, name, depth; the root first) as Levels, and the trace's order of
    the nodes (root first, level by level) as a list of their indexes in ``nodes``."""
    order = [0]
    parents: list[tuple[int, ...]] = []
    names: list[tuple[str, ...]] = []
    depth = 1
    while True:
        above = {node: i for i, node in enumerate(n for n in order if nodes[n][2] == depth - 1)}
        level = [i for i, node in enumerate(nodes) if node[2] == depth]
        if not level:
            return Levels(tuple(parents), tuple(names)), order
        parents.append(tuple(above[nodes[i][0]] for i in level))
        names.append(tuple(nodes[i][1] for i in level))
        order.extend(level)
        depth += 1


def _route(module: nn.Module, keys: list[Key], api: str, tie_weights: bool) -> Route | None:
    """The Route of ``keys`` in ``module``: the one builder's plan, as names and indexes."""
    root, prefixes = unwrap(module)
    if "module" in prefixes or _has_fsdp(root) or not keys:
        return None
    try:
        plan = build(module, keys, api, tie_weights=tie_weights, strict=False)
    except Exception:  # the generic path raises it, traced
        return None
    if plan.rnns or plan.has_attributes or plan.tie_groups or len(plan.entries) != plan.given:
        return None
    # Each owner once: a module at two paths, or a slot named twice, takes the generic path
    found: list[tuple[int, str, int]] = [(-1, "", 0)]  # (parent, name, depth) per owner
    index_of = {id(root.__dict__): 0}
    by_modules = {id(root._modules): 0}
    for parent_modules, name, child in plan.chain:
        parent = by_modules.get(id(parent_modules))
        if parent is None or id(child.__dict__) in index_of:
            return None
        index_of[id(child.__dict__)] = len(found)
        by_modules[id(child._modules)] = len(found)
        found.append((parent, name, found[parent][2] + 1))
    levels, order = _levels(found)
    position = {node: i for i, node in enumerate(order)}
    owners = [_owner(root, found, node) for node in order]
    owner_keys = tuple(tuple(owner._parameters) for owner in owners)
    buffer_owners: list[int] = []
    slots: list[int] = []
    owner_of_entry: list[int] = []
    seen: set[tuple[int, str]] = set()
    for entry in plan.entries:
        owner = position[index_of[id(entry.attributes)]]
        if type(entry.slot) is not dict or (id(entry.slot), entry.name) in seen:
            return None
        seen.add((id(entry.slot), entry.name))
        if entry.kind is SlotKind.PARAMETER:
            slots.append(owner)
        elif owner in buffer_owners:
            slots.append(len(owners) + buffer_owners.index(owner))
        else:
            buffer_owners.append(owner)
            slots.append(len(owners) + len(buffer_owners) - 1)
        owner_of_entry.append(owner)
    return Route(
        owners=levels,
        owner_keys=owner_keys,
        buffer_owners=tuple(buffer_owners),
        buffer_keys=tuple(tuple(owners[i]._buffers) for i in buffer_owners),
        slots=tuple(slots),
        names=tuple(entry.name for entry in plan.entries),
        kinds=tuple(entry.kind for entry in plan.entries),
        owner_of_entry=tuple(owner_of_entry),
        dotted=tuple(".".join(key) for key in keys),
        nodes=None,
        node_keys=(tuple(".".join(key) for key in keys),),
        leaf_nodes=(),
        leaf_names=(),
    )


def _owner(root: nn.Module, found: list[tuple[int, str, int]], node: int) -> nn.Module:
    path = []
    while node > 0:
        parent, name, _ = found[node]
        path.append(name)
        node = parent
    owner = root
    for name in reversed(path):
        owner = owner._modules[name]
    return owner


def _has_fsdp(root: nn.Module) -> bool:
    from ._distributed import FSDPModule  # noqa: PLC0415 (its import pulls torch.distributed)

    return FSDPModule is not None and any(isinstance(m, FSDPModule) for m in root.modules())
