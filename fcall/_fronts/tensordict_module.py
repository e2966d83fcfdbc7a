"""``to_module`` into a TensorDictParams, an ``nn.Module`` that is a TensorDict: its
TensorDict is replaced whole, as tensordict's ``to_module`` does there."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from tensordict import TensorDictBase

from .._compat import register_exit_op
from .._core import flatten as _flatten

_TD_MODULE_OP = "_fcall_to_tensordict_module"  # the record of into_tensordict_module


def into_tensordict_module(
    params: TensorDictBase | Mapping[str, Any], module: Any, return_swap: bool, api: str
) -> TensorDictBase | None:
    """tensordict's ``to_module`` into a TensorDictParams (an ``nn.Module`` that is a
    TensorDict): the module's TensorDict becomes ``params`` itself and a copy of the
    module is returned, which puts the old TensorDict back on exit of ``with``; with
    ``return_swap=False``, ``module.update(params)``. Keys are not checked (nor are they
    by tensordict: the module then holds exactly what ``params`` holds). On exit the
    module gets back the very TensorDict it held (tensordict: a shallow copy of it)."""
    if not isinstance(params, TensorDictBase):
        leaves = _flatten.flatten(params, api)
        params = _flatten.to_tensordict(leaves.keys, leaves.values)
    if not return_swap:
        module.update(params)
        return None
    previous = module._param_td
    # Traced, a TensorDictParams cannot be built without a graph break: the copy returned
    # is then one of its TensorDict (the same leaves).
    out = previous.copy() if torch.compiler.is_compiling() else module.copy()
    module._param_td = getattr(params, "_param_td", params)
    out._last_op = (_TD_MODULE_OP, ((module, previous), {}, _no_previous_op))
    return out


def _put_back_tensordict(out: Any, args: tuple, kwargs: dict, prev: Any) -> None:
    module, previous = args
    module._param_td = previous  # the very TensorDict it held


def _no_previous_op() -> None:
    return None


register_exit_op(_TD_MODULE_OP, _put_back_tensordict)
