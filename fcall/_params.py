"""TensorDictParams: a TensorDict whose leaves are the parameters and buffers of an nn.Module.

Design (see docs/tensordictparams.md for the long form):

* A subclass of ``tensordict.nn.TensorDictParams``: it inherits the ~200 TensorDictBase methods
  that forward to the wrapped TensorDict (``_param_td``) and is an instance of both
  ``TensorDictBase`` and ``nn.Module``. It overrides the paths that break under
  ``torch.compile`` or misbehave eagerly: construction, every write, reads, locking, copies.
* The registration rules (which leaf becomes a Parameter, a buffer, or stays unregistered) are
  tensordict's, in ``_params_rules.py``; building under Dynamo is in ``_params_build.py``.
* Writes never enter ``with td.unlock_():`` (an unsupported context manager for Dynamo) and never
  call ``type()`` on a freshly built ``nn.Parameter`` (crashes Dynamo with ``SYNTHETIC_LOCAL``):
  the converted leaf goes straight in through ``_set_str(..., validated=True, ignore_lock=True)``
  and only its own name is (un)registered, no full rescan.
* Locking is tensordict's: ``lock=True`` locks the wrapped TensorDict only (writes through the
  TensorDictParams still work, ``is_locked`` stays False); ``lock_()`` locks the object too, and
  writes through it then raise. Copies are not locked.
* Nested TensorDicts are read back as cached *views* (TensorDictParams objects over the sub-tree
  that share the root's hooks and write through the root), so ``p["a"]["b"]`` runs the get-post
  hooks and ``p["a"]["b"] = x`` registers ``"a.b"``. Views are not submodules and hold their
  root weakly: a view that outlives its root becomes a root of its own.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict._tensorcollection import TensorCollection
from tensordict.base import NO_DEFAULT, _is_tensor_collection
from tensordict.nn import TensorDictParams as _TDParamsBase
from tensordict.utils import _LOCK_ERROR, is_non_tensor
from torch import nn
from torch.compiler import is_compiling, is_dynamo_compiling
from torch.nn.parameter import Buffer

from ._params_build import build_untraced
from ._params_rules import (
    SKIP,
    check_mode,
    convert_leaf,
    convert_tree,
    is_registered,
    lock_tree,
    nested_tensordicts,
    tensor_leaves,
)

__all__ = ["TensorDictParams"]

_MISSING = object()


def _as_key(index: Any) -> tuple[str, ...] | None:
    if isinstance(index, str):
        return (index,)
    if isinstance(index, tuple) and index and all(isinstance(k, str) for k in index):
        return index
    return None


def _module_init(obj: nn.Module) -> None:
    if is_dynamo_compiling():
        # Dynamo traces nn.Module.__init__ through super() only (as tensordict's own class
        # does); TensorCollection.__init__ refuses direct instantiation.
        super(TensorCollection, obj).__init__()
    else:
        nn.Module.__init__(obj)


def _marked_data(t: Any) -> Any:
    if isinstance(t, nn.Parameter) or not isinstance(t, torch.Tensor):
        return t.data
    return Buffer(t.data)


def _refresh_schema(td: TensorDictBase) -> None:
    # A locked TensorDict caches its key set; a write that bypasses the lock must refresh it.
    td._erase_cache()
    if td._is_locked and isinstance(td, TensorDict):
        td._build_lock_schema()


class TensorDictParams(_TDParamsBase):
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
            self._build(parameters, no_convert, lock, kwargs)  # traced: see _params_build
        else:
            build_untraced(self, parameters, no_convert, lock, kwargs)

    def _build(
        self, parameters: TensorDictBase | dict | None, no_convert: Any, lock: bool, kwargs: dict
    ) -> None:
        _module_init(self)
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
            parameters, mode = parameters._param_td.copy(), SKIP
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

    def _build_views(self) -> None:
        # Built eagerly so that reading a nested TensorDict under compile finds its view ready
        # (building a Module in the graph would graph-break).
        for key, value in nested_tensordicts(self._param_td):
            self._subview(key, value)

    def _init_state(
        self,
        param_td: TensorDictBase,
        no_convert: bool | str,
        root: TensorDictParams | None,
        prefix: tuple[str, ...],
    ) -> None:
        # object.__setattr__: a Module value (the root) must not become a submodule.
        set_ = object.__setattr__
        set_(self, "_param_td", param_td)
        set_(self, "no_convert", no_convert)
        set_(self, "_lock_content", False)
        set_(self, "_is_locked", False)
        set_(self, "_locked_tensordicts", [])
        # A view holds its root weakly (tensordict's nested TensorDicts hold their locked
        # parents by weakref): a view must not keep a dropped root, and its lock, alive.
        set_(self, "_root_ref", None if root is None else weakref.ref(root))
        set_(self, "_prefix", prefix)
        set_(self, "_views", {} if root is None else None)
        set_(self, "_get_post_hook", [] if root is None else root._get_post_hook)

    # ------------------------------------------------------------------ registration
    def _anchor(self) -> tuple[TensorDictParams, tuple[str, ...]]:
        """The root and this object's key in it; a view whose root is gone becomes a root."""
        ref = self._root_ref
        if ref is None:
            return self, ()
        root = ref()
        if root is None:
            set_ = object.__setattr__
            set_(self, "_root_ref", None)  # _prefix stays: is_locked still reads as a view's
            set_(self, "_views", {})
            set_(self, "_get_post_hook", list(self._get_post_hook))
            return self, ()
        return root, self._prefix

    @property
    def _root(self) -> TensorDictParams:
        return self._anchor()[0]

    def _register_leaf(self, name: str, value: Any) -> None:
        if isinstance(value, nn.Parameter):
            self._buffers.pop(name, None)
            self._parameters[name] = value
        elif isinstance(value, torch.Tensor):
            self._parameters.pop(name, None)
            self._buffers[name] = value

    def _unregister(self, name: str, old: Any) -> None:
        if not isinstance(old, torch.Tensor) and _is_tensor_collection(type(old)):
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
        elif isinstance(value, TensorDictBase) and not is_non_tensor(value):
            for sub, leaf in tensor_leaves(value):
                self._register_leaf(".".join(key + sub), leaf)

    def _owners(
        self, root: TensorDictParams, full: tuple[str, ...]
    ) -> Iterator[tuple[TensorDictParams, tuple[str, ...]]]:
        """The root and every cached view above ``full``, with the key relative to each."""
        yield root, full
        for prefix, view in root._views.items():
            if len(prefix) < len(full) and full[: len(prefix)] == prefix:
                yield view, full[len(prefix) :]

    @staticmethod
    def _parent_of(root: TensorDictParams, full: tuple[str, ...], create: bool) -> TensorDictBase:
        parent = root._param_td
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

    def _converted(self, root: TensorDictParams, parent: TensorDictBase, full: tuple, value: Any):
        """``value`` as it is stored at ``full`` (tensordict's rules, see _params_rules)."""
        if isinstance(value, dict):
            value = TensorDict(value, batch_size=parent.batch_size, device=parent.device)
        elif isinstance(value, _TDParamsBase):
            value = value._param_td
        if isinstance(value, torch.Tensor):
            if not is_registered(value):
                value = parent._validate_value(value, check_shape=True, key=full[-1])
            return convert_leaf(value, root.no_convert)
        if _is_tensor_collection(type(value)) and not is_non_tensor(value):
            convert_tree(value, root.no_convert)
            return value
        # tensordict converts a tensor only if it is one when set: an array or a number
        # becomes a tensor here and registers as a buffer; a string stays non-tensor data.
        value = parent._validate_value(value, check_shape=True, key=full[-1])
        return Buffer(value) if isinstance(value, torch.Tensor) else value

    def _write(self, key: tuple[str, ...], value: Any) -> None:
        root, prefix = self._anchor()
        if value is self or value is root:
            raise ValueError(
                f"fcall.TensorDictParams: cannot set {key!r} to the TensorDictParams itself."
            )
        self._check_unlocked()
        full = prefix + key
        parent = self._parent_of(root, full, create=True)
        last = full[-1]
        value = self._converted(root, parent, full, value)
        old = parent._get_str(last, _MISSING)
        parent._set_str(last, value, inplace=False, validated=True, ignore_lock=True)
        _refresh_schema(parent)
        for owner, rel in self._owners(root, full):
            name = ".".join(rel)
            if old is not _MISSING:
                owner._unregister(name, old)
            owner._register_tree(rel, value)
        if not is_compiling() and (len(full) > 1 or isinstance(value, TensorDict)):
            root._build_views()

    def _remove(self, key: tuple[str, ...]) -> Any:
        root, prefix = self._anchor()
        self._check_unlocked()
        full = prefix + key
        parent = self._parent_of(root, full, create=False)
        old = parent._get_str(full[-1], _MISSING)
        if old is _MISSING:
            raise KeyError(f"fcall.TensorDictParams: no entry {full!r} to remove.")
        if isinstance(parent, TensorDict):
            del parent._tensordict[full[-1]]
        else:  # pragma: no cover - other TensorDict types keep their own lock rules
            parent.del_(full[-1])
        _refresh_schema(parent)
        for owner, rel in self._owners(root, full):
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

    def pop(self, key: Any, default: Any = NO_DEFAULT) -> Any:  # type: ignore[override]
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

    def _apply_get_post_hook(self, val: Any) -> Any:
        root = self._root
        for hook in self._get_post_hook:
            new_val = hook(root, val)
            if new_val is not None:
                val = new_val
        return val

    def _subview(self, key: tuple[str, ...], sub: TensorDictBase) -> TensorDictParams:
        # Not `_view`: that is tensordict's `_view(*shape)`, which `view()` calls.
        root, prefix = self._anchor()
        full = prefix + key
        view = root._views.get(full)
        if view is None or view._param_td is not sub:
            view = object.__new__(type(self))
            _module_init(view)
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
                value = self._subview(nested, value)
            yield key, value

    # ------------------------------------------------------------------ locking
    # tensordict's semantics: the object's own flag (`_is_locked`, set by lock_()) blocks writes
    # through it; `lock=True` locks the wrapped TensorDict only, and unlock_() keeps that lock.
    @property
    def is_locked(self) -> bool:  # type: ignore[override]
        """True after ``lock_()``; ``lock=True`` locks the wrapped TensorDict only.

        A view (``p["a"]``) reports the lock of the TensorDict it wraps, as tensordict's
        nested TensorDict does.
        """
        if self._root_ref is not None or self._prefix:
            return self._param_td._is_locked
        return self._is_locked

    @is_locked.setter
    def is_locked(self, value: bool) -> None:
        # tensordict: setting the flag does not lock the parameters.
        object.__setattr__(self, "_is_locked", bool(value))

    def _check_unlocked(self) -> None:
        if self.is_locked:
            raise RuntimeError(_LOCK_ERROR)

    def _lock_content_td(self) -> None:
        object.__setattr__(self, "_lock_content", True)
        self._lock_wrapped()

    def _lock_wrapped(self) -> None:
        td = self._param_td
        if not td._is_locked:
            # Not td.lock_(): it warns under compile, and warnings.warn is not traceable.
            lock_tree(td)

    def _propagate_lock(self, _lock_parents_weakrefs: Any = None, *, is_compiling: bool) -> None:
        object.__setattr__(self, "_is_locked", True)
        self._lock_wrapped()

    def _propagate_unlock(self) -> list:
        object.__setattr__(self, "_is_locked", False)
        td = self._param_td
        if not self._lock_content and td._is_locked:
            td.unlock_()  # not _propagate_unlock: unlock_ checks the locked parents
        return []

    # ------------------------------------------------------------------ copies and conversions
    def _new_like(self, param_td: TensorDictBase) -> TensorDictParams:
        # The leaves are registered already ("skip"); copies are not locked (tensordict).
        out = type(self)(param_td, no_convert=SKIP)
        object.__setattr__(out, "no_convert", self.no_convert)
        out._get_post_hook.extend(self._get_post_hook)
        return out

    def _copy_leaves(self, param: Callable, buffer: Callable) -> TensorDictParams:
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

    def _clone(self, recurse: bool = True) -> TensorDictParams:  # type: ignore[override]
        if not recurse:
            return self._new_like(self._param_td.copy())
        return self._copy_leaves(
            lambda t: nn.Parameter(t.data.clone(), requires_grad=t.requires_grad),
            lambda t: Buffer(t.data.clone()),
        )

    def detach(self) -> TensorDictParams:  # type: ignore[override]
        """A TensorDictParams of detached leaves (shared storage), registered as here.

        Parameters stay Parameters (``requires_grad=False``), buffers stay buffers, so
        ``p.detach().clone()`` is a copy of a net with buffers that registers its running
        stats as buffers. (tensordict's returns a TensorDict: wrapped again, its buffers
        would become Parameters.)
        """
        return self._copy_leaves(
            lambda t: nn.Parameter(t.detach(), requires_grad=False), lambda t: Buffer(t.detach())
        )

    @property
    def data(self) -> TensorDictBase:  # type: ignore[override]
        """A TensorDict of the leaves' ``.data``, buffers marked as buffers.

        As tensordict's, a TensorDict (tensordict's in-place methods write through it); its
        buffers are ``Buffer`` tensors, so ``TensorDictParams(p.data)`` registers each entry
        as here.
        """
        return self._param_td._fast_apply(_marked_data, propagate_lock=True)

    def __deepcopy__(self, memo: dict) -> TensorDictParams:
        return self._clone(recurse=True)

    def __copy__(self) -> TensorDictParams:
        return self._clone(recurse=False)

    def _from_converted(self, params: TensorDictBase) -> TensorDictParams:  # type: ignore[override]
        out = super()._from_converted(params)
        return self._new_like(out._param_td)

    def _apply(self, fn: Callable, recurse: bool = True) -> TensorDictParams:
        out = super()._apply(fn, recurse=recurse)
        if self._views is not None:
            self._views.clear()
            self._build_views()
        return out

    def __repr__(self) -> str:
        return f"TensorDictParams(params={self._param_td})"
