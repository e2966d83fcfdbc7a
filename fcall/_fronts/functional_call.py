"""``fcall.functional_call``: torch.func's semantics on the swap pipeline of ``_api.py``.

A swap, a call and a restore; a key the plan refuses (``UnknownKey``) takes
``_extra_keys.py``'s slow path, as torch.func sets such a key as an attribute for the call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import torch
from tensordict import TensorDictBase
from torch import nn

from .. import _errors
from .._core import flatten as _flatten
from .._core.engine import Swap, restore
from . import extra_keys as _extra_keys
from .api import Params, _check_module, _swap_in

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
    if isinstance(params, (tuple, list)):  # torch.func's (params, buffers) form
        params = _merged(params, api)
    elif not isinstance(params, (Mapping, TensorDictBase)):
        raise ValueError(_errors.bad_params_form(api, params))
    try:
        swapped, _ = _swap_in(params, module, api, strict, tie_weights)
    except _errors.UnknownKey:  # nothing was written: torch.func's attribute keys
        if unknown_keys == "raise" and not strict:
            raise
        return _call_with_extras(module, params, args, kwargs, tie_weights, strict)
    try:
        return module(*args, **kwargs)
    finally:
        restore(swapped)


def _call_with_extras(
    module: nn.Module, params: Params, args: tuple, kwargs: dict, tie_weights: bool, strict: bool
) -> Any:
    api = "fcall.functional_call"
    if isinstance(params, Mapping) and "" in params:  # torch.func refuses the empty name
        raise KeyError(_errors.EMPTY_NAME)
    found = _extra_keys.split(params, module, api)
    if strict:
        raise _extra_keys.strict_error(module, found, tie_weights, api) from None

    def swap_in(known: dict[str, Any]) -> Swap:
        return _swap_in(known, module, api, strict, tie_weights)[0]

    return _extra_keys.call_with_extras(
        module, params, found, swap_in, restore, lambda: module(*args, **kwargs)
    )


def _check_stateless(module: Any, api: str) -> None:
    """torch.func's refusals, in its words: TorchScript and ``nn.DataParallel``."""
    _check_module(module, api)
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
    leaves = _flatten.flatten(part, api)
    return [(".".join(key), value) for key, value in zip(leaves.keys, leaves.values)]
