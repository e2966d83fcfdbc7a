"""TensorDictParams: the leaves of its copies and conversions, registered as the originals.

``clone()``, ``copy()``, ``deepcopy`` and ``to()`` return fcall's class (tensordict's
own code would build its base class), with ``no_convert`` and the get-post hooks, unlocked
(tensordict: copies are not locked). ``detach()`` is tensordict's (a TensorDict of plain
tensors); ``detach_registered()`` is fcall's detached copy that keeps each entry's
registration. ``.data`` is a TensorDict whose buffers are ``Buffer``
tensors, so wrapping it again registers each entry as before. The functions here take and
return the wrapped TensorDicts; the class (``params.py``) wraps what they return.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from tensordict import TensorDictBase
from torch import nn
from torch.nn.parameter import Buffer

from .rules import convert_leaf

__all__ = ["cloned", "copied_leaves", "detached", "marked_data", "moved"]


def copied_leaves(td: TensorDictBase, param: Callable, buffer: Callable) -> TensorDictBase:
    """``td`` with each Parameter through ``param``, each buffer through ``buffer``, tied
    ones once."""
    memo: dict[int, torch.Tensor] = {}

    def copy_leaf(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        out = memo.get(id(t))
        if out is None:
            out = param(t) if isinstance(t, nn.Parameter) else buffer(t)
            memo[id(t)] = out
        return out

    return cast(TensorDictBase, td.apply(copy_leaf))


def cloned(td: TensorDictBase) -> TensorDictBase:
    """``td`` with every leaf's data cloned, Parameters as Parameters."""
    return copied_leaves(
        td,
        lambda t: nn.Parameter(t.data.clone(), requires_grad=t.requires_grad),
        lambda t: Buffer(t.data.clone()),
    )


def detached(td: TensorDictBase) -> TensorDictBase:
    """``td`` with every leaf detached (shared storage), Parameters as Parameters."""
    return copied_leaves(
        td, lambda t: nn.Parameter(t.detach(), requires_grad=False), lambda t: Buffer(t.detach())
    )


def _marked_data(t: Any) -> Any:
    if isinstance(t, nn.Parameter) or not isinstance(t, torch.Tensor):
        return t.data
    return Buffer(t.data)


def marked_data(td: TensorDictBase) -> TensorDictBase:
    """A TensorDict of the leaves' ``.data``, buffers as ``Buffer`` tensors."""
    return cast(TensorDictBase, td._fast_apply(_marked_data, propagate_lock=True))


def _wrap_like(tensor: torch.Tensor, orig: torch.Tensor) -> torch.Tensor:
    """A leaf that ``to()``, ``cpu()`` or ``cuda()`` returned, registered like the leaf
    ``orig`` it replaces: a Parameter stays one, with its ``requires_grad``, unless its
    dtype is no longer floating or complex; anything else becomes a buffer."""
    if tensor is orig:
        return tensor
    if isinstance(orig, nn.Parameter) and (tensor.is_floating_point() or tensor.is_complex()):
        return nn.Parameter(tensor, requires_grad=orig.requires_grad)
    return convert_leaf(tensor, no_convert=True)


def moved(params: TensorDictBase, original: TensorDictBase) -> TensorDictBase:
    """``params`` (``original`` moved or cast) with each leaf registered as in ``original``."""
    # Not None: apply() returns None only when fn returns None for every leaf.
    return cast(TensorDictBase, params.apply(_wrap_like, original))
