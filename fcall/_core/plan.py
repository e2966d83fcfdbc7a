"""Resolve params keys to module slots once, and reuse the result.

A *plan* maps every key of a params container to the dict that holds it in the
module tree (``owner._parameters``, ``owner._buffers``, or ``owner.__dict__`` for
a tensor that a ``preserve_module_state=False`` swap left as a plain attribute)
and the name inside that dict. Swapping is then a loop of dict reads and writes.

Plans are cached per module and per key structure in eager mode
(``fcall/_plan_cache.py``). A cached plan is checked before each use
(``Plan.is_current``): every submodule on a key's path is still the same object,
every owner still has the same number of parameters (and of buffers, where the plan
swaps one of them or ``strict=True`` asks for all), every name is still in its dict,
and tied names still share one tensor. Any change (a submodule replaced, a parameter
registered or deleted, a buffer turned into a parameter, weights untied) rebuilds the
plan. Under Dynamo no cache is used: the plan is decided at trace time and handed to the
trace as a Route (``fcall/_traced.py``), whose reads Dynamo guards; or, on the generic
path, built in the traced code, where Dynamo guards the module structure it walks.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .flatten import Key
from .ties import TieWatch
from .types import Entry, SlotKind, new_entry


class Plan:
    """Where each key of a params container lives in a module tree."""

    __slots__ = (
        "buffer_leaves",
        "chain",
        "checks",
        "dict_groups",
        "direct",
        "distributed",
        "entries",
        "given",
        "has_attributes",
        "layout",
        "may_repeat_slots",
        "names",
        "names_are_keys",
        "owners",
        "pairs",
        "parameter_leaves",
        "preserved",
        "repeated",
        "rnns",
        "root_dicts",
        "slot_names",
        "slots",
        "tie_groups",
        "tie_sources",
        "traced",
        "watch",
    )

    def __init__(self) -> None:
        self.entries: list[Entry] = []  # given keys first, then tied aliases
        self.given = 0  # how many entries come from params keys
        self.names: list[str] = []  # dotted module name of each entry
        self.chain: list[tuple[dict, str, nn.Module]] = []  # (parent._modules, name, child)
        self.root_dicts: tuple[dict, dict] | None = None  # the root's, if it owns a key
        self.tie_groups: list[list[tuple[dict, str]]] = []  # slots tied at build time
        self.tie_sources: list[list[int]] = []  # leaf indexes given for one tied tensor
        # Derived once by finish(), for the hot loops:
        self.pairs: list[tuple[dict, str]] = []  # (slot, name) of each entry
        self.slots: list[dict] = []  # the slot of each entry: where each value goes
        self.slot_names: list[str] = []  # the name of each entry in its slot
        # leaf indexes of the parameter entries; None: every entry is a parameter
        self.parameter_leaves: list[int] | None = None
        self.buffer_leaves: list[int] = []  # leaf indexes of the buffer entries
        # entry index -> the earlier entry that names its slot too (a submodule at two
        # paths): it takes that one's value, and is never written back into params
        self.repeated: dict[int, int] = {}
        # eager, tie_weights or strict: the slots the swap does not write, checked by
        # identity before each reuse (fcall/_ties.py): a tie made later rebuilds the plan
        self.watch: TieWatch | None = None
        # traced: the build found a tensor under two names, so finish() looks for
        # a slot that two entries name (id(slot): a guard on the dict); eager: always
        self.may_repeat_slots = False
        self.direct = True  # entry i takes leaf i: no tied aliases
        self.has_attributes = False  # some entry is a plain tensor attribute
        # RNN owners, whose _flat_weights need a reset
        self.rnns: list[weakref.ref[nn.RNNBase]] = []
        self.layout: Any = None  # the old-values TensorDict layout, made on first use
        # traced to_module (PRESERVE): what each leaf goes in as (a plain value bound for a
        # parameter slot: its Parameter), made by the traced front (fcall/_traced.py)
        # before the module's dicts are read
        self.preserved: list[Any] | None = None
        self.distributed: Any = None  # set by _distributed on first use
        # traced to_module: the names written into each dict whose order they change
        # (fcall/_registration.py; a Route's, or grouped on first use)
        self.dict_groups: list[tuple[dict, list[str]]] | None = None
        self.checks: list[tuple] = []  # what is_current compares, one row per module
        self.names_are_keys = False  # built by fcall/_build.py: no prefix was stripped
        # a Route's plan whose entries hold no owner __dict__: each entry's owner module
        self.owners: list[nn.Module] | None = None
        self.traced = False  # built while Dynamo traces (fcall/_traced.py, or build traced)

    def finish(self, cached: bool = True, strict: bool = True) -> Plan:
        """Derive what the hot loops read, and, if the plan is ``cached``, what
        ``is_current`` compares (a plan built under Dynamo is never reused; ``strict``:
        the plan was built for ``strict=True``, see ``_watched_buffers``)."""
        self.pairs = [(entry.slot, entry.name) for entry in self.entries]
        self.slots = [entry.slot for entry in self.entries]
        self.slot_names = [entry.name for entry in self.entries]
        self.direct = len(self.entries) == self.given
        self.traced = not cached
        if cached or self.may_repeat_slots:  # traced, id(slot) guards on the dict's id
            self._find_repeated()
        if not cached:
            return self
        # eager only: _slot_values' bulk conversion
        parameter_leaves = [e.leaf for e in self.entries if e.kind is SlotKind.PARAMETER]
        if len(parameter_leaves) != len(self.entries):
            self.parameter_leaves = parameter_leaves
        self.buffer_leaves = [e.leaf for e in self.entries if e.kind is SlotKind.BUFFER]
        # One row per module on a key's path, plus the root if it owns a key: one
        # loop iteration per module, not one per dict and one per name.
        watched = self._watched_buffers(strict)
        for modules, name, child in self.chain:
            buffers = watched(child._buffers)
            self.checks.append((modules, name, child, *_sized(child._parameters, buffers)))
        if self.root_dicts is not None:
            parameters, buffers = self.root_dicts
            self.checks.append((_NO_PARENT, "", None, *_sized(parameters, watched(buffers))))
        return self

    def _watched_buffers(self, strict: bool) -> Any:
        """Which modules' buffer counts ``is_current`` compares: the owners of a buffer
        entry, or all of them for ``strict`` (a buffer registered later is a missing key)
        and plain-attribute plans. A buffer registered on a module whose entries are all
        parameters changes no slot of the plan, and skipping its count spares a read of
        one more dict per module on every eager swap (``UNWATCHED``: always empty)."""
        if strict or self.has_attributes:
            return lambda buffers: buffers
        owners = {id(e.slot) for e in self.entries if e.kind is SlotKind.BUFFER}
        return lambda buffers: buffers if id(buffers) in owners else UNWATCHED

    def _find_repeated(self) -> None:
        """A submodule registered at two paths gives two entries one slot: the first
        path's value goes in, as tensordict's ``to_module`` visits a module once. The
        later entries take the first one's leaf and are marked ``repeated``; they are
        written and restored as plain entries, never written back into params."""
        first: dict[tuple[int, str], int] = {}
        repeated = {}
        for index in range(len(self.entries)):
            slot, name, _, attributes, kind = self.entries[index]
            seen = first.setdefault((id(slot), name), index)
            if seen != index:
                leaf = self.entries[seen].leaf
                self.entries[index] = new_entry(Entry, (slot, name, leaf, attributes, kind))
                repeated[index] = seen
        if repeated:
            self.repeated = repeated
            self.has_attributes = True
            self.direct = False

    def is_current(self) -> bool:
        """Whether the module tree still has the structure the plan was built on.

        A name that left its dict while another name took its place (the dict's
        size unchanged) is not checked here: reading it raises ``KeyError`` in the
        swap, which then raises ``StalePlan`` and is retried with a new plan. Two
        names that become tied later (``head.weight = emb.weight``) register a
        parameter slot that the swap does not write (``watch``): any such change since
        the build makes the plan stale.
        """
        if self.watch is not None and not self.watch.unchanged():
            return False
        for parent, name, child, parameters, n_parameters, buffers, n_buffers in self.checks:
            if (
                parent.get(name) is not child  # a submodule on a key's path was replaced
                or len(parameters) != n_parameters  # a parameter registered or deleted
                or len(buffers) != n_buffers
            ):
                return False
        for group in self.tie_groups:
            try:
                if not still_tied(group):
                    return False  # tied names were untied
            except KeyError:
                return False
        return True


def attributes_of(plan: Plan, index: int) -> dict[str, Any]:
    """The ``__dict__`` of entry ``index``'s owner module."""
    attributes = plan.entries[index].attributes
    if attributes is None:  # a Route's plan (fcall/_traced.py): read on first need
        assert plan.owners is not None
        attributes = plan.owners[index].__dict__
    return attributes


def read_slots(plan: Plan) -> list[Any]:
    """What each slot of ``plan`` holds; ``StalePlan`` if a name has left its dict."""
    try:
        return list(map(dict.__getitem__, plan.slots, plan.slot_names))
    except KeyError:
        raise StalePlan from None


def still_tied(group: list[tuple[dict, str]]) -> bool:
    """Whether the (slot, name) pairs of ``group`` still hold one tensor."""
    first = group[0][0][group[0][1]]
    for slot, name in group[1:]:
        if slot[name] is not first:
            return False
    return True


class StalePlan(Exception):
    """A cached plan named a slot that is gone: the caller rebuilds and retries."""


def _sized(parameters: dict, buffers: dict) -> tuple[dict, int, dict, int]:
    return parameters, len(parameters), buffers, len(buffers)


_NO_PARENT: dict = {}  # the root's row in Plan.checks: .get("") is None, its "child"
UNWATCHED: dict = {}  # in a row of Plan.checks, the buffers of a module not watched


def unwrap(module: nn.Module) -> tuple[nn.Module, list[str]]:
    """Strip ``torch.compile`` and DDP-style wrappers; return the root and their prefixes."""
    prefixes = []
    while True:
        if isinstance(module, torch._dynamo.eval_frame.OptimizedModule):
            prefixes.append("_orig_mod")
            module = module._orig_mod
        elif isinstance(module, nn.parallel.DistributedDataParallel):
            prefixes.append("module")
            module = module.module
        else:
            return module, prefixes


def strip(root: nn.Module, key: Key, prefixes: list[str]) -> Key:
    for prefix in prefixes:
        if len(key) > 1 and key[0] == prefix and prefix not in root._modules:
            key = key[1:]
    return key


def slot_of(owner: nn.Module, name: str) -> tuple[dict, SlotKind] | None:
    """The dict of ``owner`` that holds ``name``, and its kind; ``None`` if none does."""
    # `in tuple(d)`, not `in d`: traced, `name in d` reads the value too, which makes
    # the module's own tensor a graph input guarded on every call.
    if name in tuple(owner._parameters):
        return owner._parameters, SlotKind.PARAMETER
    if name in tuple(owner._buffers):
        return owner._buffers, SlotKind.BUFFER
    if isinstance(owner.__dict__.get(name), torch.Tensor):
        return owner.__dict__, SlotKind.ATTRIBUTE
    return None


def owner_at(root: nn.Module, path: Sequence[str]) -> nn.Module | None:
    """The submodule of ``root`` at ``path`` (names, through ``_modules``), or ``None``."""
    owner = root
    for part in path:
        child = owner._modules.get(part)
        if child is None:
            return None
        owner = child
    return owner
