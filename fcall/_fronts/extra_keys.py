"""``functional_call``'s keys that name no parameter or buffer, as ``torch.func`` treats them.

``torch.func.functional_call`` (``torch.nn.utils._named_member_accessor.swap_tensor`` with
``allow_missing=True``) sets such a key as an attribute of its submodule for the duration
of the call: ``forward`` can read it, an ``nn.Parameter`` value registers (it shows in
``parameters()``), and the attribute is deleted (or the old value put back) afterwards. A
key under a submodule that does not exist raises ``AttributeError``; a key naming an
attribute that is neither a tensor nor ``None`` raises ``TypeError``; ``strict=True`` raises
``RuntimeError`` listing the unexpected and the missing keys. Every check runs before
anything is written.

This is the slow path: the swap's own plan refused a key (``UnknownKey``), so nothing was
written, and the keys are split here into the ones the plan takes and the extras.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn

from .. import _errors
from .._core import flatten as _flatten
from .._core.plan import owner_at, slot_of, strip, unwrap
from .._core.ties import all_named_tensors, names_and_ties

_MISSING = object()


@dataclass(slots=True)
class Extra:
    """A key set as an attribute for the call: its submodule's path (then the submodule,
    found by ``check_extras``), its name, value and what it held."""

    path: tuple[str, ...]
    name: str
    value: Any
    old: Any
    owner: nn.Module | None = None


@dataclass(slots=True)
class Split:
    """``params`` split into what the swap takes (flat names) and the extras."""

    known: dict[str, Any]
    given: list[str]  # the module names of the known keys (wrapper prefixes stripped)
    extras: list[Extra]
    unexpected: list[str]


def split(params: Any, module: nn.Module, api: str) -> Split:
    """The known keys (as a flat dict of dotted names) and the extras of ``params``."""
    leaves = _flatten.flatten(params, api)
    root, prefixes = unwrap(module)
    if "_orig_mod" not in prefixes:
        prefixes.append("_orig_mod")
    known: dict[str, Any] = {}
    given: list[str] = []
    extras: list[Extra] = []
    unexpected: list[str] = []
    for key, value in zip(leaves.keys, leaves.values):
        stripped = strip(root, key, prefixes)
        owner = owner_at(root, stripped[:-1])
        name = stripped[-1]
        if owner is not None and slot_of(owner, name) is not None:
            known[".".join(key)] = value
            given.append(".".join(stripped))
            continue
        unexpected.append(".".join(stripped))
        extras.append(Extra(stripped[:-1], name, value, _MISSING))
    return Split(known, given, extras, unexpected)


def _submodule(root: nn.Module, path: tuple[str, ...]) -> nn.Module:
    """``NamedMemberAccessor.get_submodule``: its errors, word for word."""
    owner = root
    for depth, part in enumerate(path):
        try:
            child = getattr(owner, part)
        except AttributeError as ex:
            raise AttributeError(f"{owner._get_name()} has no attribute `{part}`") from ex
        if not isinstance(child, nn.Module):
            name = ".".join(path[: depth + 1])
            raise TypeError(f"submodule `{name}`: {child} is not an instance of torch.nn.Module")
        owner = child
    return owner


def check_extras(module: nn.Module, extras: list[Extra]) -> None:
    """torch's checks of an attribute key (``swap_tensor``), before anything is written;
    finds each key's submodule (after ``strict``'s check, as torch.func)."""
    root, _ = unwrap(module)
    for extra in extras:
        extra.owner = _submodule(root, extra.path)
        if extra.value is not None and not isinstance(extra.value, torch.Tensor):
            raise TypeError(f"{extra.value} is not an instance of torch.Tensor")
        if hasattr(extra.owner, extra.name):
            old = getattr(extra.owner, extra.name)
            if old is not None and not isinstance(old, torch.Tensor):
                raise TypeError(
                    f"attribute `{extra.name}`: {old} is not an instance of torch.Tensor"
                )
            extra.old = old


def strict_error(module: nn.Module, found: Split, tie_weights: bool, api: str) -> RuntimeError:
    """``strict=True`` with unexpected keys: torch's message, and fcall's detail."""
    root, _ = unwrap(module)
    names, tied = names_and_ties(all_named_tensors(root))
    given = set(found.given)
    if tie_weights:
        for group in tied:
            if given.intersection(group):
                given.update(group)
    missing = sorted(name for name in names if name not in given)  # sorted, as torch's
    return RuntimeError(_errors.unexpected_keys(api, root._get_name(), found.unexpected, missing))


def call_with_extras(
    module: nn.Module,
    params: Any,
    found: Split,
    swap_in: Callable[[dict[str, Any]], Any],
    restore: Callable[[Any], Any],
    call: Callable[[], Any],
) -> Any:
    """Swap the known keys in, set the extras, ``call()``, then undo both (in reverse)."""
    check_extras(module, found.extras)
    swapped = swap_in(found.known)
    try:
        for extra in found.extras:
            setattr(extra.owner, extra.name, extra.value)
        try:
            return call()
        finally:
            for extra in reversed(found.extras):
                if extra.old is _MISSING:
                    if hasattr(extra.owner, extra.name):
                        delattr(extra.owner, extra.name)
                else:
                    setattr(extra.owner, extra.name, extra.old)
    finally:
        before = dict(found.known)
        restore(swapped)
        _write_back(params, before, found.known)


def _write_back(params: Any, before: dict[str, Any], after: dict[str, Any]) -> None:
    """Values that ``forward`` reassigned go back into ``params`` (as torch.func's)."""
    for name, value in after.items():
        if value is before[name]:
            continue
        if isinstance(params, dict) and name in params:
            params[name] = value
        elif isinstance(params, TensorDictBase):
            params[tuple(name.split("."))] = value
