"""TensorDictParams' state and tree: its registration, writes, nested views and lock.

``ParamsTree`` is the base of fcall's class, a subclass of tensordict's: the state of a
TensorDictParams (``_init_state``, the one place it is set), which name is registered as a
parameter or a buffer, how a write or a removal reaches the wrapped TensorDict (never through
``with td.unlock_():``, an unsupported context manager for Dynamo; never a full rescan: only the
names written are (un)registered), and the cached views over nested TensorDicts: each is a
TensorDictParams over the sub-tree that shares the root's hooks and writes through the root,
holding the root weakly (a view that outlives its root becomes a root of its own).

Locking, as tensordict's: the object's own flag (``_is_locked``, set by ``lock_()``) blocks
writes through it; ``lock=True`` locks the wrapped TensorDict only (``_lock_content``), and
``unlock_()`` keeps that lock. A view (``p["a"]``) reports, and obeys, the lock of the
TensorDict it wraps, as tensordict's nested TensorDict does. Copies are not locked.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Self

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict._tensorcollection import TensorCollection
from tensordict.base import _is_tensor_collection
from tensordict.nn import TensorDictParams as _TDParamsBase
from tensordict.utils import _LOCK_ERROR, is_non_tensor
from torch import nn
from torch.compiler import is_compiling, is_dynamo_compiling
from torch.nn.parameter import Buffer

from .._compat import validate_value
from .rules import (
    convert_leaf,
    convert_tree,
    is_registered,
    lock_tree,
    nested_tensordicts,
    tensor_leaves,
)

__all__ = ["ParamsTree", "module_init"]

_MISSING = object()


def module_init(obj: _TDParamsBase) -> None:
    if is_dynamo_compiling():
        # Dynamo traces nn.Module.__init__ through super() only (as tensordict's own class
        # does); TensorCollection.__init__ refuses direct instantiation.
        super(TensorCollection, obj).__init__()
    else:
        nn.Module.__init__(obj)


def _refresh_schema(td: TensorDictBase) -> None:
    # A locked TensorDict caches its key set; a write that bypasses the lock must refresh it.
    td._erase_cache()
    if td._is_locked and isinstance(td, TensorDict):
        td._build_lock_schema()


class ParamsTree(_TDParamsBase):
    """The base of fcall.TensorDictParams: its state, tree, registration, writes, views and
    lock (``params.TensorDictParams`` adds construction, the public reads and writes, and
    copies)."""

    if TYPE_CHECKING:
        # The state that _init_state sets (a view's _views is None).
        _param_td: TensorDictBase
        no_convert: bool | str
        _lock_content: bool
        _root_ref: weakref.ref[Self] | None
        _prefix: tuple[str, ...]
        _views: dict[tuple[str, ...], Self] | None
        _get_post_hook: list[Callable[[Any, Any], Any]]

    def _build_views(self) -> None:
        # Built eagerly so that reading a nested TensorDict under compile finds its view ready
        # (building a Module in the graph would graph-break).
        for key, value in nested_tensordicts(self._param_td):
            self._subview(key, value)

    def _init_state(
        self,
        param_td: TensorDictBase,
        no_convert: bool | str,
        root: Self | None,
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
    def _anchor(self) -> tuple[Self, tuple[str, ...]]:
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
    def _root(self) -> Self:
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

    def _owners(self, root: Self, full: tuple[str, ...]) -> Iterator[tuple[Self, tuple[str, ...]]]:
        """The root and every cached view above ``full``, with the key relative to each."""
        yield root, full
        assert root._views is not None  # a root's (not typing.cast: see _subview)
        for prefix, view in root._views.items():
            if len(prefix) < len(full) and full[: len(prefix)] == prefix:
                yield view, full[len(prefix) :]

    @staticmethod
    def _parent_of(root: ParamsTree, full: tuple[str, ...], create: bool) -> TensorDictBase:
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

    def _converted(self, root: Self, parent: TensorDictBase, full: tuple, value: Any):
        """``value`` as it is stored at ``full`` (tensordict's rules, see rules.py)."""
        if isinstance(value, dict):
            value = TensorDict(value, batch_size=parent.batch_size, device=parent.device)
        elif isinstance(value, _TDParamsBase):
            value = value._param_td
        if isinstance(value, torch.Tensor):
            if not is_registered(value):
                value = validate_value(parent, value, full[-1])
            return convert_leaf(value, root.no_convert)
        if _is_tensor_collection(type(value)) and not is_non_tensor(value):
            convert_tree(value, root.no_convert)
            return value
        # tensordict converts a tensor only if it is one when set: an array or a number
        # becomes a tensor here and registers as a buffer; a string stays non-tensor data.
        value = validate_value(parent, value, full[-1])
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

    def _apply_get_post_hook(self, val: Any) -> Any:
        root = self._root
        for hook in self._get_post_hook:
            new_val = hook(root, val)
            if new_val is not None:
                val = new_val
        return val

    def _subview(self, key: tuple[str, ...], sub: TensorDictBase) -> Self:
        # Not `_view`: that is tensordict's `_view(*shape)`, which `view()` calls.
        root, prefix = self._anchor()
        full = prefix + key
        # A root's views: a dict. Not typing.cast: Dynamo constant-folds a cast of an empty
        # dict into a copy, and the view would be stored in that copy.
        assert root._views is not None
        view = root._views.get(full)
        if view is None or view._param_td is not sub:
            view = object.__new__(type(self))
            module_init(view)
            view._init_state(sub, root.no_convert, root, full)
            view._register_tree((), sub)
            root._views[full] = view
        return view

    # ------------------------------------------------------------------ lock
    @property
    def is_locked(self) -> bool:
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

    def _propagate_unlock(self) -> list[Any]:
        object.__setattr__(self, "_is_locked", False)
        td = self._param_td
        if not self._lock_content and td._is_locked:
            td.unlock_()  # not _propagate_unlock: unlock_ checks the locked parents
        return []
