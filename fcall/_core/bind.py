"""A plan's layout bound to a module: one descent, the same code in eager and in the trace.

``reach`` descends from the root to the layout's owner modules, a level at a time, and reads
their slot dicts; ``bind`` makes the ``Plan`` of the layout over what ``reach`` read. In eager
(``plan.py``: the cached plan, checked by ``Staleness`` against what the descent read;
``routes.py``: the trace-time decision) they run as C loops. In the trace (``traced.py``)
they are the swap's reads of the module tree: builtins (``map``, ``getattr``,
``dict.__getitem__``) that Dynamo runs without stepping through bytecode, and whose reads
are the guards that keep a Route's layout sound for the next call.

The helpers the trace calls live here and in ``traced.py`` only: every function a compiled
swap calls through a module global is guarded on every call (fcall/README.md).
"""

from __future__ import annotations

import itertools
import operator
import weakref
from collections.abc import Sequence
from typing import Any

from torch import nn

from .._compat import MODULE_DICT_TRACED
from .types import SLOT_KINDS, Levels, Plan, PlanLayout

_repeat = itertools.repeat


def reach(layout: PlanLayout, root: nn.Module) -> tuple[list[nn.Module], tuple[dict, ...]]:
    """The owner modules of ``layout`` (``root`` first, then level by level) and their slot
    dicts, in ``PlanLayout.slots``' order: each owner's ``_parameters``, then each buffer
    owner's ``_buffers``, then each attribute owner's ``__dict__``."""
    owners = descend([root], layout.owners, modules_of)
    dicts = tuple(map(getattr, owners, _repeat("_parameters")))
    if layout.buffer_owners:
        dicts += tuple(map(getattr, pick(owners, layout.buffer_owners), _repeat("_buffers")))
    if layout.attribute_owners:
        dicts += tuple(map(getattr, pick(owners, layout.attribute_owners), _repeat("__dict__")))
    return owners, dicts


def bind(
    layout: PlanLayout, owners: list[nn.Module], dicts: tuple[dict, ...], traced: bool
) -> Plan:
    """The plan of ``layout`` over the ``owners`` and ``dicts`` that ``reach`` read. Its columns
    are builtin calls over the layout's constants (traced, nothing stepped per leaf). Traced,
    its owners are the modules, whose ``__dict__`` (a Dynamo dict of each module's attributes,
    costly to build) is read only where a write needs it (``types.attributes_of``); in eager
    their ``__dict__`` (a cached plan must not keep its module alive)."""
    plan = Plan()
    plan.given = layout.given
    plan.names = list(layout.names)
    plan.slots = list(pick(dicts, layout.slots))
    plan.slot_names = list(layout.slot_names)
    plan.leaves = list(layout.leaves)
    plan.kinds = list(map(SLOT_KINDS.__getitem__, layout.kinds))
    plan.owner_of_entry = list(layout.owner_of_entry)
    plan.has_attributes = layout.has_attributes
    plan.direct = len(layout.slots) == layout.given
    if layout.tie_sources:
        plan.tie_sources = list(map(list, layout.tie_sources))
    if layout.repeated:  # written and restored entry by entry
        plan.repeated = dict(zip(layout.repeated, layout.repeated_first))
        plan.has_attributes = True
        plan.direct = False
    if layout.rnn_owners:
        plan.rnns = list(map(weakref.ref, pick(owners, layout.rnn_owners)))
    plan.traced = traced
    if traced:
        plan.owners = list(owners)
        plan.owners_are_modules = True
        # an attribute's __dict__ where Dynamo traces it a key at a time: entry by entry
        plan.by_entry = plan.has_attributes and not MODULE_DICT_TRACED
    else:
        plan.owners = [owner.__dict__ for owner in owners]
    return plan


def modules_of(level: Sequence[Any]) -> tuple:
    """A module tree's containers of the next level: each module's ``_modules``."""
    return tuple(map(getattr, level, _repeat("_modules")))


def entries_of(level: Sequence[Any]) -> Sequence[Any]:
    """A TensorDict tree's containers of the next level: each node's entries (``descend``
    reads ``_tensordict`` of each node it reaches)."""
    return level


def descend(top: list, levels: Levels, containers: Any) -> list:
    """The nodes of ``levels`` below ``top``: ``top`` first, then each level."""
    found = list(top)
    level: Sequence[Any] = top
    for parents, names in zip(levels.parents, levels.names):
        level = tuple(map(dict.__getitem__, containers(pick(level, parents)), names))
        if containers is entries_of:  # a TensorDict node: its entries
            level = tuple(map(getattr, level, _repeat("_tensordict")))
        found.extend(level)
    return found


def pick(items: Sequence[Any], indexes: tuple[int, ...]) -> tuple:
    """``[items[i] for i in indexes]`` in one builtin call (``operator.itemgetter`` is a
    polyfill that Dynamo steps through per item)."""
    return tuple(map(operator.getitem, _repeat(items), indexes))
