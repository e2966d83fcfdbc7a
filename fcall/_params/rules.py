"""TensorDictParams: which leaf becomes a Parameter, which a buffer, which stays unregistered.

tensordict's rules (``tensordict/nn/params.py``: ``_maybe_make_param``,
``_maybe_make_param_or_buffer``, ``_apply_leaves``), written without ``type()`` on a
Parameter made in the graph (crashes Dynamo) and without ``with td.unlock_():``.

* ``no_convert=False``: float16/32/64 tensors -> ``nn.Parameter``; other tensors -> ``Buffer``
  (a batched tensor, under ``vmap``, -> ``BufferLegacy``, which keeps it as it is).
* ``no_convert=True``: a tensor that requires grad (or is batched) -> ``BufferLegacy`` (keeps
  its autograd history: ``w.expand(2, 3)`` still sends gradients to ``w``); others -> ``Buffer``.
* ``no_convert="skip"``: nothing is converted at construction; a Parameter registers as a
  parameter, any other tensor as a buffer. Entries set later follow the ``True`` rule (``"skip"``
  is truthy in tensordict's ``_unlock_and_set``).
* Parameters and buffers given as such stay as they are; non-tensor data
  (``NonTensorData``, strings) stays unregistered.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase
from tensordict._td import _SubTensorDict
from tensordict.nn import TensorDictParams as _TDParamsBase
from tensordict.utils import is_batchedtensor, is_non_tensor
from torch import nn
from torch.compiler import is_dynamo_compiling
from torch.nn.parameter import Buffer

from .._compat import BufferLegacy

SKIP = "skip"
_PARAM_DTYPES = (torch.float16, torch.float32, torch.float64)
# tensordict's messages, word for word (tensordict/nn/params.py, _apply_leaves).
_REFUSED = {
    cls: f"Using a {cls.__name__} within a TensorDictParams isn't permitted."
    for cls in (LazyStackedTensorDict, _SubTensorDict)
}


def is_registered(value: Any) -> bool:
    """Whether ``value`` already is a Parameter or a buffer (isinstance only: ``type(p)`` on
    a Parameter built in the graph crashes Dynamo)."""
    return isinstance(value, (nn.Parameter, Buffer, BufferLegacy))


def check_mode(no_convert: Any) -> bool | str:
    """``"skip"`` or a bool, as tensordict reads ``no_convert``."""
    return SKIP if isinstance(no_convert, str) and no_convert == SKIP else bool(no_convert)


def _batched(value: torch.Tensor) -> bool:
    # Not asked while Dynamo traces: functorch's is_batchedtensor there makes the guard
    # builder crash (NameError: SYNTHETIC_LOCAL) on a tensor made in the graph.
    return not is_dynamo_compiling() and is_batchedtensor(value)


def convert_leaf(value: Any, no_convert: bool | str) -> Any:
    """One leaf under the rule above (``"skip"`` as ``True``: the rule for later writes)."""
    if not isinstance(value, torch.Tensor) or is_registered(value):
        return value
    if not no_convert:
        if value.dtype in _PARAM_DTYPES:
            return nn.Parameter(value)
        return BufferLegacy(value) if _batched(value) else Buffer(value)
    if value.requires_grad or _batched(value):
        return BufferLegacy(value)
    return Buffer(value)


def refuse_unsupported(value: Any) -> None:
    """tensordict's RuntimeError for a lazy stack or a sub-TensorDict."""
    for cls, message in _REFUSED.items():
        if isinstance(value, cls):
            raise RuntimeError(message)


def convert_tree(td: Any, no_convert: bool | str) -> None:
    """Converts the leaves of ``td`` in place (the spec: wraps without copying)."""
    refuse_unsupported(td)
    if not isinstance(td, TensorDict):
        raise TypeError(
            f"fcall.TensorDictParams: expected a TensorDict (or dict) of tensors, got a "
            f"{type(td).__name__}. Convert it first with `.to_tensordict()`."
        )
    if no_convert == SKIP:
        _check_tree(td)
        return
    for key, value in list(td._tensordict.items()):
        if isinstance(value, TensorDictBase) and not is_non_tensor(value):
            # a TensorDictParams (a module's own, from_module) is registered already
            if not isinstance(value, _TDParamsBase):
                convert_tree(value, no_convert)
            continue
        new = convert_leaf(value, no_convert)
        if new is not value:
            td._set_str(key, new, inplace=False, validated=True, ignore_lock=True)


def _check_tree(td: TensorDictBase) -> None:
    for value in td._tensordict.values():
        if (
            isinstance(value, TensorDictBase)
            and not is_non_tensor(value)
            and not isinstance(value, _TDParamsBase)  # registered already
        ):
            refuse_unsupported(value)
            _check_tree(value)


def tensor_leaves(td: TensorDictBase, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple, Any]]:
    """(key, tensor) for each tensor leaf of an exact TensorDict tree, in order.

    Not ``td.items(True, True)``: it calls ``type()`` on every leaf, and on a Parameter made
    while Dynamo traces that crashes the guard builder (``NameError: SYNTHETIC_LOCAL``).
    """
    for key, value in td._tensordict.items():
        path = (*prefix, key)
        if isinstance(value, torch.Tensor):
            yield path, value
        elif isinstance(value, TensorDict):
            yield from tensor_leaves(value, path)
        elif isinstance(value, TensorDictBase) and not is_non_tensor(value):
            for sub, leaf in value.items(True, True):
                yield path + ((sub,) if isinstance(sub, str) else sub), leaf


def nested_tensordicts(td: TensorDictBase, prefix: tuple[str, ...] = ()) -> Iterator[tuple]:
    """(key, TensorDict) for each nested exact TensorDict, parents first."""
    for key, value in td._tensordict.items():
        if not isinstance(value, torch.Tensor) and isinstance(value, TensorDict):
            yield (*prefix, key), value
            yield from nested_tensordicts(value, (*prefix, key))


def lock_tree(td: TensorDictBase) -> None:
    """``td._propagate_lock`` (what ``lock_()`` does, without its compile warning).

    While Dynamo traces, the nodes are flagged here as ``_propagate_lock(is_compiling=True)``
    flags them (no parent weakrefs, no schema), without its ``type()`` on every leaf.
    """
    if not is_dynamo_compiling():
        td._propagate_lock(is_compiling=torch.compiler.is_compiling())
        return
    td._is_locked = True
    for _, sub in nested_tensordicts(td):
        sub._is_locked = True
