"""The data of a swap: how values go in (``Mode``), what kind of slot a key names
(``SlotKind``), what kind of distributed tree a plan is for (``Distributed``), the plan
as names and indexes (``PlanLayout``: what the builder makes) and bound to a module
(``Plan``: each key to its slot, as columns), and one applied swap (``Swap``).

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
# `DictGroup(...)` through its polyfill of class instantiation, many bytecode steps, each
# leaf's compile time where it is per leaf; `tuple.__new__` directly, a few.
new_entry = tuple.__new__

# A slot's kind by its index in a PlanLayout (``PlanLayout.kinds``): traced, a kind picked from
# this global (a `map` of its `__getitem__`) is guarded as the global's, where a SlotKind in
# the layout, a constant of the trace, would be a guard on a part of a constant, which cannot
# be built.
SLOT_KINDS = (SlotKind.PARAMETER, SlotKind.BUFFER, SlotKind.ATTRIBUTE)
PARAMETER, BUFFER, ATTRIBUTE = SLOT_KINDS


class Levels(NamedTuple):
    """How the trace reaches the nodes of a tree below its root, a level at a time: the
    nodes of a level are ``node[name]`` of nodes of the level above."""

    parents: tuple[tuple[int, ...], ...]
    """Per level, the index of each node's parent in the level above."""
    names: tuple[tuple[str, ...], ...]
    """Per level, each node's name in its parent."""


class PlanLayout(NamedTuple):
    """A plan as names and indexes, of no instance: what ``build`` makes of a module's
    structure and a container's keys, and ``bind.bind`` binds to a module (in eager, and in
    the trace, where a Route carries it as a constant). Entries: the given keys first, then
    tied aliases."""

    owners: Levels
    """The owner modules below the root (the root is owner 0; then level by level)."""
    buffer_owners: tuple[int, ...]
    """The owners whose ``_buffers`` hold an entry's slot..."""
    attribute_owners: tuple[int, ...]
    """... and those whose ``__dict__`` holds one (a plain tensor attribute)."""
    slots: tuple[int, ...]
    """Per entry, its dict: an index into every owner's ``_parameters``, then each buffer
    owner's ``_buffers``, then each attribute owner's ``__dict__`` (``bind.reach``)."""
    slot_names: tuple[str, ...]
    """Per entry, its name in that dict."""
    kinds: tuple[int, ...]
    """Per entry, its kind of slot, as an index into ``SLOT_KINDS``."""
    owner_of_entry: tuple[int, ...]
    """Per entry, its owner."""
    leaves: tuple[int, ...]
    """Per entry, its value's index in the leaves (a tie: its source's; a repeated slot: the
    first entry's)."""
    names: tuple[str, ...]
    """Per entry, its dotted module name (a given entry's: its key, the optional prefixes
    stripped)."""
    given: int
    """How many entries come from the container's keys."""
    tie_sources: tuple[tuple[int, ...], ...]
    """The leaf indexes given for one tied tensor, a group per tensor."""
    tie_groups: tuple[tuple[int, ...], ...]
    """The entries whose slots held one tensor at build time, a group per tensor."""
    repeated: tuple[int, ...]
    """The entries whose slot an earlier entry names too (a submodule at two paths)..."""
    repeated_first: tuple[int, ...]
    """... and that earlier entry, for each."""
    rnn_owners: tuple[int, ...]
    """The owners that are RNNs (their flat weights are reset after the swap)."""
    has_attributes: bool
    """Whether some entry is a plain tensor attribute's."""


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
        "key_tree",
        "kinds",
        "leaves",
        "names",
        "names_are_keys",
        "owner_of_entry",
        "owners",
        "owners_are_modules",
        "parameter_leaves",
        "preserved",
        "repeated",
        "rnns",
        "slot_names",
        "slots",
        "tie_sources",
        "traced",
    )

    def __init__(self) -> None:
        # --- per entry (bind.bind, from a PlanLayout) ---
        self.slots: list[dict] = []  # the owner's _parameters, _buffers or __dict__
        self.slot_names: list[str] = []  # the entry's name in that dict
        self.leaves: list[int] = []  # its value's index in the leaves (a tie: its source's)
        self.kinds: list[SlotKind] = []  # which dict of its owner the slot is
        self.owner_of_entry: list[int] = []  # its owner's index in `owners`
        self.names: list[str] = []  # its dotted module name (the given entries: the keys)
        # --- per owner module ---
        # eager: each owner's __dict__ (a cached plan must not keep its module alive); traced:
        # the owner modules (`owners_are_modules`), whose __dict__ the trace reads only where a
        # write needs it (attributes_of)
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
        # entry at a time (a Route's plan has no attribute's slot)
        self.by_entry = False
        self.direct = True  # entry i takes leaf i: no tied aliases, no repeated slot
        # entry index -> the earlier entry that names its slot too (a submodule at two
        # paths): it takes that one's value, and is never written back into params
        self.repeated: dict[int, int] = {}
        # --- eager, for slot_values' bulk conversion (plan._new_plan): the leaf
        # indexes of the parameter entries (None: every entry is a parameter's) and of the
        # buffer entries ---
        self.parameter_leaves: list[int] | None = None
        self.buffer_leaves: list[int] = []
        # --- beside the mapping ---
        # traced.py's, for a Route's to_module (PRESERVE): what each leaf goes in as
        self.preserved: list[Any] | None = None
        # --- made on first use, kept with the plan ---
        # to_module: the names written into each dict whose order they change
        # (registration.py; traced, the Route's grouping)
        self.dict_groups: list[DictGroup] | None = None
        self.key_tree: Any = None  # the old values' TensorDict structure (flatten.KeyTree)
        self.distributed = Distributed.NONE  # FSDP2, DDP or neither (plan.resolve)


class Node(NamedTuple):
    """A node of a tree (a module, a TensorDict), as a walk lists it, the root first."""

    parent: int
    """Its parent's index in that list (-1: the root)."""
    name: str
    """Its name in its parent."""
    depth: int
    """0: the root."""


ROOT_NODE = Node(-1, "", 0)


class SlotRef(NamedTuple):
    """A slot: one name in one of a module's dicts."""

    slot: dict
    name: str


class DictOrder(NamedTuple):
    """A dict's keys in order, as a swap found them (its restore puts them back so)."""

    slot: dict
    keys: list[str]


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
