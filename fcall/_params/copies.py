"""TensorDictParams: copies and conversions that keep each entry's registration.

``clone()``, ``copy()``, ``deepcopy`` and ``to()`` return fcall's class (tensordict's
own code would build its base class), with ``no_convert`` and the get-post hooks, unlocked
(tensordict: copies are not locked). ``detach()`` is tensordict's (a TensorDict of plain
tensors); ``detach_registered()`` is fcall's detached copy that keeps each entry's
registration. ``.data`` is a TensorDict whose buffers are ``Buffer``
tensors, so wrapping it again registers each entry as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Self, cast

import torch
from tensordict import TensorDictBase
from torch import nn
from torch.nn.parameter import Buffer

from .rules import SKIP, convert_leaf

# To the type checker the mixin is a tensordict TensorDictParams (the class it is mixed into
# derives from it); at runtime it derives from object.
if TYPE_CHECKING:
    from tensordict.nn import TensorDictParams as _MixinBase
else:
    _MixinBase = object

__all__ = ["Copies"]


def _marked_data(t: Any) -> Any:
    if isinstance(t, nn.Parameter) or not isinstance(t, torch.Tensor):
        return t.data
    return Buffer(t.data)


def _wrap_like(tensor: torch.Tensor, orig: torch.Tensor) -> torch.Tensor:
    """A leaf that ``to()``, ``cpu()`` or ``cuda()`` returned, registered like the leaf
    ``orig`` it replaces: a Parameter stays one, with its ``requires_grad``, unless its
    dtype is no longer floating or complex; anything else becomes a buffer."""
    if tensor is orig:
        return tensor
    if isinstance(orig, nn.Parameter) and (tensor.is_floating_point() or tensor.is_complex()):
        return nn.Parameter(tensor, requires_grad=orig.requires_grad)
    return convert_leaf(tensor, no_convert=True)


class Copies(_MixinBase):
    """Mixin of fcall.TensorDictParams: its copies and conversions."""

    def _new_like(self, param_td: TensorDictBase) -> Self:
        # The leaves are registered already ("skip"); copies are not locked (tensordict).
        out = type(self)(param_td, no_convert=SKIP)
        object.__setattr__(out, "no_convert", self.no_convert)
        out._get_post_hook.extend(self._get_post_hook)
        return out

    def _copy_leaves(self, param: Callable, buffer: Callable) -> Self:
        """Each Parameter through ``param``, each buffer through ``buffer``, tied ones once."""
        memo: dict[int, torch.Tensor] = {}

        def copy_leaf(t: Any) -> Any:
            if not isinstance(t, torch.Tensor):
                return t
            out = memo.get(id(t))
            if out is None:
                out = param(t) if isinstance(t, nn.Parameter) else buffer(t)
                memo[id(t)] = out
            return out

        return self._new_like(self._param_td.apply(copy_leaf))

    def _clone(self, recurse: bool = True) -> Self:
        if not recurse:
            return self._new_like(self._param_td.copy())
        return self._copy_leaves(
            lambda t: nn.Parameter(t.data.clone(), requires_grad=t.requires_grad),
            lambda t: Buffer(t.data.clone()),
        )

    def detach_registered(self) -> Self:
        """A TensorDictParams of detached leaves (shared storage), registered as here.

        fcall's own method. Parameters stay Parameters (``requires_grad=False``), buffers
        stay buffers, so ``p.detach_registered().clone()`` is a copy of a net with buffers
        that registers its running stats as buffers. ``detach()`` is tensordict's: it
        returns a TensorDict of plain tensors (wrapped again, its float buffers would
        become Parameters).

        Examples:
            >>> from torch import nn
            >>> import fcall
            >>> p = fcall.from_module(nn.BatchNorm1d(2), as_module=True)
            >>> type(p.detach()).__name__, type(p.detach_registered()).__name__
            ('TensorDict', 'TensorDictParams')
            >>> len(list(p.detach_registered().clone().buffers()))
            3
        """
        return self._copy_leaves(
            lambda t: nn.Parameter(t.detach(), requires_grad=False), lambda t: Buffer(t.detach())
        )

    @property  # type: ignore[misc]
    def data(self) -> TensorDictBase:
        """A TensorDict of the leaves' ``.data``, buffers marked as buffers.

        As tensordict's, a TensorDict (tensordict's in-place methods write through it); its
        buffers are ``Buffer`` tensors, so ``TensorDictParams(p.data)`` registers each entry
        as here.
        """
        return self._param_td._fast_apply(_marked_data, propagate_lock=True)

    def __deepcopy__(self, memo: dict) -> Self:  # type: ignore[override]
        return self._clone(recurse=True)

    def __copy__(self) -> Self:
        return self._clone(recurse=False)

    # to(), cpu() and cuda() as tensordict 0.15 has them, on every tensordict (0.14's
    # return a tensordict.nn.TensorDictParams that registers every leaf anew by dtype).
    def to(self, *args: Any, **kwargs: Any) -> Self:
        return self._moved(self._param_td.to(*args, **kwargs))

    def cpu(self, **kwargs: Any) -> Self:
        return self._moved(self._param_td.cpu(**kwargs))

    def cuda(self, device: Any = None, **kwargs: Any) -> Self:
        return self._moved(self._param_td.cuda(device=device, **kwargs))

    def _moved(self, params: TensorDictBase) -> Self:
        if params is self._param_td:
            return self
        # Not None: apply() returns None only when fn returns None for every leaf.
        return self._new_like(cast(TensorDictBase, params.apply(_wrap_like, self._param_td)))

    def _apply(self, fn: Callable, recurse: bool = True) -> Self:
        out = super()._apply(fn, recurse=recurse)
        if self._views is not None:
            self._views.clear()
            self._build_views()
        return out

    def __repr__(self) -> str:
        return f"TensorDictParams(params={self._param_td})"
