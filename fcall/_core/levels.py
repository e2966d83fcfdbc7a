"""Reaching a tree's nodes a level at a time (a module tree's owners, a TensorDict's nodes):
at trace time in eager (``routes.py``) and in the trace (``traced.py``), the same code. The
reads are builtins (``map``, ``getattr``, ``dict.__getitem__``) that Dynamo runs without
stepping per item; in the trace they are the guards on the tree's structure.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from itertools import repeat
from typing import Any, NamedTuple


class Levels(NamedTuple):
    """How the trace reaches the nodes of a tree below its root, a level at a time: the
    nodes of a level are ``node[name]`` of nodes of the level above."""

    parents: tuple[tuple[int, ...], ...]
    """Per level, the index of each node's parent in the level above."""
    names: tuple[tuple[str, ...], ...]
    """Per level, each node's name in its parent."""


def modules_of(level: Sequence[Any]) -> tuple:
    """A module tree's containers of the next level: each module's ``_modules``."""
    return tuple(map(getattr, level, repeat("_modules")))


def entries_of(level: Sequence[Any]) -> Sequence[Any]:
    """A TensorDict tree's containers of the next level: each node's entries (``descend``
    reads ``_tensordict`` of each node it reaches)."""
    return level


def descend(top: list, levels: Levels, containers: Any) -> list:
    """The nodes of ``levels`` below ``top``: ``top`` first, then each level."""
    found = list(top)
    level: Sequence[Any] = top
    for parents, names in zip(levels.parents, levels.names):
        level = tuple(map(dict.__getitem__, containers(pick(level, parents)), names))
        if containers is entries_of:  # a TensorDict node: its entries
            level = tuple(map(getattr, level, repeat("_tensordict")))
        found.extend(level)
    return found


def pick(items: Sequence[Any], indexes: tuple[int, ...]) -> tuple:
    """``[items[i] for i in indexes]`` in one builtin call (``operator.itemgetter`` is a
    polyfill that Dynamo steps through per item)."""
    return tuple(map(operator.getitem, repeat(items), indexes))
