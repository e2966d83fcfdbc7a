"""Where ``fcall.to_module`` is tensordict's own: into a TensorDictParams, and through one.

``into_tensordict_module``: a TensorDictParams is an ``nn.Module`` that is a TensorDict; its
TensorDict is replaced whole, as tensordict's ``to_module`` does there.

tensordict's own ``to_module``, for the one case fcall's plan has no slot for.

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

from collections.abc import Mapping
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictParams as _TDParams
from torch import nn

from .._compat import no_previous, register_exit_op
from .._core.flatten import flatten, to_tensordict
from .._core.tree import owner_at

__all__ = ["crosses_tensordict_module", "into_tensordict_module", "to_module"]


def _tensordict_implementation() -> Any:
    for klass in TensorDictBase.__mro__:
        found = klass.__dict__.get("to_module")
        if found is not None:
            return found
    raise AssertionError("tensordict defines no to_module")  # pragma: no cover


_TO_MODULE = _tensordict_implementation()


def crosses_tensordict_module(params: Any, module: nn.Module) -> bool:
    """Whether some key of ``params`` goes through a TensorDictParams submodule."""
    for key in flatten(params).keys:
        for depth in range(1, len(key)):
            owner = owner_at(module, key[:depth])
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
        leaves = flatten(params)
        params = to_tensordict(leaves.keys, leaves.values)
    given = {k: v for k, v in keywords.items() if v is not _DEFAULTS[k]}
    return _TO_MODULE(params, module, **given)


_TD_MODULE_OP = "_fcall_to_tensordict_module"  # the record of into_tensordict_module


def into_tensordict_module(
    params: TensorDictBase | Mapping[str, Any], module: Any, return_swap: bool
) -> TensorDictBase | None:
    """tensordict's ``to_module`` into a TensorDictParams (an ``nn.Module`` that is a
    TensorDict): the module's TensorDict becomes ``params`` itself and a copy of the
    module is returned, which puts the old TensorDict back on exit of ``with``; with
    ``return_swap=False``, ``module.update(params)``. Keys are not checked (nor are they
    by tensordict: the module then holds exactly what ``params`` holds). On exit the
    module gets back the very TensorDict it held (tensordict: a shallow copy of it)."""
    if not isinstance(params, TensorDictBase):
        leaves = flatten(params)
        params = to_tensordict(leaves.keys, leaves.values)
    if not return_swap:
        module.update(params)
        return None
    previous = module._param_td
    # Traced, a TensorDictParams cannot be built without a graph break: the copy returned
    # is then one of its TensorDict (the same leaves).
    out = previous.copy() if torch.compiler.is_compiling() else module.copy()
    module._param_td = getattr(params, "_param_td", params)
    out._last_op = (_TD_MODULE_OP, ((module, previous), {}, no_previous))
    return out


def _put_back_tensordict(out: Any, args: tuple, kwargs: dict, prev: Any) -> None:
    module, previous = args
    module._param_td = previous  # the very TensorDict it held


register_exit_op(_TD_MODULE_OP, _put_back_tensordict)
