"""Graph breaks in the user's terms: the user's file and line, and Dynamo's reason."""

from __future__ import annotations

import dataclasses
import os
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch._dynamo

import fcall

# Frames in these folders are the machinery (torch, fcall, tensordict), not the user's code.
_NOT_USER = tuple(
    os.path.dirname(os.path.abspath(m.__file__ or "")) + os.sep
    for m in (torch, fcall, __import__("tensordict"))
)


@dataclasses.dataclass(frozen=True)
class GraphBreak:
    """Where Dynamo broke the graph (the innermost user frame) and why."""

    location: str  # "path/to/model.py:28 (in forward)", or "" when Dynamo gave no frame
    reason: str

    def __str__(self) -> str:
        return f"{self.location}: {self.reason}" if self.location else self.reason


def _user_location(stack: Sequence[traceback.FrameSummary] | None) -> str:
    frames = list(stack or [])
    user = [f for f in frames if not os.path.abspath(f.filename).startswith(_NOT_USER)]
    if not frames:
        return ""
    frame = (user or frames)[-1]
    return f"{frame.filename}:{frame.lineno} (in {frame.name})"


def _short(reason: str) -> str:
    """Dynamo's reason up to its links and stacks: the kind, explanation and hint."""
    head = reason.split("\n\n", 1)[0]
    return "\n".join(line.rstrip() for line in head.strip().splitlines())


def from_unsupported(exc: torch._dynamo.exc.Unsupported) -> GraphBreak:
    """The break a ``fullgraph=True`` compile raised."""
    return GraphBreak(_user_location(exc.real_stack), _short(str(exc)))


def count_breaks(step: Callable[..., Any], args: Sequence[Any]) -> list[GraphBreak]:
    """The graph breaks of one call of ``step`` (``torch._dynamo.explain``; resets Dynamo)."""
    torch._dynamo.reset()
    out = torch._dynamo.explain(step)(*args)
    torch._dynamo.reset()
    found = [GraphBreak(_user_location(r.user_stack), _short(r.reason)) for r in out.break_reasons]
    return list(dict.fromkeys(found))
