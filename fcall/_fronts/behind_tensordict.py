"""``fcall.behind_tensordict()``: an explicit, reversible route from tensordict's API to fcall's.

Code a user does not own (TorchRL's losses) calls ``params.to_module(net)``,
``TensorDict.from_module(net)`` and ``tensordict.nn.TensorDictParams(...)``. While a route is
on, those names run fcall's: ``TensorDictBase.to_module`` calls ``fcall.to_module``,
``TensorDictBase.from_module`` (and ``TensorDict``'s) call ``fcall.from_module``, and the
``TensorDictParams`` name in tensordict's modules (and in any module already imported that
took tensordict's class by name) is ``fcall.TensorDictParams``. Nothing is patched until
``behind_tensordict()`` is called, and ``undo()`` (or the end of its ``with`` block) puts back
the very objects it replaced. Objects built while the route was on stay fcall's.
"""

from __future__ import annotations

import sys
import threading
from types import TracebackType
from typing import Any

from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictParams as _TDParams
from torch import nn

from .._params.params import TensorDictParams
from .from_module import from_module
from .to_module import to_module

__all__ = ["behind_tensordict"]

_LOCK = threading.Lock()
_ACTIVE: list[behind_tensordict] = []


def _routed_to_module(self: TensorDictBase, module: nn.Module, **kwargs: Any) -> Any:
    return to_module(self, module, **kwargs)


def _routed_from_module(default_lock: bool) -> classmethod:
    def routed(
        cls: type,
        module: nn.Module,
        as_module: bool = False,
        lock: bool = default_lock,
        use_state_dict: bool = False,
        filter_empty: bool = True,
    ) -> Any:
        return from_module(
            module,
            as_module=as_module,
            lock=lock,
            use_state_dict=use_state_dict,
            filter_empty=filter_empty,
        )

    routed.__name__ = "from_module"
    return classmethod(routed)


# Made once: every route patches in the very same objects, so that code compiled while one
# route was on (Dynamo guards on the functions it traced) still matches under the next.
_TO_MODULE = _routed_to_module
_FROM_MODULE_LOCKED = _routed_from_module(default_lock=True)  # tensordict.from_module's
_FROM_MODULE = _routed_from_module(default_lock=False)  # TensorDict.from_module's


class behind_tensordict:
    """Route tensordict's ``to_module``, ``from_module`` and ``TensorDictParams`` to fcall's.

    Calling it turns the route on; ``undo()`` or the end of a ``with`` block turns it off and
    puts back exactly what it replaced. Routes nest: each undoes its own patches, in the
    reverse order they were made.

    Args:
        params_class: also route the ``TensorDictParams`` name (in tensordict's modules and
            in modules already imported that hold tensordict's class) to
            ``fcall.TensorDictParams``. Default ``True``.

    Examples:
        >>> import torch
        >>> from torch import nn
        >>> from tensordict import TensorDict
        >>> import fcall
        >>> net = nn.Linear(2, 2)
        >>> with fcall.behind_tensordict():
        ...     params = TensorDict.from_module(net).detach().clone().zero_()
        ...     with params.to_module(net):  # fcall.to_module runs
        ...         y = net(torch.ones(2))
        >>> y.tolist(), bool(net.weight.abs().sum() > 0)  # the module's own weights are back
        ([0.0, 0.0], True)
        >>> import tensordict.nn
        >>> tensordict.nn.TensorDictParams is fcall.TensorDictParams
        False
    """

    def __init__(self, *, params_class: bool = True) -> None:
        self._patches: list[tuple[Any, str, Any]] = []
        with _LOCK:
            self._patch(TensorDictBase, "to_module", _TO_MODULE)
            self._patch(TensorDictBase, "from_module", _FROM_MODULE_LOCKED)
            self._patch(TensorDict, "from_module", _FROM_MODULE)
            if params_class:
                for module in list(sys.modules.values()):
                    namespace = getattr(module, "__dict__", None)
                    if (
                        isinstance(namespace, dict)
                        and namespace.get("TensorDictParams") is _TDParams
                        and not getattr(module, "__name__", "").startswith("fcall")
                    ):
                        self._patch(module, "TensorDictParams", TensorDictParams)
            _ACTIVE.append(self)

    def _patch(self, owner: Any, name: str, value: Any) -> None:
        self._patches.append((owner, name, owner.__dict__.get(name, _ABSENT)))
        setattr(owner, name, value)

    @property
    def active(self) -> bool:
        """Whether this route is still on."""
        return self in _ACTIVE

    def undo(self) -> None:
        """Put back what this route replaced. Idempotent."""
        with _LOCK:
            if self not in _ACTIVE:
                return
            for owner, name, old in reversed(self._patches):
                if old is _ABSENT:
                    delattr(owner, name)
                else:
                    setattr(owner, name, old)
            self._patches.clear()
            _ACTIVE.remove(self)

    def __enter__(self) -> behind_tensordict:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.undo()

    def __repr__(self) -> str:
        return f"fcall.behind_tensordict(active={self.active})"


_ABSENT = object()
