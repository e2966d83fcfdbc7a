"""Ties: which names of a module hold one tensor (``names_and_ties``), found by one walk of
its tensors (``all_named_tensors``), and whether a submodule is at two paths.

A plan built with ``tie_weights=True`` (or ``strict=True``) knows the ties of the module *when
it was built*; a tie made later is seen by the cached plan's ``plan.TieWatch``. Under Dynamo
the ties are found at trace time on the real module (``traced.py``), or, on the generic path,
by this walk in the trace, as ``torch.func.functional_call`` does; nothing is recorded
anywhere. fcall registers no global hook and writes nothing into a module.
"""

from __future__ import annotations

import torch
from torch import nn


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
