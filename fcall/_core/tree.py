"""The module tree as keys see it: wrappers, the optional prefixes, paths and slots.

One unwrap (``unwrap``: ``torch.compile``'s ``OptimizedModule`` and DDP), one rule for the
prefixes a key may carry (``unwrap_for_keys``), a path -> submodule resolver for the fronts
and the registration hooks (``owner_at``; the builder walks each key's path itself, recording
the modules it reads, and a layout's owners are reached by ``bind.descend``) and one
name -> slot rule (``Slots``), for every front and the builder.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .types import Key, SlotKind


def unwrap(module: nn.Module) -> tuple[nn.Module, list[str]]:
    """Strip ``torch.compile`` and DDP-style wrappers; return the root and their prefixes (a
    plain pair: traced, a NamedTuple's class is one more global the guards check on every
    call)."""
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


def unwrap_for_keys(module: nn.Module) -> tuple[nn.Module, list[str]]:
    """``unwrap``, with every prefix a key may carry and ``strip`` drops: the wrappers',
    and ``_orig_mod`` on any module. Dynamo traces a ``torch.compile``-d module as its
    ``_orig_mod``, where the wrapper is not seen: its prefix is accepted everywhere (eager and
    compiled alike) when the module has no submodule of that name."""
    root, prefixes = unwrap(module)
    if "_orig_mod" not in prefixes:
        prefixes.append("_orig_mod")
    return root, prefixes


def strip(root: nn.Module, key: Key, prefixes: list[str]) -> Key:
    """``key`` without the leading ``prefixes`` that name no submodule of ``root``."""
    for prefix in prefixes:
        if len(key) > 1 and key[0] == prefix and prefix not in root._modules:
            key = key[1:]
    return key


class Slots:
    """The one name -> slot rule, over one module: a name is its parameter's, else its
    buffer's, else a plain tensor attribute's (``kind_of``). The names of each dict are read
    once, as a tuple (traced, ``name in d`` reads the value too, which makes the module's own
    tensor a graph input guarded on every call), the buffers' only when a name is not a
    parameter's (traced, each dict read is two guards on every call, and most keys name
    parameters)."""

    __slots__ = ("buffer_names", "buffers", "owner", "parameter_names", "parameters")

    def __init__(self, owner: nn.Module) -> None:
        self.owner = owner
        self.parameters = owner._parameters
        self.buffers = owner._buffers
        self.parameter_names = tuple(self.parameters)
        self.buffer_names: tuple[str, ...] | None = None

    def kind_of(self, name: str) -> SlotKind | None:
        """Which dict of the module holds ``name``; ``None`` if none does."""
        if name in self.parameter_names:
            return SlotKind.PARAMETER
        if self.buffer_names is None:
            self.buffer_names = tuple(self.buffers)
        if name in self.buffer_names:
            return SlotKind.BUFFER
        if isinstance(self.owner.__dict__.get(name), torch.Tensor):
            return SlotKind.ATTRIBUTE
        return None


def owner_of(root: Any, name: str) -> nn.Module | None:
    """The submodule of ``root`` whose slot the dotted ``name`` names (``"0.weight"``:
    ``root``'s submodule ``"0"``; ``"weight"``: ``root``), or ``None``."""
    prefix = name.rpartition(".")[0]
    return owner_at(root, prefix.split(".") if prefix else ())


def owner_at(root: Any, path: Sequence[str]) -> nn.Module | None:
    """The submodule of ``root`` at ``path`` (names, through ``_modules``), or ``None``."""
    owner = root
    for part in path:
        child = owner._modules.get(part) if isinstance(owner, nn.Module) else None
        if child is None:
            return None
        owner = child
    return owner
