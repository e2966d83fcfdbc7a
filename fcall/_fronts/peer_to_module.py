"""tensordict's own ``to_module``, for the one case fcall's plan has no slot for.

A module may hold a ``TensorDictParams`` as a submodule (``m.params =
TensorDict.from_module(net, as_module=True)``). Its entries are registered under dotted
names (``params.0.weight``) but live in its TensorDict, not in submodules: tensordict's
``to_module`` replaces that TensorDict's content. fcall's plan names slots only, so such a key
is refused (``UnknownKey``, nothing written), and ``fcall.to_module`` then hands the whole call
to tensordict's implementation: the peer's semantics, not fcall's transaction or compile
guarantees (``docs/behaviour.md``). The implementation is taken from the class that defines it
(``TensorDictBase`` on tensordict 0.14, a base class of it on 0.15) when fcall is imported,
before any ``fcall.behind_tensordict()`` can patch ``TensorDictBase.to_module``, so that a route
does not send it back to fcall.
"""

from __future__ import annotations

from typing import Any

from tensordict import TensorDictBase
from tensordict.nn import TensorDictParams as _TDParams
from torch import nn

from .._core import flatten as _flatten

__all__ = ["crosses_tensordict_module", "to_module"]


def _tensordict_implementation() -> Any:
    for klass in TensorDictBase.__mro__:
        found = klass.__dict__.get("to_module")
        if found is not None:
            return found
    raise AssertionError("tensordict defines no to_module")  # pragma: no cover


_TO_MODULE = _tensordict_implementation()


def crosses_tensordict_module(params: Any, module: nn.Module) -> bool:
    """Whether some key of ``params`` goes through a TensorDictParams submodule."""
    for key in _flatten.flatten(params, "fcall.to_module").keys:
        owner: Any = module
        for part in key[:-1]:
            owner = owner._modules.get(part) if isinstance(owner, nn.Module) else None
            if isinstance(owner, _TDParams):
                return True
            if owner is None:
                break
    return False


# to_module's keywords and their defaults: only those the caller changed are passed on, as
# tensordict replays the recorded keywords on exit (an explicit swap_dest=None would clash).
_DEFAULTS = {
    "inplace": None,
    "return_swap": True,
    "swap_dest": None,
    "non_blocking": False,
    "preserve_module_state": True,
}


def to_module(params: Any, module: nn.Module, **keywords: Any) -> Any:
    """tensordict's ``params.to_module(module, ...)``, with the keywords that differ from
    their defaults."""
    if not isinstance(params, TensorDictBase):
        leaves = _flatten.flatten(params, "fcall.to_module")
        params = _flatten.to_tensordict(leaves.keys, leaves.values)
    given = {k: v for k, v in keywords.items() if v is not _DEFAULTS[k]}
    return _TO_MODULE(params, module, **given)
