"""TensorDictParams: building one while Dynamo traces.

Under ``torch.compile``, converting a tensor created inside the graph to ``nn.Parameter``
graph-breaks (``config.graph_break_on_nn_param_ctor``), and a break inside ``__init__`` leaves
an "Uninitialized nn.Module" that breaks again. ``__new__`` therefore builds the whole object
in one ``torch._dynamo.disable``-d helper: one graph break at most, whatever the number of
leaves. Only under Dynamo: ``torch.compiler.is_compiling()`` is also True under
``torch.export.export(strict=False)``, where nothing is traced and the constructor runs as in
eager (asking ``is_compiling()`` there made ``__new__`` call itself until ``RecursionError``).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["build_untraced", "construct_eagerly"]


@torch._dynamo.disable
def build_untraced(obj: Any, parameters: Any, no_convert: Any, lock: bool, kwargs: dict) -> None:
    # Dynamo graph-breaks at construct_eagerly and, unable to resume inside a constructor,
    # runs the whole `TensorDictParams(...)` call eagerly, with its frame hook still on: every
    # helper called from here would be compiled as a frame of its own (with no_convert=True
    # Buffer(value) is a graph, and the next dtype a recompile). Disabled: nothing inside is.
    obj._build(parameters, no_convert, lock, kwargs)


@torch._dynamo.disable
def construct_eagerly(cls: type, args: tuple, kwargs: dict) -> Any:
    # Not traced: Dynamo's frame hook is off here, so cls(...) takes the eager path.
    obj = cls(*args, **kwargs)
    object.__setattr__(obj, "_built_outside_graph", True)
    return obj
