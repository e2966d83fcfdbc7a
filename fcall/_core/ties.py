"""Ties: which names of a module hold one tensor, and how a cached eager plan sees a tie
made after it was built, with no hook anywhere.

A plan built with ``tie_weights=True`` (or ``strict=True``) knows which names of the
module hold one tensor *when it was built*. A tie made later (``m.head.weight =
m.emb.weight``, ``m[1] = m[0]``, a new parameter registered anywhere in the tree) changes
an object in a parameter or submodule slot, or the size of a slot dict. ``TieWatch``
keeps, for the plan, every such slot that the swap itself does not write, and
``unchanged()`` compares them by identity in one C-level pass before each reuse of the
plan: a change rebuilds the plan, which then sees the tie. The slots the plan writes (the
given keys and their aliases) are left out: between nested swaps they hold another swap's
values, and watching them would rebuild the plan of every nested swap.

Not seen in eager, then: a tie made later between two names that are *both* given (each
gets its own value, where torch.func would ask for one value for both), and a tie of two
buffers (a forward that reassigns a buffer, ``self.count = self.count + 1``, would make
every plan stale on every call; ``docs/behaviour.md``).

Under Dynamo no plan is cached: the ties are found at trace time on the real module
(``fcall/_traced.py``), or, on the generic path, by a walk of the module's tensors in the
trace, as ``torch.func.functional_call`` does; nothing is recorded anywhere. fcall
registers no global hook and writes nothing into a module.
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import is_

import torch
from torch import nn


class TieWatch:
    """The parameter and submodule slots of a tree that a plan does not write."""

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

    def unchanged(self) -> bool:
        """Whether every watched slot holds the same object, and no slot dict grew or shrank."""
        return list(map(len, self.sized)) == self.sizes and all(
            map(is_, map(dict.get, self.dicts, self.names), self.values)
        )


def all_named_tensors(root: nn.Module) -> dict[str, torch.Tensor]:
    """``named_parameters(remove_duplicate=False)`` then ``named_buffers(...)``, in one
    walk without generators: Dynamo traces this on every compile."""
    parameters: dict[str, torch.Tensor] = {}
    buffers: dict[str, torch.Tensor] = {}
    _collect(root, "", parameters, buffers, [])
    parameters.update(buffers)
    return parameters


def _collect(
    module: nn.Module, prefix: str, parameters: dict, buffers: dict, ancestors: list
) -> None:
    for name, value in module._parameters.items():
        if value is not None:
            parameters[prefix + name] = value
    for name, buffer in module._buffers.items():
        if buffer is not None:
            buffers[prefix + name] = buffer
    ancestors.append(module)
    for name, child in module._modules.items():
        # A child that is its own ancestor (a reference cycle, `m[0].m = m`) is not walked
        # again: its names are already collected under the shorter path.
        if child is not None and not any(child is a for a in ancestors):
            _collect(child, prefix + name + ".", parameters, buffers, ancestors)
    ancestors.pop()


def names_and_ties(named: dict) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    """Every name of ``named`` (``all_named_tensors``), and the groups of names that hold
    one tensor."""
    names_of: dict[torch.Tensor, list[str]] = {}
    for name, tensor in named.items():
        names_of.setdefault(tensor, []).append(name)
    return tuple(named), tuple(tuple(group) for group in names_of.values() if len(group) > 1)


def has_shared_submodule(module: nn.Module, seen: set[nn.Module]) -> bool:
    """Whether a submodule of ``module`` is at two paths (``m[1] = m[0]``), by identity of
    the modules only: no tensor of the tree is read (traced, each would be guarded). A set,
    as ``nn.Module.named_modules`` keeps its memo: traced, membership is by the object, with
    no guard on its id, and the walk stays linear in the modules."""
    seen.add(module)
    for child in module._modules.values():
        if child is None:
            continue
        if child in seen or has_shared_submodule(child, seen):
            return True
    return False
