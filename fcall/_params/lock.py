"""TensorDictParams: locking, as tensordict's.

The object's own flag (``_is_locked``, set by ``lock_()``) blocks writes through it;
``lock=True`` locks the wrapped TensorDict only (``_lock_content``), and ``unlock_()`` keeps that
lock. A view (``p["a"]``) reports, and obeys, the lock of the TensorDict it wraps, as
tensordict's nested TensorDict does. Copies are not locked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tensordict.utils import _LOCK_ERROR

from .rules import lock_tree

# To the type checker the mixin is a tensordict TensorDictParams (the class it is mixed into
# derives from it); at runtime it derives from object.
if TYPE_CHECKING:
    from tensordict.nn import TensorDictParams as _MixinBase
else:
    _MixinBase = object

__all__ = ["Locking"]


class Locking(_MixinBase):
    """Mixin of fcall.TensorDictParams: ``is_locked``, ``lock_()`` and ``unlock_()``."""

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
