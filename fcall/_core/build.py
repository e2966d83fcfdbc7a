"""The plan builder: every key of a params container to its slot in the module tree, as a
``PlanLayout`` of names and indexes (no object of the instance it read).

``build`` takes the key tuples of a flattened container and raises the errors (a
``Fault``, which the calling API words): an unknown key, a key given twice, a scripted
module, ``strict`` misses. One set of node functions (``_Node``, ``_node_at``,
``_add_leaf``) finds a key's module, and ``tree.Slots`` (the one name -> slot rule) its
slot. ``complete`` adds the tied aliases and checks ``strict``; ``_layout`` turns what the
walk found into the layout: the owner modules as the trace reaches them (root first, level by
level, ``levels_of``), each entry's dict as an index into their dicts. ``bind.bind`` binds a
layout to a module. It runs in eager: for the eager plan cache (``plan.py``), for the traced
front at trace time (``routes.py``, which hands the layout to the trace in a Route), and,
traced, for whatever a Route does not cover (the generic path).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn.utils import parametrize

from .. import _errors
from .._errors import Fault, UnknownKey
from .ties import all_named_tensors, has_shared_submodule, names_and_ties
from .tree import Slots, strip, unwrap_for_keys
from .types import ROOT_NODE, SLOT_KINDS, Key, Levels, Node, PlanLayout, SlotKind

PARAMETER, BUFFER, ATTRIBUTE = SlotKind.PARAMETER, SlotKind.BUFFER, SlotKind.ATTRIBUTE
KIND_INDEX = {kind: index for index, kind in enumerate(SLOT_KINDS)}  # PlanLayout.kinds


def build(
    module: nn.Module,
    keys: list[Key],
    *,
    tie_weights: bool,
    strict: bool,
    traced: bool = False,
) -> PlanLayout:
    """The layout of ``keys`` (the key tuples of a flattened container) in ``module``;
    ``traced``: built in Dynamo's trace (the generic path)."""
    root, prefixes = unwrap_for_keys(module)
    if isinstance(root, torch.jit.ScriptModule):  # its _modules has no .get(): refuse it
        raise Fault(RuntimeError, _errors.scripted_module, root)
    draft = _Draft()
    # Per dotted prefix, its node: each module on a key's path is found once. Prefixes, not
    # id()s: traced, id(module) guards on the module object, and another instance of the
    # same architecture would recompile.
    nodes = {"": _Node(root, draft)}
    for index in range(len(keys)):
        _add_key(draft, nodes, root, strip(root, keys[index], prefixes), index)
    draft.given = len(draft.slot_names)
    if len(set(draft.names)) != draft.given:
        twice = sorted({name for name in draft.names if draft.names.count(name) > 1})
        raise Fault(KeyError, _errors.given_twice, twice)
    complete(draft, nodes, root, tie_weights=tie_weights, strict=strict, traced=traced)
    if not traced or draft.may_repeat_slots:  # traced, id() guards: only where slots may repeat
        _find_repeated(draft)
    return _layout(draft)


class _Draft:
    """What the walk finds, in its own order: per entry (the given keys first, then tied
    aliases) its dotted name, slot name, leaf, kind and owner (an index into ``nodes``); per
    owner module (the root first, then each module on a key's path, once per path) its node."""

    __slots__ = (
        "given",
        "has_attributes",
        "kinds",
        "leaves",
        "may_repeat_slots",
        "names",
        "node_depths",
        "node_names",
        "node_parents",
        "nodes",
        "owner_of_entry",
        "repeated",
        "repeated_first",
        "rnn_owners",
        "slot_names",
        "tie_groups",
        "tie_sources",
    )

    def __init__(self) -> None:
        self.names: list[str] = []
        self.slot_names: list[str] = []
        self.leaves: list[int] = []
        self.kinds: list[SlotKind] = []
        self.owner_of_entry: list[int] = []
        self.given = 0
        self.nodes: list[_Node] = []
        # per owner, where it is in the tree (a Node's fields, as columns: traced, plain
        # constants that _layout_of takes as they are)
        self.node_parents: list[int] = [ROOT_NODE.parent]
        self.node_names: list[str] = [ROOT_NODE.name]
        self.node_depths: list[int] = [ROOT_NODE.depth]
        self.rnn_owners: list[int] = []
        self.has_attributes = False
        self.tie_sources: list[tuple[int, ...]] = []
        self.tie_groups: list[tuple[int, ...]] = []
        self.may_repeat_slots = False
        self.repeated: list[int] = []
        self.repeated_first: list[int] = []


def _add_key(draft: _Draft, nodes: dict[str, _Node], root: nn.Module, key: Key, leaf: int) -> None:
    """The entry of ``key`` (its value is leaf ``leaf``), or an ``UnknownKey`` fault."""
    prefix, name = ".".join(key[:-1]), key[-1]
    node = nodes.get(prefix)
    if node is None:
        node = _node_at(prefix, nodes, draft)
    if node is None or not _add_leaf(node, name, leaf, draft):
        names = list(all_named_tensors(root))
        if node is not None and parametrize.is_parametrized(node.owner, name):
            start = f"{prefix}.parametrizations.{name}." if prefix else f"parametrizations.{name}."
            originals = [n for n in names if n.startswith(start + "original")]
            raise Fault(UnknownKey, _errors.parametrized_key, key, originals)
        raise Fault(UnknownKey, _errors.unknown_key, key, type(root).__name__, names)
    draft.names.append(prefix + "." + name if prefix else name)


def complete(
    draft: _Draft,
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
        if traced:  # _find_repeated must find a slot two entries name
            draft.may_repeat_slots = has_shared_submodule(root, set())
        return
    names, tied = names_and_ties(all_named_tensors(root))
    if tied:  # traced, _find_repeated must still find a slot that two entries name
        draft.may_repeat_slots = True
    if tie_weights and tied:
        _add_tied_aliases(draft, nodes, root, tied)
    if strict:
        missing = sorted(set(names) - set(draft.names))
        if missing:
            raise Fault(RuntimeError, _errors.missing_keys, type(root).__name__, missing)


def _add_tied_aliases(
    draft: _Draft, nodes: dict[str, _Node], root: nn.Module, tied: tuple[tuple[str, ...], ...]
) -> None:
    index_of_name = {name: i for i, name in enumerate(draft.names)}
    for group in tied:
        given = [index_of_name[name] for name in group if name in index_of_name]
        if not given:
            continue
        if len(given) > 1:
            draft.tie_sources.append(tuple(draft.leaves[i] for i in given))
        source = draft.leaves[given[0]]
        for name in group:
            if name not in index_of_name:
                index_of_name[name] = len(draft.slot_names)
                _add_key(draft, nodes, root, tuple(name.split(".")), source)
        draft.tie_groups.append(tuple(index_of_name[name] for name in group))


def _node_at(prefix: str, nodes: dict[str, _Node], draft: _Draft) -> _Node | None:
    """The node of the submodule at dotted ``prefix``, recording each module on its path once."""
    parent_prefix, _, name = prefix.rpartition(".")
    parent = nodes.get(parent_prefix)
    if parent is None:
        parent = _node_at(parent_prefix, nodes, draft) if parent_prefix else None
        if parent is None:
            return None
    child = parent.owner._modules.get(name)
    if child is None:
        return None
    draft.node_parents.append(parent.index)  # the node's (made next)
    draft.node_names.append(name)
    draft.node_depths.append(draft.node_depths[parent.index] + 1)
    nodes[prefix] = node = _Node(child, draft)
    return node


class _Node(Slots):
    """A module on a key's path, as the build reads it once: its slots (``Slots``: the one
    name -> slot rule) and its place in the draft's owners."""

    __slots__ = ("index",)

    def __init__(self, owner: nn.Module, draft: _Draft) -> None:
        Slots.__init__(self, owner)  # not super(): traced, fewer Dynamo steps per module
        self.index = len(draft.nodes)
        if isinstance(owner, nn.RNNBase):
            draft.rnn_owners.append(self.index)
        draft.nodes.append(self)


def _add_leaf(node: _Node, name: str, leaf: int, draft: _Draft) -> bool:
    """The entry of ``name`` in ``node``'s module (value: leaf ``leaf``), or ``False``.
    A parameter's name is the rule's first case, asked here without a call: traced (the
    generic path), each call is Dynamo steps per leaf, and most names are parameters'."""
    kind = PARAMETER if name in node.parameter_names else node.kind_of(name)
    if kind is None:
        return False
    if kind is ATTRIBUTE:
        draft.has_attributes = True
    draft.slot_names.append(name)
    draft.leaves.append(leaf)
    draft.kinds.append(kind)
    draft.owner_of_entry.append(node.index)
    return True


def _find_repeated(draft: _Draft) -> None:
    """A submodule registered at two paths gives two entries one slot: the first path's
    value goes in, as tensordict's ``to_module`` visits a module once. The later entries
    take the first one's leaf and are marked repeated; they are written and restored as
    plain entries, never written back into params. A slot is told by its owner module and
    its name (a module's names are unique over its dicts; traced, Dynamo 2.11-2.12 traces
    ``id()`` of a module, not of a dict)."""
    first: dict[tuple[int, str], int] = {}
    nodes, owner_of_entry, leaves = draft.nodes, draft.owner_of_entry, draft.leaves
    for index in range(len(draft.slot_names)):
        identity = id(nodes[owner_of_entry[index]].owner)
        seen = first.setdefault((identity, draft.slot_names[index]), index)
        if seen != index:
            leaves[index] = leaves[seen]
            draft.repeated.append(index)
            draft.repeated_first.append(seen)


def _layout(draft: _Draft) -> PlanLayout:
    """The draft as a layout (``_layout_of``), from its columns: traced, constants."""
    return _layout_of(
        node_parents=tuple(draft.node_parents),
        node_names=tuple(draft.node_names),
        node_depths=tuple(draft.node_depths),
        kinds=tuple(draft.kinds),
        owner_of_entry=tuple(draft.owner_of_entry),
        slot_names=tuple(draft.slot_names),
        leaves=tuple(draft.leaves),
        names=tuple(draft.names),
        given=draft.given,
        tie_sources=tuple(draft.tie_sources),
        tie_groups=tuple(draft.tie_groups),
        repeated=tuple(draft.repeated),
        repeated_first=tuple(draft.repeated_first),
        rnn_owners=tuple(draft.rnn_owners),
        has_attributes=draft.has_attributes,
    )


@torch.compiler.assume_constant_result
def _layout_of(
    *,
    node_parents: tuple[int, ...],
    node_names: tuple[str, ...],
    node_depths: tuple[int, ...],
    kinds: tuple[SlotKind, ...],
    owner_of_entry: tuple[int, ...],
    rnn_owners: tuple[int, ...],
    **entries: Any,
) -> PlanLayout:
    """A draft's columns as a layout: its owners in the trace's order (root first, level by
    level) and each entry's dict as an index into theirs (``PlanLayout.slots``); the other
    columns (``entries``) as they are. Run in eager, traced too (the generic path): its
    arguments and its result are constants of the trace, and nothing of it is stepped."""
    nodes = list(map(Node, node_parents, node_names, node_depths))
    levels, order = levels_of(nodes)
    position = {owner: place for place, owner in enumerate(order)}
    owners_of_entries = tuple(position[owner] for owner in owner_of_entry)
    dicts = _dicts_of(kinds, owners_of_entries, len(order))
    return PlanLayout(
        owners=levels,
        buffer_owners=dicts.buffer_owners,
        attribute_owners=dicts.attribute_owners,
        slots=dicts.slots,
        kinds=tuple(KIND_INDEX[kind] for kind in kinds),
        owner_of_entry=owners_of_entries,
        rnn_owners=tuple(position[owner] for owner in rnn_owners),
        **entries,
    )


class _Dicts(NamedTuple):
    """Each entry's dict as an index (``PlanLayout``'s fields of the same names)."""

    slots: tuple[int, ...]
    buffer_owners: tuple[int, ...]
    attribute_owners: tuple[int, ...]


def _dicts_of(kinds: tuple[SlotKind, ...], owner_of_entry: tuple[int, ...], count: int) -> _Dicts:
    """Each entry's dict as an index: an owner's ``_parameters`` (``count`` owners), then the
    ``_buffers`` of each owner of a buffer's entry, then the ``__dict__`` of each owner of a
    plain tensor attribute's entry (in the order the entries name them)."""
    buffer_owners: list[int] = []
    attribute_owners: list[int] = []
    for kind, owner in zip(kinds, owner_of_entry):
        if kind is BUFFER and owner not in buffer_owners:
            buffer_owners.append(owner)
        elif kind is ATTRIBUTE and owner not in attribute_owners:
            attribute_owners.append(owner)
    attributes_start = count + len(buffer_owners)
    slots = []
    for kind, owner in zip(kinds, owner_of_entry):
        if kind is PARAMETER:
            slots.append(owner)
        elif kind is BUFFER:
            slots.append(count + buffer_owners.index(owner))
        else:
            slots.append(attributes_start + attribute_owners.index(owner))
    return _Dicts(tuple(slots), tuple(buffer_owners), tuple(attribute_owners))


def levels_of(nodes: list[Node]) -> tuple[Levels, list[int]]:
    """``nodes`` (the root first) as Levels, and the trace's order of the nodes (root first,
    level by level) as a list of their indexes in ``nodes``."""
    order = [0]
    parents: list[tuple[int, ...]] = []
    names: list[tuple[str, ...]] = []
    depth = 1
    while True:
        above = {n: i for i, n in enumerate(n for n in order if nodes[n].depth == depth - 1)}
        level = [i for i, node in enumerate(nodes) if node.depth == depth]
        if not level:
            return Levels(tuple(parents), tuple(names)), order
        parents.append(tuple(above[nodes[i].parent] for i in level))
        names.append(tuple(nodes[i].name for i in level))
        order.extend(level)
        depth += 1
