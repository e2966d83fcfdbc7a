"""TensorDictParams: a TensorDict whose leaves are the parameters and buffers of an nn.Module.

Design (see docs/tensordictparams.md for the long form):

* A subclass of ``tensordict.nn.TensorDictParams``: it inherits the TensorDictBase methods
  that forward to the wrapped TensorDict (``_param_td``) and is an instance of both
  ``TensorDictBase`` and ``nn.Module``. It overrides the paths that break under
  ``torch.compile`` or misbehave eagerly: construction, every write, reads, locking, copies.
* One class over one base: ``tree.ParamsTree`` (a subclass of tensordict's class) holds the
  state, set in one place (``_init_state``), the wrapped tree, its registration, writes,
  nested views and lock; this module's class adds construction, the public reads and writes,
  and copies. Beside them, functions with closed jobs: the registration rules, tensordict's
  (``rules.py``); how it is built in one untraced call (``build.py``); the leaves of copies
  and conversions, registered as the originals (``copies.py``: TensorDicts in and out).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Self, cast

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.base import NO_DEFAULT, _is_tensor_collection
from tensordict.nn import TensorDictParams as _TDParamsBase
from tensordict.utils import is_non_tensor
from torch import nn
from torch.compiler import is_dynamo_compiling

from . import copies
from .build import build_untraced
from .rules import SKIP, check_mode, convert_tree, lock_tree
from .tree import ParamsTree, module_init

__all__ = ["TensorDictParams"]

_MISSING = object()


def _as_key(index: Any) -> tuple[str, ...] | None:
    if isinstance(index, str):
        return (index,)
    if isinstance(index, tuple) and index and all(isinstance(k, str) for k in index):
        return index
    return None


class TensorDictParams(ParamsTree):
    r"""A TensorDict whose entries are registered as the parameters and buffers of an nn.Module.

    Float16/32/64 tensors become :class:`~torch.nn.Parameter`, tensors of any other dtype
    become buffers (all of them with ``no_convert=True``); entries set later follow the same
    rule, and non-tensor data stays unregistered. ``no_convert="skip"`` converts nothing: a
    Parameter registers as a parameter, any other tensor as a buffer. It wraps the TensorDict it
    is given without a copy, so entries added to that TensorDict directly after construction
    show through indexing but not in ``parameters()``: write through the TensorDictParams, or
    pass ``lock=True``. ``lock=True`` locks the wrapped TensorDict; writes through the
    TensorDictParams still work (``lock_()`` blocks them too, as in tensordict).

    Examples:
        >>> import torch
        >>> from torch import nn
        >>> from tensordict import TensorDict
        >>> from fcall import TensorDictParams
        >>> module = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 4))
        >>> params = TensorDict.from_module(module)
        >>> _ = params.lock_()
        >>> p = TensorDictParams(params)
        >>> sorted(p.keys(True, True))
        [('0', 'bias'), ('0', 'weight'), ('1', 'bias'), ('1', 'weight')]
        >>> class CustomModule(nn.Module):
        ...     def __init__(self, params):
        ...         super().__init__()
        ...         self.params = params
        >>> m = CustomModule(p)
        >>> [name for name, _ in m.named_parameters()]
        ['params.0.weight', 'params.0.bias', 'params.1.weight', 'params.1.bias']
        >>> # The wrapper supports assignment, and values are converted to Parameters
        >>> m.params['other'] = torch.randn(3)
        >>> isinstance(m.params['other'], nn.Parameter)
        True
        >>> # A bfloat16 entry becomes a buffer
        >>> m.params['half'] = torch.zeros(3, dtype=torch.bfloat16)
        >>> [name for name, _ in m.named_buffers()]
        ['params.half']
    """

    def __init__(
        self,
        parameters: TensorDictBase | dict | None = None,
        *,
        no_convert: bool | str = False,
        lock: bool = False,
        **kwargs: Any,
    ) -> None:
        if is_dynamo_compiling():
            self._build(parameters, no_convert, lock, kwargs)  # traced: see build.py
        else:
            build_untraced(self, parameters, no_convert, lock, kwargs)

    def _build(
        self, parameters: TensorDictBase | dict | None, no_convert: Any, lock: bool, kwargs: dict
    ) -> None:
        module_init(self)
        mode = check_mode(no_convert)
        if parameters is None:
            parameters = TensorDict(kwargs) if kwargs else TensorDict()
        elif kwargs:
            raise TypeError(
                "fcall.TensorDictParams: pass the entries either as `parameters` or as keyword "
                f"arguments, not both (got parameters and {sorted(kwargs)}). "
                "Merge them into one dict first."
            )
        elif isinstance(parameters, _TDParamsBase):
            # Share the leaves, not the key set: writes through one must not change the other.
            # tensordict: the registration is kept as it is (no_convert="skip").
            copied: TensorDictBase = parameters._param_td.copy()
            parameters, mode = copied, SKIP
            lock_tree(parameters)  # tensordict: `parameters._param_td.copy().lock_()`
        elif isinstance(parameters, dict):
            parameters = TensorDict(parameters)
        elif not isinstance(parameters, TensorDictBase):
            raise TypeError(
                "fcall.TensorDictParams: `parameters` must be a TensorDict, a dict or None, "
                f"got {type(parameters).__name__}."
            )
        convert_tree(parameters, mode)
        self._init_state(parameters, mode, None, ())
        self._register_tree((), parameters)
        if lock:
            self._lock_content_td()
        self._build_views()

    def named_modules(
        self, memo: set | None = None, prefix: str = "", remove_duplicate: bool = True
    ) -> Iterator[tuple[str, nn.Module]]:
        """As ``nn.Module``'s, without hashing ``self`` when it has no submodules (it has none:
        views are not submodules), which ``parameters()`` and ``buffers()`` go through.

        tensordict's ``__hash__`` is ``hash((id(self), id(self._param_td)))``: Dynamo guards
        on the id of an object it hashes that way (``___check_obj_id``), so one built in a
        compiled function before a graph break, or passed in fresh, recompiled on every call
        that asked for its ``parameters()``.
        """
        if memo is not None or self._modules:
            yield from super().named_modules(memo, prefix, remove_duplicate)
            return
        yield prefix, self

    # ------------------------------------------------------------------ writes
    def __setitem__(self, index: Any, value: Any) -> None:
        key = _as_key(index)
        if key is None:
            return super().__setitem__(index, value)
        self._write(key, value)

    def set(self, key: Any, item: Any, inplace: bool = False, **kwargs: Any) -> TensorDictParams:
        nested = _as_key(key)
        if inplace or nested is None:
            return super().set(key, item, inplace=inplace, **kwargs)
        self._write(nested, item)
        return self

    # override: tensordict's _set_str and _set_tuple are _unlock_and_set descriptors.
    def _set_str(  # type: ignore[override]
        self, key: str, value: Any, *, inplace: Any, validated: bool, **kwargs: Any
    ) -> TensorDictParams:
        if inplace is not False and key in self._param_td.keys():
            self._param_td._set_str(
                key, value, inplace=inplace, validated=validated, ignore_lock=True, **kwargs
            )
            return self
        self._write((key,), value)
        return self

    def _set_tuple(  # type: ignore[override]
        self, key: tuple, value: Any, *, inplace: Any, validated: bool, **kwargs: Any
    ) -> TensorDictParams:
        if len(key) == 1:
            return self._set_str(key[0], value, inplace=inplace, validated=validated, **kwargs)
        if inplace is not False and key in self._param_td.keys(True):
            self._param_td._set_tuple(key, value, inplace=inplace, validated=validated, **kwargs)
            return self
        self._write(tuple(key), value)
        return self

    def __delitem__(self, key: Any) -> None:  # type: ignore[override]  # tensordict's returns self
        self.del_(key)

    def del_(self, key: Any) -> TensorDictParams:
        nested = _as_key(key)
        if nested is None:
            raise TypeError(
                f"fcall.TensorDictParams.del_: expected a str or tuple key, got {key!r}"
            )
        self._remove(nested)
        return self

    def pop(self, key: Any, default: Any = NO_DEFAULT) -> Any:
        nested = _as_key(key)
        if nested is None:
            raise TypeError(f"fcall.TensorDictParams.pop: expected a str or tuple key, got {key!r}")
        # NO_DEFAULT is tensordict's "no default" marker (split_keys(strict=True) passes it).
        if default is not NO_DEFAULT and nested not in self._param_td.keys(True):
            return default
        return self._remove(nested)

    # ------------------------------------------------------------------ reads
    def register_get_post_hook(self, hook: Callable[[Any, Any], Any]) -> None:
        """Registers ``hook(tensordict_params, value)``, called after each read of a leaf.

        A return value other than None replaces the value read. Hooks apply to every way of
        reading a leaf: ``p[key]``, ``p["a", "b"]``, ``p.get(key)``, ``p["a"]["b"]``,
        ``values()`` and ``items()``.
        """
        if not callable(hook):
            raise TypeError(
                f"fcall.TensorDictParams.register_get_post_hook: expected a callable, "
                f"got {type(hook).__name__}."
            )
        self._get_post_hook.append(hook)

    def _wrap_read(self, key: tuple[str, ...], val: Any) -> Any:
        # isinstance first: type() on a Parameter made in the graph crashes Dynamo.
        if isinstance(val, torch.Tensor):
            return self._apply_get_post_hook(val)
        if _is_tensor_collection(type(val)):
            if isinstance(val, TensorDict):
                return self._subview(key, val)
            return val  # tensordict runs no hook on a tensor collection (NonTensorData too)
        return self._apply_get_post_hook(val)

    def __getitem__(self, index: Any) -> Any:
        key = _as_key(index)
        if key is None:
            return super().__getitem__(index)
        if len(key) == 1:
            val = self._param_td._get_str(key[0], _MISSING)
        else:
            val = self._param_td._get_tuple(key, _MISSING)
        if val is _MISSING:
            raise KeyError(
                f"fcall.TensorDictParams: no entry {index!r}; "
                f"the keys are {sorted(self._param_td.keys())}."
            )
        if not isinstance(val, torch.Tensor) and is_non_tensor(val):
            # TensorDict's [] reads the data out, then the hooks run (is_non_tensor calls
            # type(): never on a tensor, which may be a Parameter made in the graph)
            return self._apply_get_post_hook(self._param_td[index])
        return self._wrap_read(key, val)

    def get(self, key: Any, *args: Any, **kwargs: Any) -> Any:
        nested = _as_key(key)
        if nested is None:
            return super().get(key, *args, **kwargs)
        if len(nested) == 1:
            val = self._param_td._get_str(nested[0], _MISSING)
        else:
            val = self._param_td._get_tuple(nested, _MISSING)
        if val is _MISSING:
            return self._param_td.get(key, *args, **kwargs)
        return self._wrap_read(nested, val)

    def values(  # type: ignore[override]
        self,
        include_nested: bool = False,
        leaves_only: bool = False,
        is_leaf: Callable | None = None,
        *,
        sort: bool = False,
    ) -> Iterator[Any]:
        for _, value in self.items(include_nested, leaves_only, is_leaf, sort=sort):
            yield value

    def items(  # type: ignore[override]
        self,
        include_nested: bool = False,
        leaves_only: bool = False,
        is_leaf: Callable | None = None,
        *,
        sort: bool = False,
    ) -> Iterator[tuple[Any, Any]]:
        for key, value in super().items(include_nested, leaves_only, is_leaf, sort=sort):
            if isinstance(value, TensorDict):
                nested = (key,) if isinstance(key, str) else cast("tuple[str, ...]", key)
                value = self._subview(nested, value)
            yield key, value

    # ------------------------------------------------------------------ copies
    def _new_like(self, param_td: TensorDictBase) -> Self:
        # The leaves are registered already ("skip"); copies are not locked (tensordict).
        out = type(self)(param_td, no_convert=SKIP)
        object.__setattr__(out, "no_convert", self.no_convert)
        out._get_post_hook.extend(self._get_post_hook)
        return out

    def _clone(self, recurse: bool = True) -> Self:
        if not recurse:
            return self._new_like(self._param_td.copy())
        return self._new_like(copies.cloned(self._param_td))

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
        return self._new_like(copies.detached(self._param_td))

    @property  # type: ignore[misc]
    def data(self) -> TensorDictBase:
        """A TensorDict of the leaves' ``.data``, buffers marked as buffers.

        As tensordict's, a TensorDict (tensordict's in-place methods write through it); its
        buffers are ``Buffer`` tensors, so ``TensorDictParams(p.data)`` registers each entry
        as here.
        """
        return copies.marked_data(self._param_td)

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
        return self._new_like(copies.moved(params, self._param_td))

    def _apply(self, fn: Callable, recurse: bool = True) -> Self:
        out = super()._apply(fn, recurse=recurse)
        if self._views is not None:
            self._views.clear()
            self._build_views()
        return out

    def __repr__(self) -> str:
        return f"TensorDictParams(params={self._param_td})"
