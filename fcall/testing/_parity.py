"""``check_swap_parity``: a model with the user's param sets, compiled and eager, compared."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch._dynamo
import torch.utils._pytree as pytree
from torch import nn

import fcall

from . import _compare, _second_order
from ._backend import Backend, CountingBackend, backend_name
from ._breaks import GraphBreak, count_breaks, from_unsupported
from ._layout import Layout, flat_items
from ._recompiles import Recompile, record_recompiles
from ._report import (
    BackendReport,
    Failure,
    ParityError,
    ParityReport,
    recompile_error,
    recompile_of,
)

APIS = ("swap", "to_module", "functional_call")
_SEED = 0


def _make_step(api: str, model: nn.Module) -> Callable[..., Any]:
    """The swap-and-call: params are an argument, so a new set reuses the compiled code."""
    if api == "swap":

        def step(params: Any, *inputs: Any) -> Any:
            with fcall.swap(params, model):
                return model(*inputs)

    elif api == "to_module":

        def step(params: Any, *inputs: Any) -> Any:
            with fcall.to_module(params, model):
                return model(*inputs)

    else:

        def step(params: Any, *inputs: Any) -> Any:
            return fcall.functional_call(model, params, inputs)

    return step


@dataclasses.dataclass
class _Result:
    """One call's outcome: output, gradients, the set's values after, and the module's own
    values that differ from before the first call (BatchNorm's stats when the set lacks
    them)."""

    out: Any
    grads: dict[str, torch.Tensor | None]
    set_after: dict[str, torch.Tensor]
    module_changed: dict[str, torch.Tensor]


def _run(
    step: Callable[..., Any],
    params: Any,
    inputs: tuple[Any, ...],
    model: nn.Module,
    grad: bool,
    initial: dict[str, torch.Tensor],
) -> _Result:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_SEED)
        out = step(params, *inputs)
    g = _compare.grads(out, params) if grad else {}
    out = pytree.tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, out)
    after = {k: v.detach().clone() for k, v in flat_items(params)}
    changed = _compare.changed_values(_compare.module_slots(model), initial)
    return _Result(out, g, after, changed)


def check_swap_parity(
    model: nn.Module,
    param_sets: Iterable[Any],
    inputs: Any,
    *,
    api: str = "swap",
    backends: Sequence[Backend] = ("eager", "aot_eager", "inductor"),
    fullgraph: bool = True,
    max_graph_breaks: int = 0,
    max_recompiles: int = 0,
    check_grads: bool = True,
    atol: float | None = None,
    rtol: float | None = None,
    order: int = 1,
) -> ParityReport:
    """Checks that swapping each param set into ``model`` compiles once and matches eager.

    For each backend (a name, or a ``torch.compile`` backend callable) Dynamo is reset and
    ``step(params, *inputs)``, which swaps ``params`` into ``model`` with ``api`` and calls
    it, is compiled and called with every set in turn. Checked against eager, set by set:
    the output (by pytree path), the gradients of a weighted sum of the outputs (fixed
    weights, ``loss_weights``: a plain sum after a train-mode BatchNorm has no gradient but
    rounding noise) w.r.t. the set's
    values that require grad, the set's values and the module's buffers after the call
    (what a train-mode forward updates, BatchNorm's running stats), and, at the end, that
    the module holds the very objects it held before. Graphs are counted: a graph break
    (``fullgraph=True``) or more than ``max_graph_breaks`` breaks (``fullgraph=False``),
    more than ``max_recompiles`` sets that compile anything new, or a call that ran no
    compiled graph (Dynamo's silent eager fallback) fails.

    Args:
        model: the module to swap into.
        param_sets: the sets: TensorDicts, TensorDictParams or dicts (nested or flat).
        inputs: the positional arguments of ``model`` (a tuple), or its one argument.
        api: ``"swap"``, ``"to_module"`` or ``"functional_call"``.
        backends: names (``"eager"``, ``"aot_eager"``, ``"inductor"``) or callables.
        fullgraph: compile with ``fullgraph=True``: any graph break fails.
        max_graph_breaks: with ``fullgraph=False``, how many breaks pass.
        max_recompiles: how many sets may compile something new.
        check_grads: compare gradients (when some value of a set requires grad).
        atol: absolute tolerance of ``torch.testing.assert_close`` (its per-dtype
            default when both are ``None``; give one and the other is 0).
        rtol: relative tolerance, likewise.
        order: ``2`` also checks second-order gradients as MAML computes them: per backend,
            the inner step (the swapped forward, ``autograd.grad(..., create_graph=True)``
            of its loss, the values moved one step, the swapped forward again) is compiled
            as one function (``fullgraph=False``: ``autograd.grad`` breaks the graph), and
            the gradient of its loss w.r.t. the values that require grad is compared with
            eager's. A compiled result that is the first-order (FOMAML) one fails as
            ``Failure.FIRST_ORDER`` (AOTAutograd backends drop the term silently).

    Returns:
        A ``ParityReport`` (per backend: graphs, breaks, recompiles, largest difference).

    Raises:
        ParityError: an ``AssertionError`` that says in parameter keys what recompiled
            (``1 param float32→float64, `0.weight```), where the graph broke (the user's
            file and line, Dynamo's reason) or which value differs (the backend, the
            output or gradient path, the largest absolute difference).
        ValueError: an unknown ``api``, no backend, no param set, ``max_graph_breaks``
            with ``fullgraph=True``, an ``order`` other than 1 or 2, or ``order=2`` with a
            set of which no value requires grad.

    Example:
        >>> import torch, fcall
        >>> from fcall.testing import check_swap_parity
        >>> model = torch.nn.Linear(3, 2)
        >>> sets = [fcall.from_module(model).apply(torch.randn_like) for _ in range(3)]
        >>> print(check_swap_parity(model, sets, torch.ones(3), backends=["eager"]))
        swap parity (swap, 3 param set(s)): OK
          eager: 1 graph(s), 0 break(s), 0 recompile(s), max |compiled - eager| = 0
    """
    sets = list(param_sets)
    _check_arguments(api, order, sets, backends, fullgraph, max_graph_breaks)
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    if (atol is None) != (rtol is None):
        atol, rtol = atol or 0.0, rtol or 0.0
    step = _make_step(api, model)
    slots = _compare.module_slots(model)
    initial = _compare.values_of(slots)
    eager = [_run(step, _compare.copy_set(p), args, model, check_grads, initial) for p in sets]
    after = _compare.module_slots(model)
    # to_module registers the names it writes again, as tensordict's: eager's order is the
    # reference for the compiled runs; swap and functional_call keep the module's own
    registered = [slot.path for slot in after] if api == "to_module" else None
    problem = _compare.restore_problem(slots, after, registered)
    if problem is not None:
        raise ParityError(Failure.RESTORE, f"eager, after the swaps: {problem}")
    breaks: list[GraphBreak] = []
    if not fullgraph:
        _compare.put_values(slots, initial)
        breaks = _graph_breaks(step, (_compare.copy_set(sets[0]), *args), max_graph_breaks)
    reports = []
    try:
        for backend in backends:
            _compare.put_values(slots, initial)
            checker = _Checker(
                model, step, sets, args, eager, slots, registered, initial, check_grads, atol, rtol
            )
            limit = max(torch._dynamo.config.recompile_limit, max_recompiles + 2)
            with torch._dynamo.config.patch(recompile_limit=limit):
                reports.append(checker.run(backend, fullgraph, max_recompiles, tuple(breaks)))
        if order == 2:
            _compare.put_values(slots, initial)
            _second_order.check(step, sets, args, backends, atol, rtol)
    finally:
        torch._dynamo.reset()
        _compare.put_values(slots, {**initial, **eager[-1].module_changed})
    return ParityReport(api, len(sets), tuple(reports))


def _check_arguments(
    api: str,
    order: int,
    sets: list[Any],
    backends: Sequence[Backend],
    fullgraph: bool,
    max_graph_breaks: int,
) -> None:
    """``check_swap_parity``'s arguments, or a ``ValueError`` naming the one that is wrong."""
    if api not in APIS:
        raise ValueError(f"check_swap_parity: api must be one of {APIS}, got {api!r}.")
    if order not in (1, 2):
        raise ValueError(f"check_swap_parity: order must be 1 or 2, got {order!r}.")
    if not sets:
        raise ValueError("check_swap_parity: param_sets is empty; give at least one set.")
    if not backends or isinstance(backends, str):
        raise ValueError(
            f"check_swap_parity: backends must be a non-empty sequence, got {backends!r}."
        )
    if fullgraph and max_graph_breaks:
        raise ValueError(
            f"check_swap_parity: max_graph_breaks={max_graph_breaks} needs fullgraph=False "
            "(with fullgraph=True any graph break fails)."
        )


def _graph_breaks(step: Callable[..., Any], args: tuple, max_graph_breaks: int) -> list[GraphBreak]:
    """The graph breaks of ``step(*args)``; a ``ParityError`` if there are more than allowed."""
    breaks = count_breaks(step, args)
    if len(breaks) > max_graph_breaks:
        listed = "\n".join(f"  {b}" for b in breaks)
        raise ParityError(
            Failure.GRAPH_BREAK,
            f"{len(breaks)} graph break(s), max_graph_breaks={max_graph_breaks}:\n{listed}",
            graph_break=breaks[0],
        )
    return breaks


@dataclasses.dataclass
class _Checker:
    model: nn.Module
    step: Callable[..., Any]
    sets: list[Any]
    args: tuple[Any, ...]
    eager: list[_Result]
    slots: list[_compare.Slot]
    order: list[str] | None  # to_module: the order eager left (restore_problem)
    initial: dict[str, torch.Tensor]
    check_grads: bool
    atol: float | None
    rtol: float | None

    def run(
        self, backend: Backend, fullgraph: bool, max_recompiles: int, breaks: tuple[GraphBreak, ...]
    ) -> BackendReport:
        name = backend_name(backend)
        torch._dynamo.reset()
        counter = CountingBackend(backend)
        compiled = torch.compile(self.step, backend=counter, fullgraph=fullgraph)
        layouts = [Layout.of(p) for p in self.sets]
        recompiles: list[Recompile] = []
        first_graphs, worst = 0, 0.0
        for i, params in enumerate(self.sets):
            graphs, runs = counter.graphs, counter.runs
            with record_recompiles(layouts[i].leaves) as log:
                got = self._call(compiled, params, name, i)
            if i == 0:
                first_graphs = counter.graphs
            elif counter.graphs > graphs or log.recompiles:
                recompiles.append(recompile_of(log.recompiles, i, layouts))
                if len(recompiles) > max_recompiles:
                    raise recompile_error(recompiles, max_recompiles, len(self.sets), name)
            if counter.runs == runs:
                raise ParityError(
                    Failure.EAGER_FALLBACK,
                    f"param set {i} ran no compiled graph: Dynamo gave up on the swapped call "
                    "and ran it eagerly (recompile limit, or a frame it skips).",
                    backend=name,
                    set_index=i,
                )
            worst = max(worst, self._compare(got, self.eager[i], name, i))
        after = _compare.module_slots(self.model)
        problem = _compare.restore_problem(self.slots, after, self.order)
        if problem is not None:
            raise ParityError(Failure.RESTORE, f"after the swaps: {problem}", backend=name)
        return BackendReport(name, first_graphs, breaks, tuple(recompiles), worst)

    def _call(self, compiled: Callable[..., Any], params: Any, name: str, i: int) -> _Result:
        try:
            params = _compare.copy_set(params)
            return _run(compiled, params, self.args, self.model, self.check_grads, self.initial)
        except torch._dynamo.exc.Unsupported as exc:
            if isinstance(exc, torch._dynamo.exc.FailOnRecompileLimitHit):
                raise ParityError(
                    Failure.RECOMPILE,
                    f"param set {i} hit Dynamo's recompile limit: {exc}",
                    backend=name,
                    set_index=i,
                ) from None
            brk = from_unsupported(exc)
            raise ParityError(
                Failure.GRAPH_BREAK,
                f"graph break (fullgraph=True) with param set {i} at {brk}",
                backend=name,
                set_index=i,
                graph_break=brk,
            ) from None
        except Exception as exc:
            raise ParityError(
                Failure.ERROR,
                f"param set {i} raised compiled, not eagerly: {type(exc).__name__}: {exc}",
                backend=name,
                set_index=i,
            ) from exc

    def _compare(self, got: _Result, ref: _Result, name: str, i: int) -> float:
        pairs: list[tuple[str, Any, Any]] = [("output", got.out, ref.out)]
        if self.check_grads:
            if got.grads.keys() != ref.grads.keys():
                detail = f"gradients for {sorted(got.grads)} vs eager's {sorted(ref.grads)}"
                raise ParityError(Failure.MISMATCH, detail, backend=name, set_index=i)
            pairs += [(f"grad of `{k}`", got.grads[k], ref.grads[k]) for k in ref.grads]
        after = ref.set_after.items()
        pairs += [(f"value of `{k}` after the call", got.set_after[k], v) for k, v in after]
        for k in {**ref.module_changed, **got.module_changed}:
            pairs.append(
                (
                    f"module's own `{k}` after the call",
                    got.module_changed.get(k, self.initial[k]),
                    ref.module_changed.get(k, self.initial[k]),
                )
            )
        worst = 0.0
        for path, g, e in pairs:
            bad = _compare.compare(path, g, e, self.atol, self.rtol)
            if bad is not None:
                most = bad.max_abs_diff
                diff = "" if math.isnan(most) else f", largest abs difference {most:.3g}"
                raise ParityError(
                    Failure.MISMATCH,
                    f"differs from eager on param set {i} at {bad.path}{diff}\n{bad.detail}",
                    backend=name,
                    set_index=i,
                    mismatch=bad,
                )
            worst = max(worst, _largest(g, e))
        return worst


def _largest(got: Any, expected: Any) -> float:
    pairs = zip(pytree.tree_leaves(got), pytree.tree_leaves(expected))
    diffs = [
        _compare._max_abs_diff(g, e)
        for g, e in pairs
        if isinstance(g, torch.Tensor) and isinstance(e, torch.Tensor) and e.is_floating_point()
    ]
    return max([d for d in diffs if not math.isnan(d)], default=0.0)
