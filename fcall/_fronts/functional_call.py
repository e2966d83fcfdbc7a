"""``fcall.functional_call``: ``torch.func.functional_call``'s semantics on fcall's swap.

A swap, a call and a restore (``engine.swap_in``). A key the plan refuses (``UnknownKey``:
nothing was written) takes the slow path below, the extras:

``functional_call``'s keys that name no parameter or buffer, as ``torch.func`` treats them.

``torch.func.functional_call`` (``torch.nn.utils._named_member_accessor.swap_tensor`` with
``allow_missing=True``) sets such a key as an attribute of its submodule for the duration
of the call: ``forward`` can read it, an ``nn.Parameter`` value registers (it shows in
``parameters()``), and the attribute is deleted (or the old value put back) afterwards. A
key under a submodule that does not exist raises ``AttributeError``; a key naming an
attribute that is neither a tensor nor ``None`` raises ``TypeError``; ``strict=True`` raises
``RuntimeError`` listing the unexpected and the missing keys. Every check runs before
anything is written.

The keys are split into the ones the plan takes and the extras.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from tensordict import TensorDictBase
from torch import nn

from .. import _errors
from .._core.engine import restore, swap_in, write_back
from .._core.flatten import Leaves, flatten
from .._core.ties import all_named_tensors, names_and_ties
from .._core.tree import Slots, owner_at, strip, unwrap, unwrap_for_keys
from .._core.types import Swap
from .._errors import Fault
from . import parametrized
from .swap import Params

__all__ = ["functional_call"]


def functional_call(
    module: nn.Module,
    params: Params | tuple | list,
    args: Any = None,
    kwargs: dict[str, Any] | None = None,
    *,
    tie_weights: bool = True,
    strict: bool = False,
    unknown_keys: Literal["attribute", "raise"] = "attribute",
) -> Any:
    """Call ``module`` with ``params`` in place of its parameters and buffers.

    ``torch.func.functional_call``'s semantics (every argument, its errors), that also
    takes a nested TensorDict, a TensorDictParams or a nested dict. ``args=None`` means no
    positional argument; a non-tuple ``args`` is one positional argument. A key that names
    no parameter or buffer is set as an attribute of its submodule for the call (a
    Parameter value registers), as torch.func does; ``strict=True`` raises
    ``RuntimeError`` on unexpected and on missing keys. ``unknown_keys="raise"`` (fcall's
    own keyword) raises ``KeyError`` naming the unknown key and the nearest existing ones
    instead, before anything is written, as ``fcall.swap`` does; missing keys still keep the
    module's own values. The module is restored exactly on return and on exception.

    Examples:
        >>> import torch
        >>> from torch import nn
        >>> import fcall
        >>> from tensordict import TensorDict
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        >>> params = TensorDict({"0": {"weight": torch.eye(2), "bias": torch.ones(2)}})
        >>> fcall.functional_call(model, params, (torch.tensor([1.0, -3.0]),))
        tensor([2., 0.])
        >>> fcall.functional_call(model, {"0.extra": torch.ones(1)}, torch.ones(2)).shape
        torch.Size([2])
        >>> hasattr(model[0], "extra")
        False
    """
    api = "fcall.functional_call"
    if unknown_keys != "attribute" and unknown_keys != "raise":
        raise ValueError(
            f"{api}: unknown_keys must be 'attribute' (torch.func's behaviour) or 'raise', "
            f"got {unknown_keys!r}."
        )
    _check_stateless(module, api)
    if args is None:
        args = ()
    elif not isinstance(args, tuple):
        args = (args,)
    if kwargs is None:
        kwargs = {}
    if not isinstance(params, (tuple, list, Mapping, TensorDictBase)):
        raise ValueError(_errors.bad_params_form(api, params))
    try:  # the core's faults, worded once, outside the except clause
        if isinstance(params, (tuple, list)):  # torch.func's (params, buffers) form
            params = _merged(params, api)
        try:
            swapped: Swap | None = swap_in(params, module, strict, tie_weights)[0]
        except Fault as fault:  # nothing was written
            if not fault.is_unknown_key() or (unknown_keys == "raise" and not strict):
                raise
            swapped = None  # torch.func's attribute keys: set for the call
        if swapped is None:  # outside the except clause: the forward's errors chain to nothing
            return _call_with_extras(module, params, args, kwargs, tie_weights, strict)
    except Fault as fault:
        error = fault.worded(api)
    else:
        try:
            return module(*args, **kwargs)
        finally:
            restore(swapped)
    raise error


def _call_with_extras(
    module: nn.Module, params: Params, args: tuple, kwargs: dict, tie_weights: bool, strict: bool
) -> Any:
    api = "fcall.functional_call"
    if isinstance(params, Mapping) and "" in params:  # torch.func refuses the empty name
        raise KeyError(_errors.EMPTY_NAME)
    found = _split(params, module)
    if strict:
        raise _strict_error(module, found, tie_weights, api) from None
    _check_extras(module, found.extras)
    swapped, _ = swap_in(found.known, module, strict, tie_weights)
    try:
        for extra in found.extras:
            if extra.parametrized:  # the parametrization off for the call, as torch documents
                extra.old = parametrized.bypass(extra.owner, extra.name, extra.value)  # type: ignore[arg-type]
            else:
                setattr(extra.owner, extra.name, extra.value)
        try:
            return module(*args, **kwargs)
        finally:
            for extra in reversed(found.extras):
                if extra.parametrized:
                    parametrized.undo(extra.old)
                elif extra.old is _MISSING:
                    if hasattr(extra.owner, extra.name):
                        delattr(extra.owner, extra.name)
                else:
                    setattr(extra.owner, extra.name, extra.old)
    finally:
        before = list(found.known.values())
        restore(swapped)
        changed = zip(found.leaf_of, before, found.known.values())
        write_back(found.leaves, [(leaf, now) for leaf, old, now in changed if now is not old])


def _check_stateless(module: Any, api: str) -> None:
    """torch.func's refusals, in its words: TorchScript and ``nn.DataParallel``."""
    if not isinstance(module, nn.Module):
        raise TypeError(_errors.not_a_module(api, module))
    if (
        torch.jit.is_tracing()
        or torch.jit.is_scripting()
        or isinstance(module, (torch.jit.RecursiveScriptModule, torch.jit.ScriptModule))
    ):
        raise RuntimeError(_errors.scripted_module(api, module))
    if isinstance(module, nn.DataParallel):
        raise RuntimeError(_errors.data_parallel(api))


def _merged(dicts: tuple | list, api: str) -> dict[str, Any]:
    """The dicts of a ``(params, buffers)`` tuple as one flat dict, as torch.func merges
    them; a key given by two of them raises ``ValueError`` (nothing is written)."""
    merged: dict[str, Any] = {}
    given = 0
    for position in range(len(dicts)):
        for name, value in _flat_items(dicts[position], position, api):
            merged[name] = value
            given += 1
    if given != len(merged):
        counts: dict[str, int] = {}
        for position in range(len(dicts)):
            for name, _ in _flat_items(dicts[position], position, api):
                counts[name] = counts.get(name, 0) + 1
        twice = [name for name, count in counts.items() if count > 1]
        raise ValueError(_errors.given_in_two_dicts(api, twice))
    return merged


def _flat_items(part: Any, position: int, api: str) -> Any:
    """``(dotted name, value)`` of one dict of the tuple form."""
    if not isinstance(part, (Mapping, TensorDictBase)):
        raise ValueError(_errors.bad_params_part(api, position, part))
    if isinstance(part, dict) and not any(
        isinstance(value, (Mapping, TensorDictBase)) for value in part.values()
    ):
        return part.items()  # flat already, as torch.func takes it
    leaves = flatten(part)
    return [(".".join(key), value) for key, value in zip(leaves.keys, leaves.values)]


# torch.func's keys that name no parameter or buffer: attributes for the call

_MISSING = object()


@dataclass(slots=True)
class _Extra:
    """A key set as an attribute for the call: its submodule's path (then the submodule,
    found by ``check_extras``), its name, value and what it held."""

    path: tuple[str, ...]
    name: str
    value: Any
    old: Any
    owner: nn.Module | None = None
    parametrized: bool = False  # a parametrized tensor's plain name (parametrized.py)


@dataclass(slots=True)
class _Split:
    """``params`` split into what the swap takes (flat names) and the extras."""

    leaves: Leaves  # of params
    known: dict[str, Any]
    leaf_of: list[int]  # the leaf of each known key
    given: list[str]  # the module names of the known keys (wrapper prefixes stripped)
    extras: list[_Extra]
    unexpected: list[str]


def _split(params: Any, module: nn.Module) -> _Split:
    """The known keys (as a flat dict of dotted names) and the extras of ``params``."""
    leaves = flatten(params)
    root, prefixes = unwrap_for_keys(module)
    known: dict[str, Any] = {}
    leaf_of: list[int] = []
    given: list[str] = []
    extras: list[_Extra] = []
    unexpected: list[str] = []
    for leaf, (key, value) in enumerate(zip(leaves.keys, leaves.values)):
        stripped = strip(root, key, prefixes)
        owner = owner_at(root, stripped[:-1])
        name = stripped[-1]
        if owner is not None and Slots(owner).kind_of(name) is not None:
            known[".".join(key)] = value
            leaf_of.append(leaf)
            given.append(".".join(stripped))
            continue
        unexpected.append(".".join(stripped))
        extras.append(_Extra(stripped[:-1], name, value, _MISSING))
    return _Split(leaves, known, leaf_of, given, extras, unexpected)


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


def _check_extras(module: nn.Module, extras: list[_Extra]) -> None:
    """torch's checks of an attribute key (``swap_tensor``), before anything is written;
    finds each key's submodule (after ``strict``'s check, as torch.func)."""
    root, _ = unwrap(module)
    for extra in extras:
        extra.owner = _submodule(root, extra.path)
        if extra.value is not None and not isinstance(extra.value, torch.Tensor):
            raise TypeError(f"{extra.value} is not an instance of torch.Tensor")
        if parametrized.is_parametrized(extra.owner, extra.name):
            extra.parametrized = True  # its old value is not read: no parametrization runs
        elif hasattr(extra.owner, extra.name):
            old = getattr(extra.owner, extra.name)
            if old is not None and not isinstance(old, torch.Tensor):
                raise TypeError(
                    f"attribute `{extra.name}`: {old} is not an instance of torch.Tensor"
                )
            extra.old = old


def _strict_error(module: nn.Module, found: _Split, tie_weights: bool, api: str) -> RuntimeError:
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
