"""``fcall.from_module``: tensordict's ``TensorDict.from_module``, read with tensordict's own walk,
wrapped (``as_module=True``) in fcall's TensorDictParams."""

from __future__ import annotations

from tensordict import TensorDict
from tensordict.nn import TensorDictParams as TensorDictParamsBase
from torch import nn

from .. import _errors
from .._params.params import TensorDictParams

__all__ = ["from_module"]


def from_module(
    module: nn.Module,
    *,
    as_module: bool = False,
    lock: bool = False,
    use_state_dict: bool = False,
    filter_empty: bool = True,
) -> TensorDict | TensorDictParams:
    """A TensorDict of the parameters and buffers of ``module``, with nested keys.

    The leaves are the module's own tensors (no copy). Tied names appear once per
    name, sharing one tensor, and non-persistent buffers are included.

    With ``as_module=True`` (tensordict's ``TensorDict.from_module(m, as_module=True)``) the
    result is a :class:`fcall.TensorDictParams` that registers each entry as the module
    does: parameters as parameters, buffers (BatchNorm's running stats) as buffers. Copy it
    with ``.detach().clone()`` (or ``.clone()`` to keep ``requires_grad``): copies keep each
    entry's registration. As tensordict's, it has ``no_convert=True``: entries set later
    become buffers.

    Examples:
        >>> from torch import nn
        >>> import fcall
        >>> net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
        >>> params = fcall.from_module(net)
        >>> sorted(params.keys(include_nested=True, leaves_only=True))[:3]
        [('0', 'bias'), ('0', 'weight'), ('1', 'bias')]
        >>> params["0", "weight"].shape
        torch.Size([4, 3])
        >>> target = fcall.from_module(net, as_module=True).detach_registered().clone()
        >>> len(list(target.parameters())), len(list(target.buffers()))
        (4, 3)
    """
    if not isinstance(module, nn.Module):
        raise TypeError(_errors.not_a_module("fcall.from_module", module))
    # tensordict's own walk (TensorDict._from_module): the peer's tree by construction, a
    # TensorDictParams held as a submodule kept as that very object, and with as_module
    # (eager) buffers marked as tensordict marks them (Buffer).
    td = TensorDict._from_module(
        module=module, as_module=as_module, use_state_dict=use_state_dict, filter_empty=filter_empty
    )
    if td is None:  # no parameter or buffer anywhere, filter_empty
        td = TensorDict()
    if isinstance(td, TensorDictParamsBase):  # as_module: tensordict wrapped it; fcall's wraps
        td = td._param_td  # the very TensorDict (no copy: a nested TensorDictParams stays)
    if not as_module:
        return td.lock_() if lock else td
    if not lock:  # tensordict's TensorDictParams(td) runs on td.unlock_(): nested ones unlock
        td.unlock_()
    out = TensorDictParams(td, no_convert=True)
    object.__setattr__(out, "no_convert", True)  # as tensordict's (its constructor keeps "skip")
    return out.lock_() if lock else out
