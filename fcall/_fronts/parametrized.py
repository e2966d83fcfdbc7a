"""A value under a parametrized tensor's plain name: the parametrization off for the call.

torch documents that ``functional_call(m, {"weight": W})`` on a parametrized ``weight``
"completely disables the parametrization" for the call. ``torch.func`` instead sets ``W``
through the parametrization's ``right_inverse`` and sets the old value back through it
afterwards (pytorch/pytorch#186565): ``parametrizations.weight.original*`` come back with
other values, and a parametrization without ``right_inverse`` refuses the key.

fcall does what the documentation says, with nothing but swaps of dict entries that
already exist, each undone exactly: in the module's ``ParametrizationList`` the first
parametrization becomes ``FIRST`` (a stateless module that returns its first input), the
ones after it leave the list, and the first original (``original`` or ``original0``) holds
``W``. The parametrized property then returns ``W`` itself; no ``right_inverse`` runs and
no original is written. Restore puts the very same objects back, in their order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize

from .._compat import hold_dicts, settle_dicts


class _First(nn.Module):
    """The parametrization that gives back its first input (the value given for the call)."""

    def forward(self, *originals: Any) -> Any:
        return originals[0]


FIRST = _First()


@dataclass(slots=True)
class Bypass:
    """What ``bypass`` changed in one ``ParametrizationList``, to undo it."""

    modules: dict[str, Any]  # the list's _modules
    slot: dict[str, Any]  # the dict of the first original: the list's _parameters or _buffers
    original: str  # the first original's name
    old_modules: list[tuple[str, Any]]  # the list's _modules as they were, in order
    old_original: Any


def is_parametrized(owner: Any, name: str) -> bool:
    """Whether ``owner.name`` is a parametrized tensor."""
    return isinstance(owner, nn.Module) and parametrize.is_parametrized(owner, name)


def bypass(owner: nn.Module, name: str, value: Any) -> Bypass:
    """``owner.name`` is ``value`` until ``undo``; nothing of the parametrization is run."""
    plist: Any = owner.parametrizations._modules[name]  # type: ignore[union-attr]
    # `original` for a parametrization of one tensor, `original0...` for one that its
    # right_inverse splits; a Parameter's originals are Parameters, a buffer's buffers
    original = "original" if plist.is_tensor else "original0"
    slot = plist._parameters if original in plist._parameters else plist._buffers
    modules = plist._modules
    done = Bypass(modules, slot, original, list(modules.items()), slot[original])
    if torch.compiler.is_compiling():  # nothing for Dynamo to replay after the graph
        hold_dicts((modules, slot))
    modules.clear()
    modules["0"] = FIRST
    slot[original] = value
    return done


def undo(done: Bypass) -> None:
    """The very same parametrization back, its modules in their order, its original."""
    done.modules.clear()
    done.modules.update(done.old_modules)
    done.slot[done.original] = done.old_original
    if torch.compiler.is_compiling():
        settle_dicts((done.modules, done.slot))
