"""Turn a params container into flat leaves, and old values back into a TensorDict.

A params container is a TensorDict (nested keys), a TensorDictParams, or a dict
(nested, or with flat ``"a.b.weight"`` keys, or both). Flattening yields, per
leaf, its key as a tuple of names, the tensor (or ``None``: a slot such as
``bias=None`` held it, and the old values ``to_module`` returns carry it so that
``to_module(old, module)`` puts it back; ``torch.func.functional_call`` accepts
``None`` too), and where it lives (the innermost
container and the key inside it) so that a buffer that ``forward`` reassigns can
be written back on exit.

The walk reads ``TensorDict._tensordict`` directly when the container is an
exact ``TensorDict``: the generic ``items()`` costs more in eager and, under
Dynamo, installs guards on every TensorDict attribute it touches.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from . import _errors

Key = tuple[str, ...]
Holder = tuple[Any, Any]  # (innermost container, key inside it)


class Leaves:
    """The leaves of a params container, in its own order."""

    __slots__ = ("holders", "keys", "values")

    def __init__(self) -> None:
        self.keys: list[Key] = []
        self.values: list[Any] = []
        self.holders: list[Holder] = []


def flatten(params: Any, api: str) -> Leaves:
    leaves = Leaves()
    if isinstance(params, TensorDictBase):
        _walk_tensordict(_wrapped(params), (), leaves, api)
    elif isinstance(params, dict):
        _walk_dict(params, (), leaves, api)
    else:
        raise TypeError(_errors.bad_params(api, params))
    return leaves


def _wrapped(params: TensorDictBase) -> TensorDictBase:
    # A TensorDictParams wraps a TensorDict; swapping reads the registered
    # leaves themselves, not through get-post-hooks.
    inner = getattr(params, "_param_td", None)
    return inner if isinstance(inner, TensorDictBase) else params


def _walk_tensordict(td: TensorDictBase, prefix: Key, leaves: Leaves, api: str) -> None:
    items = td._tensordict.items() if type(td) is TensorDict else td.items()
    for name, value in items:
        key = (*prefix, name)
        if value is None or isinstance(value, torch.Tensor):
            leaves.keys.append(key)
            leaves.values.append(value)
            leaves.holders.append((td, name))
        elif isinstance(value, TensorDictBase):
            _walk_tensordict(_wrapped(value), key, leaves, api)
        else:
            raise TypeError(_errors.not_a_tensor(api, _errors.dotted(key), _payload(value)))


def _walk_dict(tree: dict, prefix: Key, leaves: Leaves, api: str) -> None:
    for name, value in tree.items():
        key = (*prefix, *_split(name))
        if value is None or isinstance(value, torch.Tensor):
            leaves.keys.append(key)
            leaves.values.append(value)
            leaves.holders.append((tree, name))
        elif isinstance(value, dict):
            _walk_dict(value, key, leaves, api)
        elif isinstance(value, TensorDictBase):
            _walk_tensordict(_wrapped(value), key, leaves, api)
        else:
            raise TypeError(_errors.not_a_tensor(api, _errors.dotted(key), _payload(value)))


def _split(name: Any) -> Key:
    if isinstance(name, tuple):
        return tuple(part for item in name for part in item.split("."))
    return tuple(name.split("."))


def _payload(value: Any) -> Any:
    # A NonTensorData leaf (a tensorclass, not a TensorDictBase) reports the
    # type of what it holds.
    return value.data if getattr(value, "_is_non_tensor", False) else value


def to_tensordict(keys: list[Key], values: list[Any]) -> TensorDict:
    """``[("a", "w")], [t]`` -> ``TensorDict(a=TensorDict(w=t))``, without checks.

    The leaves are known tensors of the module, so the TensorDict's own
    validation is skipped: it costs more than the swap in eager, and under
    Dynamo its type checks on a Parameter created in the graph crash the guard
    builder (``NameError: SYNTHETIC_LOCAL``).
    """
    root = _empty()
    for key, value in zip(keys, values):
        node = root
        for name in key[:-1]:
            child = node._tensordict.get(name)
            if child is None:
                child = node._tensordict[name] = _empty()
            node = child
        node._tensordict[key[-1]] = value
    return root


def _empty() -> TensorDict:
    return TensorDict._new_unsafe(batch_size=torch.Size(()))
