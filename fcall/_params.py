"""TensorDictParams: a TensorDict whose leaves are the parameters and buffers of an nn.Module.

Design (see docs/tensordictparams.md for the long form):

* A subclass of ``tensordict.nn.TensorDictParams``: it inherits the ~200 TensorDictBase methods
  that forward to the wrapped TensorDict (``_param_td``) and is an instance of both
  ``TensorDictBase`` and ``nn.Module``. It overrides the paths that break under
  ``torch.compile`` or misbehave eagerly: construction, every write, reads, locking, copies.
* Writes never enter ``with td.unlock_():`` (an unsupported context manager for Dynamo) and never
  call ``type()`` on a freshly built ``nn.Parameter`` (crashes Dynamo with ``SYNTHETIC_LOCAL``):
  the converted leaf goes straight in through ``_set_str(..., validated=True, ignore_lock=True)``
  and only its own name is (un)registered, no full rescan.
* The lock lives on the wrapped TensorDict alone: ``lock=True`` / ``lock_()`` lock it and
  ``is_locked`` reports it. Writes through the TensorDictParams bypass it on purpose (the spec).
* Nested TensorDicts are read back as cached *views* (TensorDictParams objects over the sub-tree
  that share the root's hooks and write through the root), so ``p["a"]["b"]`` runs the get-post
  hooks and ``p["a"]["b"] = x`` registers ``"a.b"``. Views are not submodules.
* Under compile, converting a tensor created inside the graph to ``nn.Parameter`` graph-breaks
  (``config.graph_break_on_nn_param_ctor``); construction therefore converts all leaves in one
  ``torch._dynamo.disable``-d helper: one graph break at most, whatever the number of leaves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.base import _is_tensor_collection
from tensordict.nn import TensorDictParams as _TDParamsBase
from torch import nn
from torch.compiler import is_compiling
from torch.nn.parameter import Buffer

from ._compat import BufferLegacy, validate_value

__all__ = ["TensorDictParams"]

_PARAM_DTYPES = (torch.float16, torch.float32, torch.float64)
_MISSING = object()


def _is_registered(value: Any) -> bool:
    # isinstance only: `type(p)` on a Parameter built in the graph crashes Dynamo.
    return isinstance(value, (nn.Parameter, Buffer, BufferLegacy))


def _convert_leaf(value: Any, no_convert: bool) -> Any:
    """The registration rule: float16/32/64 -> Parameter, any other tensor -> buffer."""
    if not isinstance(value, torch.Tensor) or _is_registered(value):
        return value
    if not no_convert and value.dtype in _PARAM_DTYPES:
        return nn.Parameter(value)
    return Buffer(value)


def _wrap_like(tensor: torch.Tensor, orig: torch.Tensor) -> torch.Tensor:
    """A leaf that ``to()``, ``cpu()`` or ``cuda()`` returned, registered like the leaf
    ``orig`` it replaces: a Parameter stays one, with its ``requires_grad``, unless its
    dtype is no longer floating or complex; anything else becomes a buffer."""
    if tensor is orig:
        return tensor
    if isinstance(orig, nn.Parameter) and (tensor.is_floating_point() or tensor.is_complex()):
        return nn.Parameter(tensor, requires_grad=orig.requires_grad)
    return _convert_leaf(tensor, no_convert=True)


def _convert_tree(td: TensorDictBase, no_convert: bool) -> None:
    """Converts the leaves of ``td`` in place (the spec: wraps without copying)."""
    if not isinstance(td, TensorDict):
        raise TypeError(
            f"fcall.TensorDictParams: expected a TensorDict (or dict) of tensors, got a "
            f"{type(td).__name__}. Convert it first with `.to_tensordict()`."
        )
    for key, value in list(td._tensordict.items()):
        if _is_tensor_collection(type(value)):
            _convert_tree(value, no_convert)
            continue
        new = _convert_leaf(value, no_convert)
        if new is not value:
            td._set_str(key, new, inplace=False, validated=True, ignore_lock=True)


@torch._dynamo.disable
def _build_untraced(obj: Any, parameters: Any, no_convert: bool, lock: bool, kwargs: dict) -> None:
    # Dynamo graph-breaks at _construct_eagerly and, unable to resume inside a constructor,
    # runs the whole `TensorDictParams(...)` call eagerly, with its frame hook still on: every
    # helper called from here would be compiled as a frame of its own (with no_convert=True
    # Buffer(value) is a graph, and the next dtype a recompile). Disabled: nothing inside is.
    obj._build(parameters, no_convert, lock, kwargs)


@torch._dynamo.disable
def _construct_eagerly(cls: type, args: tuple, kwargs: dict) -> Any:
    # Dynamo cannot build this nn.Module in the graph: `nn.Parameter(t)` on a tensor made in the
    # graph breaks once per leaf, and a break inside __init__ leaves an "Uninitialized nn.Module"
    # that breaks again. Building the whole object here costs exactly one graph break.
    obj = cls(*args, **kwargs)
    object.__setattr__(obj, "_built_outside_graph", True)
    return obj


def _as_key(index: Any) -> tuple[str, ...] | None:
    if isinstance(index, str):
        return (index,)
    if isinstance(index, tuple) and index and all(isinstance(k, str) for k in index):
        return index
    return None


def _refresh_schema(td: TensorDictBase) -> None:
    # A locked TensorDict caches its key set; a write that bypasses the lock must refresh it.
    td._erase_cache()
    if td._is_locked and isinstance(td, TensorDict):
        td._build_lock_schema()


class TensorDictParams(_TDParamsBase):
    r"""A TensorDict whose entries are registered as the parameters and buffers of an nn.Module.

    Float16/32/64 tensors become :class:`~torch.nn.Parameter`, tensors of any other dtype
    become buffers (all of them with ``no_convert=True``); entries set later follow the same
    rule. It wraps the TensorDict it is given without a copy, so entries added to that
    TensorDict directly after construction show through indexing but not in ``parameters()``:
    write through the TensorDictParams, or pass ``lock=True``. ``lock=True`` locks the wrapped
    TensorDict (``is_locked`` is then True); writes through the TensorDictParams still work.

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

    _built_outside_graph = False

    def __new__(cls, *args: Any, **kwargs: Any) -> TensorDictParams:
        if is_compiling():
            return _construct_eagerly(cls, args, kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        parameters: TensorDictBase | dict | None = None,
        *,
        no_convert: bool = False,
        lock: bool = False,
        **kwargs: Any,
    ) -> None:
        if is_compiling() and self._built_outside_graph:
            return  # __new__ built it (Dynamo still calls __init__ on what __new__ returns)
        _build_untraced(self, parameters, bool(no_convert), lock, kwargs)

    def _build(
        self, parameters: TensorDictBase | dict | None, no_convert: bool, lock: bool, kwargs: dict
    ) -> None:
        nn.Module.__init__(self)
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
            parameters = parameters._param_td.copy()
        elif isinstance(parameters, dict):
            parameters = TensorDict(parameters)
        elif not isinstance(parameters, TensorDictBase):
            raise TypeError(
                "fcall.TensorDictParams: `parameters` must be a TensorDict, a dict or None, "
                f"got {type(parameters).__name__}."
            )
        _convert_tree(parameters, no_convert)
        self._init_state(parameters, no_convert, None, ())
        self._register_tree((), parameters)
        if lock:
            self._lock_content_td()
        self._build_views()

    def _build_views(self) -> None:
        # Built eagerly so that reading a nested TensorDict under compile finds its view ready
        # (building a Module in the graph would graph-break).
        for key, value in self._param_td.items(True, False):
            if isinstance(value, TensorDict):
                self._view((key,) if isinstance(key, str) else key, value)

    def _init_state(
        self,
        param_td: TensorDictBase,
        no_convert: bool,
        root: TensorDictParams | None,
        prefix: tuple[str, ...],
    ) -> None:
        # object.__setattr__: a Module value (the root) must not become a submodule.
        set_ = object.__setattr__
        set_(self, "_param_td", param_td)
        set_(self, "no_convert", no_convert)
        set_(self, "_lock_content", False)
        set_(self, "_locked_tensordicts", [])
        set_(self, "_root_ref", root)
        set_(self, "_prefix", prefix)
        set_(self, "_views", {} if root is None else None)
        set_(self, "_get_post_hook", [] if root is None else root._get_post_hook)

    # ------------------------------------------------------------------ registration
    @property
    def _root(self) -> TensorDictParams:
        root = self._root_ref
        return self if root is None else root

    def _register_leaf(self, name: str, value: Any) -> None:
        if isinstance(value, nn.Parameter):
            self._buffers.pop(name, None)
            self._parameters[name] = value
        elif isinstance(value, torch.Tensor):
            self._parameters.pop(name, None)
            self._buffers[name] = value

    def _unregister(self, name: str, old: Any) -> None:
        if _is_tensor_collection(type(old)):
            for key in old.keys(True, True):
                sub = key if isinstance(key, str) else ".".join(key)
                self._parameters.pop(f"{name}.{sub}", None)
                self._buffers.pop(f"{name}.{sub}", None)
        else:
            self._parameters.pop(name, None)
            self._buffers.pop(name, None)

    def _register_tree(self, key: tuple[str, ...], value: Any) -> None:
        if isinstance(value, torch.Tensor):
            self._register_leaf(".".join(key), value)
        elif _is_tensor_collection(type(value)):
            for sub_key, leaf in value.items(True, True):
                sub = (sub_key,) if isinstance(sub_key, str) else sub_key
                self._register_leaf(".".join(key + sub), leaf)

    def _owners(self, full: tuple[str, ...]) -> Iterator[tuple[TensorDictParams, tuple[str, ...]]]:
        """The root and every cached view above ``full``, with the key relative to each."""
        root = self._root
        yield root, full
        for prefix, view in root._views.items():
            if len(prefix) < len(full) and full[: len(prefix)] == prefix:
                yield view, full[len(prefix) :]

    def _parent_of(self, full: tuple[str, ...], create: bool) -> TensorDictBase:
        parent = self._root._param_td
        for i, part in enumerate(full[:-1]):
            sub = parent._get_str(part, None)
            if sub is None and create:
                sub = parent.empty()
                if parent._is_locked:
                    sub._propagate_lock(is_compiling=is_compiling())
                parent._set_str(part, sub, inplace=False, validated=True, ignore_lock=True)
                _refresh_schema(parent)
            elif sub is None or not _is_tensor_collection(type(sub)):
                what = "is missing" if sub is None else "is a leaf, not a nested TensorDict"
                raise KeyError(
                    f"fcall.TensorDictParams: cannot reach {full!r}: {full[: i + 1]!r} {what}."
                )
            parent = sub
        return parent

    def _write(self, key: tuple[str, ...], value: Any) -> None:
        root = self._root
        if value is self or value is root:
            raise ValueError(
                f"fcall.TensorDictParams: cannot set {key!r} to the TensorDictParams itself."
            )
        full = self._prefix + key
        parent = self._parent_of(full, create=True)
        last = full[-1]
        if isinstance(value, dict):
            value = TensorDict(value, batch_size=parent.batch_size, device=parent.device)
        elif isinstance(value, _TDParamsBase):
            value = value._param_td
        if _is_tensor_collection(type(value)):
            _convert_tree(value, root.no_convert)
        elif isinstance(value, torch.Tensor):
            if not _is_registered(value):
                value = validate_value(parent, value, last)
            value = _convert_leaf(value, root.no_convert)
        else:
            raise TypeError(
                f"fcall.TensorDictParams: the value for {full!r} must be a tensor, a dict or a "
                f"TensorDict, got {type(value).__name__}."
            )
        old = parent._get_str(last, _MISSING)
        parent._set_str(last, value, inplace=False, validated=True, ignore_lock=True)
        _refresh_schema(parent)
        for owner, rel in self._owners(full):
            name = ".".join(rel)
            if old is not _MISSING:
                owner._unregister(name, old)
            owner._register_tree(rel, value)
        if not is_compiling() and (len(full) > 1 or isinstance(value, TensorDict)):
            root._build_views()

    def _remove(self, key: tuple[str, ...]) -> Any:
        full = self._prefix + key
        parent = self._parent_of(full, create=False)
        old = parent._get_str(full[-1], _MISSING)
        if old is _MISSING:
            raise KeyError(f"fcall.TensorDictParams: no entry {full!r} to remove.")
        if isinstance(parent, TensorDict):
            del parent._tensordict[full[-1]]
        else:  # pragma: no cover - other TensorDict types keep their own lock rules
            parent.del_(full[-1])
        _refresh_schema(parent)
        for owner, rel in self._owners(full):
            owner._unregister(".".join(rel), old)
        return old

    # ------------------------------------------------------------------ writes
    def __setitem__(self, index: Any, value: Any) -> None:  # type: ignore[override]
        key = _as_key(index)
        if key is None:
            return super().__setitem__(index, value)
        self._write(key, value)

    def set(  # type: ignore[override]
        self, key: Any, item: Any, inplace: bool = False, **kwargs: Any
    ) -> TensorDictParams:
        nested = _as_key(key)
        if inplace or nested is None:
            return super().set(key, item, inplace=inplace, **kwargs)
        self._write(nested, item)
        return self

    def _set_str(self, key: str, value: Any, *, inplace: Any, validated: bool, **kwargs: Any):
        if inplace is not False and key in self._param_td.keys():
            self._param_td._set_str(
                key, value, inplace=inplace, validated=validated, ignore_lock=True, **kwargs
            )
            return self
        self._write((key,), value)
        return self

    def _set_tuple(self, key: tuple, value: Any, *, inplace: Any, validated: bool, **kwargs: Any):
        if len(key) == 1:
            return self._set_str(key[0], value, inplace=inplace, validated=validated, **kwargs)
        if inplace is not False and key in self._param_td.keys(True):
            self._param_td._set_tuple(key, value, inplace=inplace, validated=validated, **kwargs)
            return self
        self._write(tuple(key), value)
        return self

    def __delitem__(self, key: Any) -> None:
        self.del_(key)

    def del_(self, key: Any) -> TensorDictParams:  # type: ignore[override]
        nested = _as_key(key)
        if nested is None:
            raise TypeError(
                f"fcall.TensorDictParams.del_: expected a str or tuple key, got {key!r}"
            )
        self._remove(nested)
        return self

    def pop(self, key: Any, default: Any = _MISSING) -> Any:  # type: ignore[override]
        nested = _as_key(key)
        if nested is None:
            raise TypeError(f"fcall.TensorDictParams.pop: expected a str or tuple key, got {key!r}")
        if default is not _MISSING and nested not in self._param_td.keys(True):
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

    def _apply_get_post_hook(self, val: Any) -> Any:
        root = self._root
        for hook in self._get_post_hook:
            new_val = hook(root, val)
            if new_val is not None:
                val = new_val
        return val

    def _view(self, key: tuple[str, ...], sub: TensorDictBase) -> TensorDictParams:
        root = self._root
        full = self._prefix + key
        view = root._views.get(full)
        if view is None or view._param_td is not sub:
            view = object.__new__(type(self))
            nn.Module.__init__(view)
            view._init_state(sub, root.no_convert, root, full)
            view._register_tree((), sub)
            root._views[full] = view
        return view

    def _wrap_read(self, key: tuple[str, ...], val: Any) -> Any:
        # isinstance first: type() on a Parameter made in the graph crashes Dynamo.
        if isinstance(val, torch.Tensor):
            return self._apply_get_post_hook(val)
        if _is_tensor_collection(type(val)):
            if isinstance(val, TensorDict):
                return self._view(key, val)
            return val
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
        return self._wrap_read(key, val)

    def get(self, key: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
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
                nested = (key,) if isinstance(key, str) else key
                value = self._view(nested, value)
            yield key, value

    # ------------------------------------------------------------------ locking
    @property
    def _is_locked(self) -> bool:  # type: ignore[override]
        return self.__dict__["_param_td"]._is_locked

    @_is_locked.setter
    def _is_locked(self, value: bool) -> None:
        # The lock lives on the wrapped TensorDict: see _propagate_lock / _propagate_unlock.
        pass

    @property
    def is_locked(self) -> bool:  # type: ignore[override]
        """True when the wrapped TensorDict is locked (``lock=True`` or ``lock_()``)."""
        return self._param_td._is_locked

    @is_locked.setter
    def is_locked(self, value: bool) -> None:
        if value:
            self.lock_()
        else:
            self.unlock_()

    def _lock_content_td(self) -> None:
        object.__setattr__(self, "_lock_content", True)
        td = self._param_td
        if not td._is_locked:
            comp = is_compiling()
            # Not td.lock_(): it warns under compile, and warnings.warn is not traceable.
            td._propagate_lock(is_compiling=comp)

    def _propagate_lock(self, _lock_parents_weakrefs: Any = None, *, is_compiling: bool) -> None:
        self._lock_content_td()

    def _propagate_unlock(self) -> list:
        object.__setattr__(self, "_lock_content", False)
        td = self._param_td
        if td._is_locked:
            td.unlock_()
        return []

    # ------------------------------------------------------------------ copies and conversions
    def _new_like(self, param_td: TensorDictBase) -> TensorDictParams:
        out = type(self)(param_td, no_convert=self.no_convert)
        out._get_post_hook.extend(self._get_post_hook)
        if self._lock_content:
            out._lock_content_td()
        return out

    def _clone(self, recurse: bool = True) -> TensorDictParams:  # type: ignore[override]
        if not recurse:
            return self._new_like(self._param_td.copy())
        memo: dict[int, torch.Tensor] = {}

        def clone(t: torch.Tensor) -> torch.Tensor:
            out = memo.get(id(t))
            if out is None:
                if isinstance(t, nn.Parameter):
                    out = nn.Parameter(t.data.clone(), requires_grad=t.requires_grad)
                else:
                    out = Buffer(t.data.clone())
                memo[id(t)] = out
            return out

        return self._new_like(self._param_td.apply(clone))

    def __deepcopy__(self, memo: dict) -> TensorDictParams:
        return self._clone(recurse=True)

    def __copy__(self) -> TensorDictParams:
        return self._clone(recurse=False)

    # to(), cpu() and cuda() as tensordict 0.15 has them, on every tensordict (0.14's
    # return a tensordict.nn.TensorDictParams that registers every leaf anew by dtype).
    def to(self, *args: Any, **kwargs: Any) -> TensorDictParams:  # type: ignore[override]
        return self._converted(self._param_td.to(*args, **kwargs))

    def cpu(self, **kwargs: Any) -> TensorDictParams:  # type: ignore[override]
        return self._converted(self._param_td.cpu(**kwargs))

    def cuda(self, device: Any = None, **kwargs: Any) -> TensorDictParams:  # type: ignore[override]
        return self._converted(self._param_td.cuda(device=device, **kwargs))

    def _converted(self, params: TensorDictBase) -> TensorDictParams:
        if params is self._param_td:
            return self
        return self._new_like(params.apply(_wrap_like, self._param_td))

    def _apply(self, fn: Callable, recurse: bool = True) -> TensorDictParams:
        out = super()._apply(fn, recurse=recurse)
        if self._views is not None:
            self._views.clear()
            self._build_views()
        return out

    def __repr__(self) -> str:
        return f"TensorDictParams(params={self._param_td})"
