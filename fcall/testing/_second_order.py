"""``check_swap_parity(..., order=2)``: second-order gradients through a compiled swap.

A MAML user compiles the whole inner step: the swapped forward, ``torch.autograd.grad(...,
create_graph=True)`` of its loss, the adapted values, and the swapped forward again. With
an AOTAutograd backend (``aot_eager``, ``inductor``) that runs, and its meta-gradient is the
first-order (FOMAML) one, with no error (pytorch/pytorch#181581, #91469). This check
compiles that inner step as users write it (``fullgraph=False``: ``autograd.grad`` breaks
the graph) and compares the meta-gradient with eager's; a compiled meta-gradient that
equals the first-order one is named as such.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from . import _compare
from ._backend import Backend, backend_name
from ._layout import flat_items
from ._report import Failure, ParityError

INNER_LR = 0.5  # the inner step's learning rate


def _loss(out: Any) -> torch.Tensor:
    leaves = pytree.tree_leaves(out)
    return _compare.loss_of(
        [t for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point()]
    )


def _meta_loss(step: Callable[..., Any], keys: tuple[str, ...], create_graph: bool) -> Callable:
    """The inner step: the loss of the swapped forward after one gradient step on ``keys``."""

    def meta_loss(flat: dict[str, torch.Tensor], *inputs: Any) -> torch.Tensor:
        loss = _loss(step(flat, *inputs))
        wrt = [flat[key] for key in keys]
        grads = torch.autograd.grad(loss, wrt, create_graph=create_graph, allow_unused=True)
        adapted = dict(flat)
        for key, value, grad in zip(keys, wrt, grads):
            if grad is not None:
                adapted[key] = value - INNER_LR * grad
        return _loss(step(adapted, *inputs))

    return meta_loss


def _meta_grads(fn: Callable, flat: dict[str, torch.Tensor], keys: tuple, args: tuple) -> dict:
    copy = {key: _compare.copy_set(value) for key, value in flat.items()}
    grads = torch.autograd.grad(fn(copy, *args), [copy[k] for k in keys], allow_unused=True)
    return dict(zip(keys, grads))


def check(
    step: Callable[..., Any],
    sets: list[Any],
    args: tuple[Any, ...],
    backends: Sequence[Backend],
    atol: float | None,
    rtol: float | None,
) -> None:
    """Raises ``ParityError`` where a compiled inner step's meta-gradient is not eager's."""
    for i, params in enumerate(sets):
        flat = dict(flat_items(params))
        keys = tuple(key for key, _ in _compare.requiring_grad(params))
        if not keys:
            raise ValueError(
                f"check_swap_parity(order=2): param set {i} has no value that requires grad; "
                "second-order gradients are taken with respect to those."
            )
        eager = _meta_grads(_meta_loss(step, keys, True), flat, keys, args)
        first = _meta_grads(_meta_loss(step, keys, False), flat, keys, args)
        for backend in backends:
            name = backend_name(backend)
            torch._dynamo.reset()
            compiled = torch.compile(_meta_loss(step, keys, True), backend=backend)
            try:
                got = _meta_grads(compiled, flat, keys, args)
            except Exception as exc:
                raise ParityError(
                    Failure.ERROR,
                    f"param set {i}: the compiled inner step (autograd.grad with "
                    f"create_graph=True inside) raised, not eagerly: {type(exc).__name__}: {exc}",
                    backend=name,
                    set_index=i,
                ) from exc
            _compare_meta(got, eager, first, name, i, atol, rtol)


def _compare_meta(
    got: dict, eager: dict, first: dict, name: str, i: int, atol: float | None, rtol: float | None
) -> None:
    for key in eager:
        path = f"meta-gradient of `{key}`"
        bad = _compare.compare(path, got[key], eager[key], atol, rtol)
        if bad is None:
            continue
        if _compare.compare(path, got[key], first[key], atol, rtol) is None:
            raise ParityError(
                Failure.FIRST_ORDER,
                f"param set {i}: the {path} is the first-order (FOMAML) one: the compiled "
                f"inner step silently dropped the second-order term (pytorch/pytorch#181581; "
                f"largest abs difference from eager {bad.max_abs_diff:.3g}). Compile the inner "
                f"step with backend='eager', or compile only the forward and take the "
                f"gradients outside on the eager backend (docs/guides/maml.md).",
                backend=name,
                set_index=i,
                mismatch=bad,
            )
        raise ParityError(
            Failure.MISMATCH,
            f"param set {i}: the {path} differs from eager, largest abs difference "
            f"{bad.max_abs_diff:.3g}\n{bad.detail}",
            backend=name,
            set_index=i,
            mismatch=bad,
        )
