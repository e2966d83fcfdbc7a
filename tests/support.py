"""Shared by tests/ and compile_tests/: small modules, key helpers, what "the
module is exactly as before" means.

``state`` records every tensor slot of every submodule: the very objects, the dict
that holds them (parameter / buffer / plain attribute) and its order, their
``requires_grad``, and the non-persistent buffer names.
"""

from __future__ import annotations

import contextlib
import dis
from typing import Any

import pytest
import torch
from tensordict import TensorDict
from torch import nn

import fcall


class Net(nn.Module):
    """A Linear, a BatchNorm and a non-persistent buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 4)
        self.bn = nn.BatchNorm1d(4)
        self.register_buffer("offset", torch.zeros(4), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.lin(x)) + self.offset


class Tied(nn.Module):
    """An embedding whose weight is shared with the output head."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(5, 3)
        self.head = nn.Linear(3, 5, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(idx))


class Counter(nn.Module):
    """A module whose forward reassigns a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count = self.count + 1
        return self.lin(x) + self.count


def key(k: str | tuple) -> tuple:
    return k if isinstance(k, tuple) else (k,)


def flat(td: TensorDict) -> dict:
    """A TensorDict as a flat dict with dotted keys."""
    return {".".join(key(k)): v for k, v in td.items(True, True)}


def state(module: nn.Module, remove_duplicate: bool = False) -> list:
    """The module's exact state (every slot's object, type and requires_grad, its
    non-persistent buffers and tensor attributes), per path. ``remove_duplicate=True``
    for a tree with a reference cycle: each module once."""
    out = []
    for name, mod in module.named_modules(remove_duplicate=remove_duplicate):
        for where, slots in (("p", mod._parameters), ("b", mod._buffers)):
            for key, value in slots.items():
                grad = None if value is None else value.requires_grad
                out.append((name, where, key, value, type(value), grad))
        out.append((name, "np", sorted(mod._non_persistent_buffers_set)))
        out.append((name, "attrs", [k for k, v in mod.__dict__.items() if torch.is_tensor(v)]))
    return out


def assert_same_state(
    module: nn.Module, before: list, remove_duplicate: bool = False, in_any_order: bool = False
) -> None:
    """``module`` holds the very objects of ``before``, in the same slots, in the same order;
    ``in_any_order``: each dict's order aside (``to_module`` moves the names it writes to the
    end of their dict, as tensordict's does; tests/test_to_module.py pins that order against
    tensordict's)."""
    after = state(module, remove_duplicate)
    assert len(after) == len(before)
    if in_any_order:
        after, before = _by_slot(after), _by_slot(before)
    for a, b in zip(after, before):
        for x, y in zip(a, b, strict=True):
            if torch.is_tensor(x) or torch.is_tensor(y):
                assert x is y, (a[:3], b[:3])
            else:
                assert x == y, (a, b)


def _by_slot(state: list) -> list:
    """``state`` sorted by (path, where, key): stable, so other rows keep their place."""
    return sorted(state, key=lambda row: (row[0], row[1], row[2] if row[1] in ("p", "b") else ""))


class Untied(nn.Module):
    """An embedding and an output head that a test ties after a first swap."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(5, 3)
        self.head = nn.Linear(3, 5, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(idx))


class Sliced(nn.Module):
    """A forward that slices its layer list, as transformers' Llama does: every call
    registers each layer into a new ModuleList."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[: len(self.layers)]:
            x = layer(x)
        return x


def layout(module: nn.Module) -> list:
    """``state`` without the objects: what two modules built alike and changed alike share
    (each slot's path, dict, name, type and requires_grad, in order)."""
    return [row[:3] + row[4:] if len(row) == 6 else row for row in state(module)]


def swap_call(m: nn.Module, p: object, x: torch.Tensor) -> torch.Tensor:
    """``m(x)`` inside ``fcall.swap(p, m)``."""
    with fcall.swap(p, m):
        return m(x)


def functional_call(m: nn.Module, p: object, x: torch.Tensor) -> torch.Tensor:
    """``fcall.functional_call(m, p, (x,))``."""
    return fcall.functional_call(m, p, (x,))


def to_module_call(m: nn.Module, p: object, x: torch.Tensor) -> torch.Tensor:
    """``m(x)`` inside ``fcall.to_module(p, m)``."""
    with fcall.to_module(p, m):
        return m(x)


# the opcodes and methods through which transformed code writes into a dict or an object
_WRITES = {"STORE_SUBSCR", "DELETE_SUBSCR", "STORE_ATTR", "DELETE_ATTR"}
_WRITE_METHODS = {"clear", "update", "__setitem__", "__delitem__", "pop", "setdefault"}


def writes_after_the_graph(code: Any) -> list[tuple[str, Any]]:
    """The writes in the transformed code of the one cache entry of ``code``."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    (entry,) = _debug_get_cache_entry_list(code)
    return [
        (ins.opname, ins.argval)
        for ins in dis.get_instructions(entry.code)
        if ins.opname in _WRITES or ins.argval in _WRITE_METHODS
    ]


# --- Dynamo < 2.13: a dict's key order is guarded ---------------------------------------------
# Dynamo 2.11 and 2.12 guard each dict they read with its keys in order (DICT_KEYS_MATCH);
# 2.13 compares them as a set unless the trace read the order. On those stacks a dict whose
# order changed between two calls recompiles once: a params dict given in another order, or a
# module dict that `to_module` reordered (it registers the names it writes again, at the end,
# as tensordict's does). The result and the module are eager's on every stack; only the
# graph count differs (docs/versions.md).
TORCH = tuple(int(part) for part in torch.__version__.split(".")[:2])
KEY_ORDER_GUARDED = TORCH < (2, 13)


class Recompiled(AssertionError):
    """More graphs than a test expects."""


def assert_frames(cnt: Any, expected: int) -> None:
    """``cnt`` (a counting backend) compiled ``expected`` graphs."""
    if cnt.frame_count != expected:
        raise Recompiled(f"{cnt.frame_count} graphs, expected {expected}")


def key_order_recompiles(request: Any) -> None:
    """This test's graph count fails where Dynamo guards a dict's key order (strictly: it
    must fail there, and only with ``Recompiled``, after the results were checked)."""
    if KEY_ORDER_GUARDED:
        request.node.add_marker(
            pytest.mark.xfail(
                strict=True,
                raises=Recompiled,
                reason="Dynamo < 2.13 guards each dict's key order: a reordered dict "
                "recompiles once (docs/versions.md)",
            )
        )


# --- Dynamo 2.11 -----------------------------------------------------------------------------
DYNAMO_2_11 = TORCH < (2, 12)


def sound_requires_grad_guards() -> Any:
    """A context in which Dynamo sees a module Parameter's ``requires_grad`` flipped in place.
    Dynamo 2.11 skips the guards under a module whose ``__dict__`` tags are unchanged
    (``use_recursive_dict_tags_for_guards``, on by default there; pytorch/pytorch#139476),
    so a compiled module does not recompile when its own Parameters' ``requires_grad``
    changes; torch 2.12 turned it off (docs/versions.md)."""
    if DYNAMO_2_11:
        return torch._dynamo.config.patch(use_recursive_dict_tags_for_guards=False)
    return contextlib.nullcontext()


def raised_in_trace(error: BaseException) -> str:
    """How ``Unsupported: Observed exception`` names ``error``, raised in the trace, in its
    developer debug context: its repr; Dynamo 2.11 shows the message as a variable, in a
    list for a builtin exception and in a tuple for a user-defined one."""
    if DYNAMO_2_11:
        message = f"ConstantVariable(str: {error.args[0]!r})"
        args = f"[{message}]" if type(error).__module__ == "builtins" else f"({message},)"
        return f"raised exception {type(error).__name__}({args})\n"
    return f"raised exception {error!r}\n"
