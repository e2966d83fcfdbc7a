"""What "the module is exactly as before" means in the tests, eager and compiled.

Every tensor slot of every submodule: the very objects, the dict that holds them
(parameter / buffer / plain attribute) and its order, their ``requires_grad``, and
the non-persistent buffer names.
"""

from __future__ import annotations

import torch
from torch import nn


def state(module: nn.Module) -> list:
    out = []
    for name, mod in module.named_modules(remove_duplicate=False):
        for where, slots in (("p", mod._parameters), ("b", mod._buffers)):
            for key, value in slots.items():
                grad = None if value is None else value.requires_grad
                out.append((name, where, key, value, type(value), grad))
        out.append((name, "np", sorted(mod._non_persistent_buffers_set)))
        out.append((name, "attrs", [k for k, v in mod.__dict__.items() if torch.is_tensor(v)]))
    return out


def assert_same_state(module: nn.Module, before: list) -> None:
    after = state(module)
    assert len(after) == len(before)
    for a, b in zip(after, before):
        for x, y in zip(a, b, strict=True):
            if torch.is_tensor(x) or torch.is_tensor(y):
                assert x is y, (a[:3], b[:3])
            else:
                assert x == y, (a, b)
