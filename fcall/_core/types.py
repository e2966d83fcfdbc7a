"""The typed vocabulary of a swap: how values go in (``Mode``), what kind of slot a
key names (``SlotKind``), and one row of a plan (``Entry``).

These are plain enums and a NamedTuple so that Dynamo folds them while it traces a
swap: an enum member is a constant in the trace, and an ``Entry`` is a tuple (built
and unpacked without inlining any Python of its own).
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple


class Mode(enum.Enum):
    """How a swap's values go into the module's slots."""

    AS_IS = "as_is"
    """``swap`` / ``functional_call``: each value goes into its slot as it is, as
    ``torch.func.functional_call`` does (no new Parameter is made)."""
    PRESERVE = "preserve"
    """``to_module(preserve_module_state=True)``: a value that does not track gradients
    and replaces a Parameter is wrapped in a Parameter with the old ``requires_grad``."""
    REPLACE = "replace"
    """``to_module(preserve_module_state=False)``: a plain tensor that replaces a
    Parameter becomes a plain attribute, a Parameter that replaces a buffer a parameter."""
    INPLACE = "inplace"
    """``to_module(inplace=True)``: values are copied into the module's own tensors."""
    SHARDED = "sharded"
    """An FSDP2 tree: values are copied into each rank's shards (``fcall/_distributed.py``)."""


class SlotKind(enum.Enum):
    """Which dict of its owner module holds a key."""

    PARAMETER = "parameter"  # owner._parameters
    BUFFER = "buffer"  # owner._buffers
    ATTRIBUTE = "attribute"  # owner.__dict__: a plain tensor attribute


class Entry(NamedTuple):
    """Where one key of a params container lives: ``slot[name]``."""

    slot: dict[str, Any]
    """The owner's ``_parameters``, ``_buffers`` or ``__dict__``."""
    name: str
    """The key's last part: its name inside ``slot``."""
    leaf: int
    """The index of the value in the params leaves (a tied alias: its source's)."""
    attributes: dict[str, Any] | None
    """The owner's ``__dict__``, rather than the owner: a plan must not keep its module
    alive. ``None`` in a traced Route's plan (``_plan.attributes_of`` reads it on need)."""
    kind: SlotKind


# How traced code makes an Entry: `new_entry(Entry, (slot, name, leaf, attributes, kind))`.
# Dynamo runs `Entry(...)` through its polyfill of class instantiation, about 50 bytecode
# steps per entry, each leaf's compile time; `tuple.__new__` directly, about 4.
new_entry = tuple.__new__
