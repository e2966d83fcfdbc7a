"""The gpu suite's model, parameter sets, compiled cells and counters (see ``gpu``).

Every cell is ``f(x, p)`` compiled with inductor (``fullgraph=True``) on a code object of
its own (``_harness.fresh``), so that its Dynamo cache entries are its own: one entry proves
it compiled, each entry beyond the first is a recompile.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import fcall

from . import _harness as h

Cell = Callable[[torch.Tensor, Any], torch.Tensor]
BATCH = 64  # rows of x


def mlp(width: int, layers: int, device: torch.device) -> nn.Sequential:
    """``layers`` x ``Linear(width, width)`` with a ``Tanh`` after each (two leaves a layer),
    holding ``values(..., seed=0)``: a deep stack whose activations stay of order one, so
    that comparing outputs against eager means something."""
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.Tanh()]
    model = nn.Sequential(*blocks).to(device)
    model.load_state_dict(h.flat(values(model, 0)))
    return model


def values(model: nn.Module, seed: int) -> Any:
    """A parameter set of ``model`` (a TensorDict of plain tensors on its device): weights
    ``N(0, 1 / fan_in)``, biases ``N(0, 0.01)``, drawn from ``seed``."""
    td = fcall.from_module(model).detach().clone()
    generator = torch.Generator().manual_seed(seed)
    for _, leaf in td.items(True, True):
        scale = 1 / math.sqrt(leaf.shape[-1]) if leaf.dim() == 2 else 0.1
        leaf.copy_(torch.randn(leaf.shape, generator=generator) * scale)
    return td


def eager_outputs(model: nn.Module, sets: list[Any], x: torch.Tensor) -> list[torch.Tensor]:
    """Each set's output from an eager copy of ``model`` that loaded it (``load_state_dict``):
    a reference that neither fcall nor torch.func computes."""
    reference = copy.deepcopy(model)
    outputs = []
    with torch.no_grad():
        for td in sets:
            reference.load_state_dict(h.flat(td))
            outputs.append(reference(x).clone())
    return outputs


def bodies(model: nn.Module) -> dict[str, Cell]:
    """What a user compiles, per API; ``model`` is a closure's free variable."""

    def model_alone(x: torch.Tensor, p: Any) -> torch.Tensor:
        return model(x)

    def swap(x: torch.Tensor, p: Any) -> torch.Tensor:
        with fcall.swap(p, model):
            return model(x)

    def to_module(x: torch.Tensor, p: Any) -> torch.Tensor:
        with fcall.to_module(p, model):
            return model(x)

    def functional_call(x: torch.Tensor, p: Any) -> torch.Tensor:
        return fcall.functional_call(model, p, (x,))

    def torch_func(x: torch.Tensor, p: Any) -> torch.Tensor:
        return torch.func.functional_call(model, p, (x,))

    return {
        "model": model_alone,
        "swap": swap,
        "to_module": to_module,
        "functional_call": functional_call,
        "torch.func": torch_func,
    }


def compiled(model: nn.Module, cell: str, body: str, mode: str | None) -> tuple[Cell, Cell]:
    """``(the compiled cell, the function it compiles)``: inductor, ``fullgraph=True``,
    ``mode`` (``"reduce-overhead"``: CUDA graphs) or the default."""
    name = "f_" + "".join(c if c.isalnum() else "_" for c in cell)
    fn = h.fresh(bodies(model)[body], name)
    return torch.compile(fn, backend="inductor", fullgraph=True, mode=mode), fn


def graphs(fn: Cell) -> int:
    """Dynamo's cache entries for ``fn``'s code object: 1 once it compiled, one more per
    recompile."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return len(_debug_get_cache_entry_list(fn.__code__))


def holding(td: Any, container: str) -> Any:
    """The set ``td`` as a cell takes it: ``td`` (a TensorDict), ``flat`` (a dict of
    dotted names), ``tdp`` (an ``fcall.TensorDictParams``: a Parameter per leaf)."""
    if container == "flat":
        return h.flat(td)
    if container == "tdp":
        return fcall.TensorDictParams(td.clone())
    return td


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def allocated(device: torch.device) -> int | None:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else None


def recordings(device: torch.device) -> int | None:
    """CUDA graphs recorded on ``device`` so far: the nodes of the cudagraph tree manager
    (``torch._inductor.cudagraph_trees``: ``CUDAGraphTreeManager.roots`` and each
    ``CUDAGraphNode.children``, one node per recording, re-recordings included; the same
    layout in torch 2.11 and 2.13). Inductor keeps no counter of recordings; it counts the
    non-static inputs of each (``counters["inductor"]["cudagraph_recorded_non_static_inputs"]``,
    see ``inductor_counts``). ``None`` off CUDA."""
    if device.type != "cuda":
        return None
    from torch._inductor import cudagraph_trees

    index = device.index if device.index is not None else torch.cuda.current_device()
    manager = cudagraph_trees.get_manager(index, create_if_none_exists=False)
    if manager is None or manager.roots is None:
        return 0
    nodes = [node for roots in manager.roots.values() for node in roots]
    count = 0
    while nodes:
        node = nodes.pop()
        count += 1
        nodes += [child for children in node.children.values() for child in children]
    return count


def inductor_counts() -> dict[str, int]:
    """What inductor counted so far (``torch._dynamo.utils.counters``, in torch 2.11 and
    2.13): the non-static inputs of every CUDA graph recorded (each is copied into the
    graph's own buffer on every replay of that recording: cudagraph trees'
    ``_copy_inputs_and_remove_from_src``), the functions that ran without CUDA graphs
    (``cudagraph_skips``: a CPU graph, too many re-recordings, a mutated input) and the
    graphs Dynamo made (``stats.unique_graphs``)."""
    counters = torch._dynamo.utils.counters
    return {
        "copied inputs": counters["inductor"]["cudagraph_recorded_non_static_inputs"],
        "cudagraph skips": counters["inductor"]["cudagraph_skips"],
        "dynamo graphs": counters["stats"]["unique_graphs"],
    }


def error(exc: BaseException) -> str:
    """A failure as a table cell: its type and first three lines."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {' | '.join(lines[:3])}"[:300]


def mib(nbytes: float | None) -> float | str:
    return "n/a" if nbytes is None else nbytes / 2**20


def cycling(fn: Cell, x: torch.Tensor, held: list[Any]) -> Callable[[], None]:
    """A call per call of the result, through the sets of ``held`` in turn, each a new
    CUDA graph step (``cudagraph_mark_step_begin``; a no-op's cost off CUDA)."""
    state = [0]

    def call() -> None:
        torch.compiler.cudagraph_mark_step_begin()
        fn(x, held[state[0] % len(held)])
        state[0] += 1

    return call


def check_cycles(
    fn: Cell,
    x: torch.Tensor,
    held: list[Any],
    refs: list[torch.Tensor],
    cycles: int,
    device: torch.device,
    tolerance: dict[str, float],
) -> dict[str, Any]:
    """``cycles`` cycles through the sets of ``held``, each output cloned at once (a later
    replay overwrites it) and checked against ``refs``: the mismatches, the largest error,
    the CUDA graphs recorded (``None`` off CUDA) and their copied inputs, the skips, Dynamo
    graphs made, and memory (MiB, KiB; ``n/a`` off CUDA)."""
    counts, recorded = inductor_counts(), recordings(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start, after_first = allocated(device), None
    mismatches, worst, first_failure = 0, 0.0, ""
    with torch.no_grad():
        for cycle in range(cycles):
            for params, ref in zip(held, refs):
                torch.compiler.cudagraph_mark_step_begin()
                out = fn(x, params).clone()
                worst = max(worst, (out - ref).abs().max().item())
                try:
                    torch.testing.assert_close(out, ref, **tolerance)
                except AssertionError as exc:
                    mismatches += 1
                    first_failure = first_failure or error(exc)
                del out
            if cycle == 0:
                synchronize(device)
                after_first = allocated(device)
    synchronize(device)
    end, now, new = allocated(device), inductor_counts(), recordings(device)
    row: dict[str, Any] = {
        "calls": cycles * len(held),
        "mismatches": mismatches,
        "max err": worst,
        "new recordings": None if new is None or recorded is None else new - recorded,
        "copied inputs": now["copied inputs"] - counts["copied inputs"],
        "cudagraph skips": now["cudagraph skips"] - counts["cudagraph skips"],
        "dynamo graphs": now["dynamo graphs"] - counts["dynamo graphs"],
    }
    if first_failure:
        row["first mismatch"] = first_failure
    if start is None or after_first is None or end is None:
        return {**row, "first cycle MiB": "n/a", "growth / cycle KiB": "n/a", "peak MiB": "n/a"}
    return {
        **row,
        "first cycle MiB": mib(after_first - start),
        "growth / cycle KiB": (end - after_first) / max(1, cycles - 1) / 2**10,
        "peak MiB": mib(torch.cuda.max_memory_allocated(device) - start),
    }
