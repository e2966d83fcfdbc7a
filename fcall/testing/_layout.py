"""The layout of a param set (key -> tensor metadata) and the diff of two layouts.

Dynamo guards a swapped parameter on its metadata, not its values: a new set with the same
layout reuses the compiled code, and any change below recompiles. ``diff_layouts`` says
which keys changed what, grouped so that 142 parameters cast alike read as one line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from tensordict import TensorDictBase


@dataclasses.dataclass(frozen=True)
class LeafLayout:
    """What Dynamo's tensor guards look at, for one value of a param set."""

    kind: str  # the Python type: "Parameter", "Tensor", "Buffer", ...
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    device: str
    requires_grad: bool

    @classmethod
    def of(cls, value: torch.Tensor) -> LeafLayout:
        return cls(
            kind=type(value).__name__,
            dtype=value.dtype,
            shape=tuple(value.shape),
            stride=tuple(value.stride()) if value.layout == torch.strided else (),
            device=str(value.device),
            requires_grad=value.requires_grad,
        )


@dataclasses.dataclass(frozen=True)
class Layout:
    """The container type and, per dotted key, the layout of its value."""

    container: str
    leaves: dict[str, LeafLayout]

    @classmethod
    def of(cls, params: Any) -> Layout:
        return cls(type(params).__name__, {k: LeafLayout.of(v) for k, v in flat_items(params)})


def flat_items(params: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """``(dotted key, tensor)`` for every tensor of a TensorDict, TensorDictParams or
    (nested or flat) dict of tensors, in the container's order."""
    if isinstance(params, TensorDictBase):
        for key, value in params.items(include_nested=True, leaves_only=True):
            name = ".".join(key) if isinstance(key, tuple) else key
            if isinstance(value, torch.Tensor):
                yield prefix + name, value
    elif isinstance(params, Mapping):
        for key, value in params.items():
            if isinstance(value, (Mapping, TensorDictBase)):
                yield from flat_items(value, f"{prefix}{key}.")
            elif isinstance(value, torch.Tensor):
                yield f"{prefix}{key}", value


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# Each field, and how one of its values reads in a change ("float32→float64").
_FIELDS: dict[str, Any] = {
    "kind": str,
    "dtype": _dtype,
    "shape": lambda s: "(" + ", ".join(map(str, s)) + ")",
    "stride": lambda s: "(" + ", ".join(map(str, s)) + ")",
    "device": str,
    "requires_grad": str,
}


@dataclasses.dataclass(frozen=True)
class Change:
    """One kind of change shared by ``keys``: ``field`` went from ``before`` to ``after``
    (``field`` is a ``LeafLayout`` field, or ``"missing"`` / ``"added"`` for the key set)."""

    field: str
    before: str
    after: str
    keys: tuple[str, ...]

    def __str__(self) -> str:
        n = len(self.keys)
        first = f"`{self.keys[0]}`" if n == 1 else f"first: `{self.keys[0]}`"
        if self.field in ("missing", "added"):
            what = "missing from the new set" if self.field == "missing" else "new in the new set"
            return f"{n} key{'s' * (n != 1)} {what}, {first}"
        label = {"kind": "type", "requires_grad": "requires_grad"}.get(self.field, self.field)
        change = f"{self.before}→{self.after}"
        if self.field in ("dtype", "kind", "device"):
            return f"{n} param{'s' * (n != 1)} {change}, {first}"
        return f"{n} param{'s' * (n != 1)} {label} {change}, {first}"


@dataclasses.dataclass(frozen=True)
class LayoutDiff:
    """What changed from one param set's layout to the next, grouped by kind of change."""

    container: tuple[str, str] | None
    changes: tuple[Change, ...]

    def __bool__(self) -> bool:
        return self.container is not None or bool(self.changes)

    def keys(self) -> list[str]:
        """Every key some change names, first seen first."""
        return list(dict.fromkeys(k for c in self.changes for k in c.keys))

    def __str__(self) -> str:
        if not self:
            return "the layout is the same (keys, types, dtypes, shapes, requires_grad, devices)"
        lines = [f"container {self.container[0]}→{self.container[1]}"] if self.container else []
        return "; ".join(lines + [str(c) for c in self.changes])


def diff_layouts(before: Layout, after: Layout) -> LayoutDiff:
    """The changes from ``before`` to ``after``, one ``Change`` per (field, from, to).

    >>> import torch
    >>> a = Layout.of({"w": torch.ones(2), "b": torch.ones(1)})
    >>> b = Layout.of({"w": torch.ones(2, dtype=torch.float64)})
    >>> print(diff_layouts(a, b))
    1 key missing from the new set, `b`; 1 param float32→float64, `w`
    """
    groups: dict[tuple[str, str, str], list[str]] = {}
    missing = [k for k in before.leaves if k not in after.leaves]
    added = [k for k in after.leaves if k not in before.leaves]
    for key, old in before.leaves.items():
        new = after.leaves.get(key)
        if new is None:
            continue
        for field, show in _FIELDS.items():
            a, b = getattr(old, field), getattr(new, field)
            if field == "stride" and old.shape != new.shape:
                continue  # a new shape has new strides: the shape says it
            if a != b:
                groups.setdefault((field, show(a), show(b)), []).append(key)
    changes = [Change("missing", "", "", tuple(missing))] if missing else []
    changes += [Change("added", "", "", tuple(added))] if added else []
    changes += [Change(f, a, b, tuple(keys)) for (f, a, b), keys in groups.items()]
    container = (before.container, after.container)
    return LayoutDiff(container if container[0] != container[1] else None, tuple(changes))
