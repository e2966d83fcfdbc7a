"""Where a swap's plan comes from, and whether a cached one still holds.

``resolve`` is the one place a swap asks whether Dynamo is tracing (``plan.traced`` tells
the steps after it). In eager the plan comes from a cache, per module and per key structure
(``_cached_plan``), checked before each reuse (``Staleness``) and rebuilt if the module changed.
While tracing it is decided at trace time through a Route (``traced.py``), or built in the
trace (the generic path: ``build``, whose errors are the eager ones). Either way ``build.py``
makes a layout (``types.PlanLayout``: names and indexes) and ``bind.py`` binds it to the
module (``types.Plan``: each key to its slot).

The staleness check, one row per module on a key's path (``Row``: the owners ``bind.reach``
descended to): the submodule is still the
same object, its ``_parameters`` (and, where the plan swaps a buffer of it or ``strict=True``
asks for all, its ``_buffers``) still has the same size; tied names still share one tensor;
and, for ``tie_weights`` / ``strict`` plans, ``TieWatch``: every parameter and submodule slot
the swap does not write holds the same object, and no slot dict grew or shrank, so a tie made
later (``m.head.weight = m.emb.weight``, ``m[1] = m[0]``) rebuilds the plan, which then sees
it, with no hook anywhere. The slots the plan writes are left out: between nested swaps they
hold another swap's values. Not seen in eager, then: a tie made later between two names that
are *both* given, and a tie of two buffers (``docs/behaviour.md``). A name that left its dict
while another took its place (the size unchanged) is not checked: reading it raises
``KeyError`` in ``read_slots``, which raises ``StalePlan``, and the swap is made again with a
new plan (``engine.swap_in``).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from operator import is_
from typing import Any, NamedTuple

import torch
from torch import nn

from . import distributed, traced
from .bind import bind, reach
from .build import build
from .flatten import Leaves, flatten_eager, flatten_generic
from .tree import unwrap
from .types import BUFFER, PARAMETER, Levels, Plan, PlanLayout, SlotKind, SlotRef, StalePlan

_MAX_PLANS_PER_MODULE = 16


def resolve(
    params: Any,
    module: nn.Module,
    *,
    tie_weights: bool,
    strict: bool,
    make_parameters: bool = False,
    group_by_dict: bool = False,
) -> tuple[Plan, Leaves]:
    """The plan for ``params`` in ``module`` (cached in eager), and the leaves of ``params``.
    ``make_parameters``, ``group_by_dict``: to_module's, see ``traced.resolve``."""
    if torch.compiler.is_compiling():
        routed = traced.resolve(params, module, tie_weights, strict, make_parameters, group_by_dict)
        if routed is not None:
            return routed
        leaves = flatten_generic(params)
        plan, _layout, _owners = _built(module, leaves, tie_weights, strict, traced=True)
        return plan, leaves
    leaves = flatten_eager(params)
    return _cached_plan(module, leaves, tie_weights, strict), leaves


class CachedPlan(NamedTuple):
    """A plan in the cache, and how to tell it is stale."""

    plan: Plan
    staleness: Staleness


class _ModulePlans:
    """The plans of one module: by key structure, and the last one used."""

    __slots__ = ("last_plan", "last_signature", "module", "plans")

    def __init__(self, module: weakref.ref) -> None:
        self.module = module  # a weak reference: the cache must not keep the module alive
        self.plans: dict[Any, CachedPlan] = {}
        self.last_signature: Any = None
        self.last_plan: CachedPlan | None = None


# Per module, by id: its plans. Not a WeakKeyDictionary: its get() is Python code, a
# measurable part of a small swap.
_CACHE: dict[int, _ModulePlans] = {}


def cached(module: nn.Module) -> list[CachedPlan]:
    """The cached plans of ``module``, oldest first (for tests and debugging)."""
    found = _CACHE.get(id(module))
    return list(found.plans.values()) if found is not None and found.module() is module else []


def forget(module: nn.Module) -> None:
    """Drop the cached plans of ``module`` (one of them was stale)."""
    _CACHE.pop(id(module), None)


def _cached_plan(module: nn.Module, leaves: Leaves, tie_weights: bool, strict: bool) -> Plan:
    """The cached plan of ``leaves`` in ``module``, rebuilt if stale (eager only)."""
    signature = (leaves.signature, tie_weights, strict)
    cached = _CACHE.get(id(module))
    if cached is None or cached.module() is not module:
        cached = _new_entry(module)
    # The last swap's key first: equal tuples of the same names compare by identity,
    # where hashing reads every name (a cache miss each, in a cold swap of a big tree).
    if cached.last_signature == signature:
        found = cached.last_plan
    else:
        found = cached.plans.get(signature)
    if found is None or not found.staleness.holds():
        found = _new_plan(module, leaves, tie_weights, strict)
        if len(cached.plans) >= _MAX_PLANS_PER_MODULE:
            cached.plans.pop(next(iter(cached.plans)))
        cached.plans[signature] = found
    cached.last_signature, cached.last_plan = signature, found
    return found.plan


def _built(
    module: nn.Module, leaves: Leaves, tie_weights: bool, strict: bool, *, traced: bool
) -> tuple[Plan, PlanLayout, list[nn.Module]]:
    """The plan of ``leaves`` in ``module``: built, bound and classified (eager, or traced on
    the generic path), with its layout and the owners the binding reached. Three values, not
    a NamedTuple: traced, its class would be one more global that the guards check on every
    call."""
    layout = build(module, leaves.keys, tie_weights=tie_weights, strict=strict, traced=traced)
    owners, dicts = reach(layout, unwrap(module)[0])
    plan = bind(layout, owners, dicts, traced)
    plan.distributed = distributed.classified(module, owners)
    return plan, layout, owners


def _new_plan(module: nn.Module, leaves: Leaves, tie_weights: bool, strict: bool) -> CachedPlan:
    """The plan of ``leaves`` in ``module``, built, bound (eager), and how to tell it is stale."""
    plan, layout, owners = _built(module, leaves, tie_weights, strict, traced=False)
    kinds = plan.kinds  # slot_values' bulk conversion: the leaves of each kind's entries
    parameter_leaves = [leaf for leaf, kind in zip(plan.leaves, kinds) if kind is PARAMETER]
    if len(parameter_leaves) != len(kinds):
        plan.parameter_leaves = parameter_leaves
    plan.buffer_leaves = [leaf for leaf, kind in zip(plan.leaves, kinds) if kind is BUFFER]
    staleness = Staleness(plan, layout, owners, watch=tie_weights or strict, strict=strict)
    return CachedPlan(plan, staleness)


def _new_entry(module: nn.Module) -> _ModulePlans:
    key = id(module)

    def drop(ref: weakref.ref) -> None:  # the module is gone: so are its plans
        entry = _CACHE.get(key)
        if entry is not None and entry.module is ref:
            del _CACHE[key]

    found = _CACHE[key] = _ModulePlans(weakref.ref(module, drop))
    return found


class Row(NamedTuple):
    """What ``Staleness`` compares for one module on a key's path (the root: no parent)."""

    parent: dict  # the parent's _modules (the root's row: an empty dict)
    name: str  # the module's name there
    child: nn.Module | None  # the module (the root's row: None, what .get("") finds)
    parameters: dict  # its _parameters
    n_parameters: int
    buffers: dict  # its _buffers, or UNWATCHED (empty) where no buffer of it is swapped
    n_buffers: int


_NO_PARENT: dict = {}
UNWATCHED: dict = {}  # the buffers of a module whose buffer count is not compared


class Staleness:
    """Whether a cached plan still fits its module tree (the module docstring)."""

    __slots__ = ("rows", "tie_groups", "watch")

    def __init__(
        self,
        plan: Plan,
        layout: PlanLayout,
        owners: list[nn.Module],
        *,
        watch: bool,
        strict: bool,
    ) -> None:
        watched = _watched_buffers(plan, strict)
        self.rows = [
            Row(
                link.parent._modules,
                link.name,
                link.child,
                *_sized(link.child._parameters, watched(link.child._buffers)),
            )
            for link in _links(layout.owners, owners)
        ]
        if 0 in layout.owner_of_entry:  # the root owns an entry
            root = owners[0]
            self.rows.append(
                Row(_NO_PARENT, "", None, *_sized(root._parameters, watched(root._buffers)))
            )
        self.tie_groups = [
            [SlotRef(plan.slots[i], plan.slot_names[i]) for i in group]
            for group in layout.tie_groups
        ]
        self.watch = TieWatch(owners[0], list(zip(plan.slots, plan.slot_names))) if watch else None

    def holds(self) -> bool:
        """Whether the module tree still has the structure the plan was built on."""
        watch = self.watch
        if watch is not None and not (  # TieWatch: in one C-level pass each
            list(map(len, watch.sized)) == watch.sizes
            and all(map(is_, map(dict.get, watch.dicts, watch.names), watch.values))
        ):
            return False
        # unpacked in Row's field order: the one loop of a warm swap's check
        for parent, name, child, parameters, n_parameters, buffers, n_buffers in self.rows:
            if (
                parent.get(name) is not child  # a submodule on a key's path was replaced
                or len(parameters) != n_parameters  # a parameter registered or deleted
                or len(buffers) != n_buffers
            ):
                return False
        for group in self.tie_groups:
            try:
                if not _still_tied(group):
                    return False  # tied names were untied
            except KeyError:
                return False
        return True


class TieWatch:
    """The parameter and submodule slots of a tree that a plan does not write, and the
    sizes of every such dict (``Staleness.holds`` compares them)."""

    __slots__ = ("dicts", "names", "sized", "sizes", "values")

    def __init__(self, root: nn.Module, written: Iterable[tuple[dict, str]]) -> None:
        skip = {(id(slot), name) for slot, name in written}
        dicts: list[dict] = []
        names: list[str] = []
        sized: list[dict] = []
        for module in root.modules():  # each module once: a tree with a cycle ends
            for slots in (module._parameters, module._modules):
                sized.append(slots)
                for name in slots:
                    if (id(slots), name) not in skip:
                        dicts.append(slots)
                        names.append(name)
        self.dicts = dicts
        self.names = names
        self.values = list(map(dict.get, dicts, names))
        self.sized = sized
        self.sizes = list(map(len, sized))


class _Link(NamedTuple):
    """An owner below the root, and where its parent holds it."""

    parent: nn.Module
    name: str
    child: nn.Module


def _links(levels: Levels, owners: list[nn.Module]) -> list[_Link]:
    """Each owner below the root: ``owners`` are ``reach``'s, the root first, then ``levels``
    a level at a time."""
    links = []
    above, start = 0, 1  # where the level above and this level begin in `owners`
    for parents, names in zip(levels.parents, levels.names):
        for offset, (parent, name) in enumerate(zip(parents, names)):
            links.append(_Link(owners[above + parent], name, owners[start + offset]))
        above, start = start, start + len(parents)
    return links


def _watched_buffers(plan: Plan, strict: bool) -> Any:
    """Which modules' buffer counts are compared: the owners of a buffer entry, or all of
    them for ``strict`` (a buffer registered later is a missing key) and plain-attribute
    plans. A buffer registered on a module whose entries are all parameters changes no slot
    of the plan, and skipping its count spares a read of one more dict per module on every
    eager swap (``UNWATCHED``: always empty)."""
    if strict or plan.has_attributes:
        return lambda buffers: buffers
    owners = {id(slot) for slot, kind in zip(plan.slots, plan.kinds) if kind is SlotKind.BUFFER}
    return lambda buffers: buffers if id(buffers) in owners else UNWATCHED


def _sized(parameters: dict, buffers: dict) -> tuple[dict, int, dict, int]:
    return parameters, len(parameters), buffers, len(buffers)


def _still_tied(group: list[SlotRef]) -> bool:
    """Whether the slots of ``group`` still hold one tensor."""
    first = group[0].slot[group[0].name]
    for ref in group[1:]:
        if ref.slot[ref.name] is not first:
            return False
    return True


def read_slots(plan: Plan) -> tuple[Any, ...]:
    """What each slot of ``plan`` holds; ``StalePlan`` if a name has left its dict."""
    try:
        if plan.by_entry:  # Dynamo 2.11: a module's __dict__ a key at a time (Plan.by_entry)
            return tuple([slot[name] for slot, name in zip(plan.slots, plan.slot_names)])
        return tuple(map(dict.__getitem__, plan.slots, plan.slot_names))
    except KeyError:
        raise StalePlan from None
