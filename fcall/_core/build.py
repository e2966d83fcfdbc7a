"""The plan builder: every key of a params container to its slot in the module tree.

``build`` takes the key tuples of a flattened container and raises the errors (a
``Fault``, which the calling API words): an unknown key, a key given twice, a scripted
module, ``strict`` misses. One set of node functions (``_Node``, ``_node_at``,
``_add_leaf``) finds a key's module, and ``tree.Slots`` (the one name -> slot rule) its
slot. It runs in eager: for the eager plan cache (``plan.py``), for the traced front at trace time
(``traced.py``, which turns the plan into a Route), and, traced, for whatever a Route does
not cover (the generic path). ``complete`` adds the tied aliases and checks ``strict``.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn
from torch.nn.utils import parametrize

from .. import _errors
from .._errors import Fault, UnknownKey
from .ties import all_named_tensors, has_shared_submodule, names_and_ties
from .tree import Slots, strip, unwrap_for_keys
from .types import Key, Link, Node, Plan, SlotKind, SlotRef, TreeReads, new_entry

PARAMETER, ATTRIBUTE = SlotKind.PARAMETER, SlotKind.ATTRIBUTE


def build(
    module: nn.Module,
    keys: list[Key],
    *,
    tie_weights: bool,
    strict: bool,
    traced: bool = False,
) -> Plan:
    """The plan of ``keys`` (the key tuples of a flattened container) for ``module``;
    ``traced``: built in Dynamo's trace (the generic path), never cached."""
    root, prefixes = unwrap_for_keys(module)
    if isinstance(root, torch.jit.ScriptModule):  # its _modules has no .get(): refuse it
        raise Fault(RuntimeError, _errors.scripted_module, root)
    plan = Plan()
    plan.reads = reads = TreeReads()
    # Per dotted prefix, its node: each module on a key's path is found (and recorded in
    # reads.chain) once. Prefixes, not id()s: traced, id(module) guards on the module object,
    # and another instance of the same architecture would recompile.
    nodes = {"": _Node(root, plan)}
    for index in range(len(keys)):
        _add_key(plan, reads, nodes, root, strip(root, keys[index], prefixes), index)
    plan.given = len(plan.slots)
    if len(set(plan.names)) != plan.given:
        twice = sorted({name for name in plan.names if plan.names.count(name) > 1})
        raise Fault(KeyError, _errors.given_twice, twice)
    complete(plan, reads, nodes, root, tie_weights=tie_weights, strict=strict, traced=traced)
    if traced and reads.may_repeat_slots:  # finish() finds repeated slots by their owner
        reads.owners = [node.owner for node in nodes.values()]  # in plan.owners' order
    return plan.finish(cached=not traced)


def _add_key(
    plan: Plan,
    reads: TreeReads,
    nodes: dict[str, _Node],
    root: nn.Module,
    key: Key,
    leaf: int,
) -> None:
    """The entry of ``key`` (its value is leaf ``leaf``), or an ``UnknownKey`` fault."""
    prefix, name = ".".join(key[:-1]), key[-1]
    node = nodes.get(prefix)
    if node is None:
        node = _node_at(prefix, nodes, plan, reads)
    if node is None or not _add_leaf(node, name, leaf, plan):
        names = list(all_named_tensors(root))
        if node is not None and parametrize.is_parametrized(node.owner, name):
            start = f"{prefix}.parametrizations.{name}." if prefix else f"parametrizations.{name}."
            originals = [n for n in names if n.startswith(start + "original")]
            raise Fault(UnknownKey, _errors.parametrized_key, key, originals)
        raise Fault(UnknownKey, _errors.unknown_key, key, type(root).__name__, names)
    plan.names.append(prefix + "." + name if prefix else name)
    if not prefix:
        reads.root_dicts = (node.parameters, node.buffers)


def complete(
    plan: Plan,
    reads: TreeReads,
    nodes: dict[str, _Node],
    root: nn.Module,
    *,
    tie_weights: bool,
    strict: bool,
    traced: bool,
) -> None:
    """Add the tied aliases of the given entries (``nodes``: ``build``'s, by dotted
    prefix), and check ``strict``."""
    if not (tie_weights or strict):
        if traced:  # finish() must find a slot two entries name
            reads.may_repeat_slots = has_shared_submodule(root, set())
        return
    names, tied = names_and_ties(all_named_tensors(root))
    if tied:  # traced, finish() must still find a slot that two entries name
        reads.may_repeat_slots = True
    if tie_weights and tied:
        _add_tied_aliases(plan, reads, nodes, root, tied)
    if strict:
        missing = sorted(set(names) - set(plan.names))
        if missing:
            raise Fault(RuntimeError, _errors.missing_keys, type(root).__name__, missing)


def _add_tied_aliases(
    plan: Plan,
    reads: TreeReads,
    nodes: dict[str, _Node],
    root: nn.Module,
    tied: tuple[tuple[str, ...], ...],
) -> None:
    index_of_name = {name: i for i, name in enumerate(plan.names)}
    for group in tied:
        given = [index_of_name[name] for name in group if name in index_of_name]
        if not given:
            continue
        if len(given) > 1:
            plan.tie_sources.append([plan.leaves[i] for i in given])
        source = plan.leaves[given[0]]
        for name in group:
            if name not in index_of_name:
                index_of_name[name] = len(plan.slots)
                _add_key(plan, reads, nodes, root, tuple(name.split(".")), source)
        group_entries = [index_of_name[name] for name in group]
        refs = [SlotRef(plan.slots[i], plan.slot_names[i]) for i in group_entries]
        reads.tie_groups.append(refs)


def _node_at(prefix: str, nodes: dict[str, _Node], plan: Plan, reads: TreeReads) -> _Node | None:
    """The node of the submodule at dotted ``prefix``, recording each module on its path once."""
    parent_prefix, _, name = prefix.rpartition(".")
    parent = nodes.get(parent_prefix)
    if parent is None:
        parent = _node_at(parent_prefix, nodes, plan, reads) if parent_prefix else None
        if parent is None:
            return None
    child = parent.owner._modules.get(name)
    if child is None:
        return None
    reads.chain.append(Link(parent.owner._modules, name, child))
    depth = reads.owner_nodes[parent.index].depth + 1
    # the node's (made next); tuple.__new__: traced (the generic path), no class call
    reads.owner_nodes.append(new_entry(Node, (parent.index, name, depth)))
    nodes[prefix] = node = _Node(child, plan)
    return node


class _Node(Slots):
    """A module on a key's path, as the build reads it once: its slots (``Slots``: the one
    name -> slot rule) and its place in ``plan.owners``."""

    __slots__ = ("index",)

    def __init__(self, owner: nn.Module, plan: Plan) -> None:
        if isinstance(owner, nn.RNNBase):
            plan.rnns.append(weakref.ref(owner))
        Slots.__init__(self, owner)  # not super(): traced, fewer Dynamo steps per module
        self.index = len(plan.owners)  # its place in plan.owners
        plan.owners.append(owner.__dict__)


def _add_leaf(node: _Node, name: str, index: int, plan: Plan) -> bool:
    """The entry of ``name`` in ``node``'s module (value: leaf ``index``), or ``False``.
    A parameter's name is the rule's first case, asked here without a call: traced (the
    generic path), each call is Dynamo steps per leaf, and most names are parameters'."""
    if name in node.parameter_names:
        plan.add(node.parameters, name, index, PARAMETER, node.index)
        return True
    kind = node.kind_of(name)
    if kind is None:
        return False
    if kind is ATTRIBUTE:
        plan.has_attributes = True
    plan.add(node.dict_of(kind), name, index, kind, node.index)
    return True
