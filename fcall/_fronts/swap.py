"""``fcall.swap``: a context manager that swaps a parameter set in as it is, and back."""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Any, Literal

from tensordict import TensorDict, TensorDictBase
from torch import nn

from .._core.engine import restore, swap_in
from .._core.flatten import old_tensordict
from .._core.types import Swap
from .._errors import Fault

Params = TensorDictBase | Mapping[str, Any]


class swap:
    """Swap ``params`` into ``module`` for the duration of a ``with`` block.

    ``with fcall.swap(params, model) as old:`` runs the block with ``params`` in
    the module and binds ``old`` to a TensorDict of the values it held. On exit,
    normal or by exception, the module gets back the very same Parameter and
    buffer objects, registered as before. Values go into their slots as they are,
    like ``torch.func.functional_call``: no new Parameter is made, so gradients
    reach every leaf that requires grad. In-place updates during the block
    (BatchNorm running stats) land in the params' tensors, and a buffer that
    ``forward`` reassigns is written back into ``params`` on exit.

    Args:
        params: a TensorDict, a TensorDictParams, or a dict (nested or flat keys).
        module: the module to swap into.
        strict: if ``True``, every parameter and buffer of the module must have a
            value in ``params`` (``RuntimeError`` listing the missing keys).
        tie_weights: names that the module ties to one tensor all see the value
            given for any of them; different values for tied names raise
            ``ValueError``. With ``False`` each name takes only its own value.

    Unknown keys raise ``KeyError`` and non-tensor values ``TypeError``, before
    anything is written.

    Examples:
        >>> import torch
        >>> from torch import nn
        >>> import fcall
        >>> model = nn.Linear(2, 2)
        >>> ones = {"weight": torch.ones(2, 2), "bias": torch.zeros(2)}
        >>> with fcall.swap(ones, model) as old:
        ...     model(torch.tensor([1.0, 2.0]))
        tensor([3., 3.])
        >>> model.weight is old["weight"]
        True
    """

    def __init__(
        self, params: Params, module: nn.Module, *, strict: bool = False, tie_weights: bool = True
    ) -> None:
        self._params = params
        self._module = module
        self._strict = strict
        self._tie_weights = tie_weights
        self._swap: Swap | None = None
        self._outer: list[Swap] = []  # the swaps of enclosing enters of this object

    def __enter__(self) -> TensorDict:
        try:
            swapped, leaves = swap_in(self._params, self._module, self._strict, self._tie_weights)
        except Fault as fault:
            error = fault.worded("fcall.swap")
        else:
            if self._swap is not None:  # entered again inside its own block: nested restores
                self._outer.append(self._swap)
            self._swap = swapped
            return old_tensordict(swapped.plan, leaves, swapped.old[: swapped.plan.given])
        raise error  # outside the except clause: no Fault chained to it

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]:
        if self._swap is not None:
            swapped = self._swap
            self._swap = self._outer.pop() if self._outer else None
            restore(swapped)
        return False
