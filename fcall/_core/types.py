"""The data of a swap: how values go in (``Mode``), what kind of slot a key names
(``SlotKind``), what kind of distributed tree a plan is for (``Distributed``), the plan
(``Plan``: each key to its slot, as columns), what the build read of the tree beside it
(``TreeReads``), and one applied swap (``Swap``).

The enums and the NamedTuples are folded by Dynamo while it traces a swap: an enum member is
a constant in the trace, and a NamedTuple made by ``new_entry`` is a tuple (built and unpacked
without inlining any Python of its own).
"""

from __future__ import annotations

import enum
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import nn

from .._compat import MODULE_DICT_TRACED

Key = tuple[str, ...]
"""A params key as the names of its path: ``("0", "weight")``."""


class Mode(enum.Enum):
    """How a swap's values go into the module's slots."""

    AS_IS = "as_is"
    """``swap`` / ``functional_call``: each value goes into its slot as it is, as
    ``torch.func.functional_call`` does (no new Parameter is made)."""
    PRESERVE = "preserve"
    """``to_module(preserve_module_state=True)``: a value that does not track gradients
    and replaces a Parameter is wrapped in a Parameter with the old ``requires_grad``."""
    REPLACE = "replace"
    """``to_module(preserve_module_state=False)``: a plain tensor that replaces a
    Parameter becomes a plain attribute, a Parameter that replaces a buffer a parameter."""
    INPLACE = "inplace"
    """``to_module(inplace=True)``: values are copied into the module's own tensors."""
    SHARDED = "sharded"
    """An FSDP2 tree: values are copied into each rank's shards (``distributed.py``)."""


class SlotKind(enum.Enum):
    """Which dict of its owner module holds a key."""

    PARAMETER = "parameter"  # owner._parameters
    BUFFER = "buffer"  # owner._buffers
    ATTRIBUTE = "attribute"  # owner.__dict__: a plain tensor attribute


class Distributed(enum.Enum):
    """What a plan's module tree is, for ``distributed.py`` (classified on first use)."""

    NONE = "none"  # a plain tree: the swap is a loop of slot writes
    FSDP = "fsdp"  # some module is FSDP2's (fully_shard): copies into the shards
    DDP = "ddp"  # a DistributedDataParallel wrapper: values that need grad are refused


# How traced code makes a NamedTuple: `new_entry(DictGroup, (slot, names))`. Dynamo runs
# `DictGroup(...)` through its polyfill of class instantiation, about 50 bytecode steps,
# each leaf's compile time where it is per leaf; `tuple.__new__` directly, about 4.
new_entry = tuple.__new__

# A slot's kind by whether it is a buffer's (indexed by `int(is_buffer)`: Dynamo 2.11 refuses
# a bool index): traced, a kind picked from this global (a `map` of its `__getitem__`) is
# guarded as the global's, where a SlotKind in the Route, a constant of the trace, would be
# a guard on a part of a constant, which cannot be built.
KIND_OF_BUFFER = (SlotKind.PARAMETER, SlotKind.BUFFER)
PARAMETER, BUFFER = KIND_OF_BUFFER


class DictLevel(NamedTuple):
    """One level of a (nested) dict's structure, as the trace reads it (``traced._dict_shape``):
    made traced with ``new_entry``, read at trace time as a constant."""

    keys: tuple[tuple[Any, ...], ...]
    """Per node of the level, its keys."""
    is_dict: tuple[bool, ...]
    """Per value of the level (its nodes' values, in order), whether it is a dict..."""
    is_tensor: tuple[bool, ...]
    """... and whether a tensor."""


class DictGroup(NamedTuple):
    """The names a swap writes into one dict whose order it changes (``registration.py``)."""

    slot: dict[str, Any]
    names: list[str]


class Plan:
    """Where each key of a params container lives in a module tree: one row per entry (the
    given keys first, then tied aliases), kept as columns that the hot loops read whole
    (``slots``, ``slot_names``, ``leaves``, ``kinds``, ``owner_of_entry``)."""

    __slots__ = (
        "buffer_leaves",
        "by_entry",
        "dict_groups",
        "direct",
        "distributed",
        "given",
        "has_attributes",
        "kinds",
        "layout",
        "leaves",
        "names",
        "names_are_keys",
        "owner_of_entry",
        "owners",
        "owners_are_modules",
        "parameter_leaves",
        "preserved",
        "reads",
        "repeated",
        "rnns",
        "slot_names",
        "slots",
        "tie_sources",
        "traced",
    )

    def __init__(self) -> None:
        # --- per entry (build.py, or traced._plan for a Route) ---
        self.slots: list[dict] = []  # the owner's _parameters, _buffers or __dict__
        self.slot_names: list[str] = []  # the entry's name in that dict
        self.leaves: list[int] = []  # its value's index in the leaves (a tie: its source's)
        self.kinds: list[SlotKind] = []  # which dict of its owner the slot is
        self.owner_of_entry: list[int] = []  # its owner's index in `owners`
        self.names: list[str] = []  # its dotted module name (the given entries: the keys)
        # --- per owner module ---
        # eager and the generic path: each owner's __dict__ (a cached plan must not keep its
        # module alive); a Route's plan: the owner modules (`owners_are_modules`), whose
        # __dict__ the trace reads only where a write needs it (attributes_of)
        self.owners: list[Any] = []
        self.owners_are_modules = False
        # --- the rest of the mapping ---
        self.given = 0  # how many entries come from params keys
        self.tie_sources: list[list[int]] = []  # leaf indexes given for one tied tensor
        self.has_attributes = False  # some entry is a plain tensor attribute
        self.rnns: list[weakref.ref[nn.RNNBase]] = []  # RNN owners: _flat_weights reset
        self.names_are_keys = False  # a Route's: no prefix was stripped, names are keys
        self.traced = False  # built while Dynamo traces: nothing after resolve asks again
        # traced, with an attribute's slot, where Dynamo traces a module's __dict__ a key at a
        # time (_compat.MODULE_DICT_TRACED): the writes, the restore and read_slots go one
        # entry at a time (set by finish(); a Route's plan has no attribute's slot)
        self.by_entry = False
        self.direct = True  # entry i takes leaf i: no tied aliases, no repeated slot
        # entry index -> the earlier entry that names its slot too (a submodule at two
        # paths): it takes that one's value, and is never written back into params
        self.repeated: dict[int, int] = {}
        # --- derived once by finish(), eager, for slot_values' bulk conversion: the leaf
        # indexes of the parameter entries (None: every entry is a parameter's) and of the
        # buffer entries ---
        self.parameter_leaves: list[int] | None = None
        self.buffer_leaves: list[int] = []
        # --- beside the mapping, each written by one module ---
        self.reads: TreeReads | None = None  # build.py's (None: a Route's plan)
        # traced.py's, for a Route's to_module (PRESERVE): what each leaf goes in as
        self.preserved: list[Any] | None = None
        # --- made on first use, kept with the plan ---
        # to_module: the names written into each dict whose order they change
        # (registration.py; traced, the Route's grouping)
        self.dict_groups: list[DictGroup] | None = None
        self.layout: Any = None  # the old values' TensorDict layout (flatten.py)
        self.distributed: Distributed | None = None  # FSDP2, DDP or neither (engine.prepare)

    def add(self, slot: dict, name: str, leaf: int, kind: SlotKind, owner: int) -> None:
        """One more entry (the builder's)."""
        self.slots.append(slot)
        self.slot_names.append(name)
        self.leaves.append(leaf)
        self.kinds.append(kind)
        self.owner_of_entry.append(owner)

    def finish(self, cached: bool = True) -> Plan:
        """Derive what the hot loops read (a plan built under Dynamo, ``cached=False``, is
        never reused)."""
        self.direct = len(self.slots) == self.given
        self.traced = not cached
        assert self.reads is not None  # finish() is the builder's
        if cached or self.reads.may_repeat_slots:  # traced, id(slot) guards on the dict's id
            self._find_repeated()
        self.by_entry = self.traced and self.has_attributes and not MODULE_DICT_TRACED
        if not cached:
            return self
        # eager only: slot_values' bulk conversion
        kinds = self.kinds
        parameter_leaves = [leaf for leaf, k in zip(self.leaves, kinds) if k is PARAMETER]
        if len(parameter_leaves) != len(kinds):
            self.parameter_leaves = parameter_leaves
        self.buffer_leaves = [leaf for leaf, k in zip(self.leaves, kinds) if k is BUFFER]
        return self

    def _find_repeated(self) -> None:
        """A submodule registered at two paths gives two entries one slot: the first
        path's value goes in, as tensordict's ``to_module`` visits a module once. The
        later entries take the first one's leaf and are marked ``repeated``; they are
        written and restored as plain entries, never written back into params."""
        first: dict[tuple[int, str], int] = {}
        repeated = {}
        # traced, by the owner module: a module's names are unique over its dicts, and
        # Dynamo (torch 2.11-2.12) traces id() of a module, not of a dict
        owners = None if self.reads is None else self.reads.owners
        leaves = self.leaves
        for index in range(len(self.slots)):
            if owners is None:
                identity = id(self.slots[index])
            else:
                identity = id(owners[self.owner_of_entry[index]])
            seen = first.setdefault((identity, self.slot_names[index]), index)
            if seen != index:
                leaves[index] = leaves[seen]
                repeated[index] = seen
        if repeated:
            self.repeated = repeated
            self.has_attributes = True
            self.direct = False


class Node(NamedTuple):
    """A node of a tree (a module, a TensorDict), as a walk lists it, the root first."""

    parent: int
    """Its parent's index in that list (-1: the root)."""
    name: str
    """Its name in its parent."""
    depth: int
    """0: the root."""


ROOT_NODE = Node(-1, "", 0)


class Link(NamedTuple):
    """A module on a key's path, as the build reached it."""

    parent_modules: dict
    """Its parent's ``_modules``."""
    name: str
    """Its name there."""
    child: nn.Module
    """The module itself."""


class SlotRef(NamedTuple):
    """A slot: one name in one of a module's dicts."""

    slot: dict
    name: str


class DictOrder(NamedTuple):
    """A dict's keys in order, as a swap found them (its restore puts them back so)."""

    slot: dict
    keys: list[str]


@dataclass(slots=True)
class TreeReads:
    """What the build read of the module tree besides the entries (``build.py`` writes it):
    the cache's ``Staleness``, the Route and the distributed check read it."""

    chain: list[Link] = field(default_factory=list)
    """Each module on a key's path, once each."""
    owner_nodes: list[Node] = field(default_factory=lambda: [ROOT_NODE])
    """Per owner of the plan (``Plan.owners``: the root first, then each module on a key's
    path, once per path), where it is in the tree."""
    root_dicts: tuple[dict, dict] | None = None
    """The root's ``_parameters`` and ``_buffers``, if the root owns a key."""
    tie_groups: list[list[SlotRef]] = field(default_factory=list)
    """The slots that held one tensor at build time, a group per tensor."""
    may_repeat_slots: bool = False
    """Traced: the build found a tensor under two names, so ``finish`` looks for a slot
    that two entries name (``id(slot)`` is a guard on the dict; eager always looks)."""
    owners: list[nn.Module] | None = None
    """Traced, where slots may repeat: each owner module, in ``Plan.owners``' order
    (``Plan._find_repeated``)."""


class StalePlan(Exception):
    """A cached plan named a slot that is gone: the caller rebuilds and retries."""


def attributes_of(plan: Plan, index: int) -> dict[str, Any]:
    """The ``__dict__`` of entry ``index``'s owner module."""
    owner = plan.owners[plan.owner_of_entry[index]]
    return owner.__dict__ if plan.owners_are_modules else owner


class Sharded(NamedTuple):
    """A swap into an FSDP2 tree (``distributed.py``): copies into the shards."""

    fsdp_modules: list[nn.Module]
    """Every FSDP module of the tree, resharded before each copy."""
    shards: list[torch.Tensor]
    """Per entry, the module's own sharded tensor that the values are copied into."""


class _Gone:
    """What restore reports for a slot that the block deleted (``del m.weight``)."""

    def __repr__(self) -> str:
        return "<deleted in the block>"


GONE = _Gone()


@dataclass(slots=True)
class Swap:
    """One applied swap, with what it takes to undo it."""

    plan: Plan
    mode: Mode
    leaves: Any  # flatten.Leaves
    non_blocking: bool
    old: Sequence[Any] = ()  # what each slot held
    # what each slot received (a list: a registration hook's result replaces its value)
    new: list[Any] = field(default_factory=list)
    # per entry, only when a value changes dict: the dict its value goes into, None where
    # that is its slot's own
    targets: list[dict | None] | None = None
    # each dict a value left, with its keys' order before the swap
    orders: list[DictOrder] = field(default_factory=list)
    done: bool = False  # restored already: a second restore must not undo later swaps
    sharded: Sharded | None = None  # an FSDP2 tree's (distributed.py)
    # to_module's swaps: the module whose dicts get tensordict's registration order, on
    # commit and on restore (registration.py); None: the order is kept
    reorder_in: nn.Module | None = None
    # traced on torch 2.11 only: the module swapped into (a name leaves a __dict__ by delattr
    # on its owner, engine._leave_attributes)
    module: nn.Module | None = None
