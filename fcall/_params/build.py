"""TensorDictParams: how it is built, in eager code and while Dynamo traces.

* **Traced** (``torch.compiler.is_dynamo_compiling()``): Dynamo 2.13 builds a user-defined
  ``nn.Module`` in the graph (``polyfills.instantiate_user_defined_class_object``: an object
  tracked as new by the side-effect tracker, then ``__init__`` inlined), so ``_build`` runs
  traced, with no graph break, provided it avoids what Dynamo refuses: ``nn.Module.__init__``
  called by name (traced through ``super()`` only), ``type()`` on a Parameter made in the graph
  (``rules.tensor_leaves`` / ``lock_tree`` walk with ``isinstance``), hashing the object
  by id (``named_modules``). ``nn.Parameter(t)`` traces when ``t`` is a graph input; on a
  tensor computed in the graph Dynamo breaks (``config.graph_break_on_nn_param_ctor``): then
  the whole ``TensorDictParams(...)`` call runs eagerly, once per call, one break.
* **Eager**: ``build_untraced``, a ``torch._dynamo.disable``-d call. After such a break Dynamo
  runs the constructor eagerly with its frame hook still on: every helper called from the build
  would be compiled as a frame of its own (``Buffer(value)`` a graph, the next dtype a
  recompile). Disabled: nothing inside is. ``torch.compiler.is_compiling()`` is also True under
  ``torch.export.export(strict=False)``, where nothing is traced: the build is the eager one.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["build_untraced"]


@torch._dynamo.disable
def build_untraced(obj: Any, parameters: Any, no_convert: Any, lock: bool, kwargs: dict) -> None:
    obj._build(parameters, no_convert, lock, kwargs)
