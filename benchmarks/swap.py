"""What the matrix does not measure: per leaf beside tensordict and a floor, the compiled
overhead outside the graph, recompiles of a compiled model, a swap's peak memory.

    python -m benchmarks swap                      # every section
    python -m benchmarks swap --sections overhead --leaves 100
    python -m benchmarks swap --quick              # small sizes, few rounds

Sections:

1. ``eager``: swap + restore of Parameter values (a nested TensorDict; torch.func: a flat
   dict), no forward, per leaf: ``fcall.swap``, ``fcall.to_module``, tensordict's
   ``to_module``, torch.func's machinery (``_reparametrize_module``) and the floor, a loop
   of precomputed ``owner._parameters[name] = value`` writes; ratios to torch.func and to
   the floor, each paired with the batch of its peer beside it.
2. ``overhead``: ``f(x, p)`` compiled (``eager`` backend, ``fullgraph=True``) around a
   model whose ``forward`` reads no parameter, so what is timed is the guards and the
   bytecode around the graph (``OVERHEAD_CELLS``), each paired with torch.func's machinery
   with a flat dict and ``tie_weights=True`` (as ``torch.func.functional_call`` calls it).
3. ``recompiles``: ``torch.compile(model)``, swaps outside it, 5 sets: graphs made.
4. ``memory``: peak RSS growth of one swap of a 1 GiB set (``--quick``: 64 MiB), Linux.
"""

from __future__ import annotations

import argparse
import gc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict
from torch import nn
from torch.nn.utils.stateless import _reparametrize_module

import fcall

from . import _harness as h


def eager_cells(model: nn.Module) -> dict[str, h.Fn]:
    td = fcall.from_module(model).detach().clone().requires_grad_().apply(nn.Parameter)
    params = h.flat(td)
    slots = []
    for name in params:
        owner, _, leaf = name.rpartition(".")
        slots.append((model.get_submodule(owner)._parameters, leaf, params[name]))

    def floor() -> None:
        old = []
        for slot, name, value in slots:
            old.append(slot[name])
            slot[name] = value
        for (slot, name, _), value in zip(slots, old):
            slot[name] = value

    def entered(make: Callable[[], Any]) -> h.Fn:
        def run() -> None:
            with make():
                pass

        return run

    return {
        "fcall.swap": entered(lambda: fcall.swap(td, model)),
        "fcall.to_module": entered(lambda: fcall.to_module(td, model)),
        "tensordict": entered(lambda: td.to_module(model)),
        "torch.func": entered(lambda: _reparametrize_module(model, params)),
        "floor": floor,
    }


EAGER_RATIOS = [
    (api, peer) for peer in ("torch.func", "floor") for api in ("fcall.swap", "fcall.to_module")
]


def eager(sizes: list[int], rounds: int) -> dict[str, dict]:
    per_leaf, ratios = {}, {}
    for leaves in sizes:
        fns = eager_cells(h.Chain(leaves))
        h.warm(fns["fcall.swap"], 2)
        h.warm(fns["fcall.to_module"], 2)
        times, _ = h.rounds_of(fns, rounds, max(3, 20_000 // leaves))
        per_leaf[str(leaves)] = {name: h.median(t) / leaves * 1e6 for name, t in times.items()}
        ratios[str(leaves)] = {
            f"{api} / {peer}": h.paired(times[api], times[peer]) for api, peer in EAGER_RATIOS
        }
        print(f"{leaves:>7} leaves, µs per leaf: {per_leaf[str(leaves)]}")
        print(f"{'':>7} ratios: {ratios[str(leaves)]}")
    return {"eager µs per leaf": per_leaf, "eager ratios": ratios}


@dataclass(frozen=True)
class Overhead:
    """A compiled cell: what it does with ``p`` (``model`` in scope), and ``p``'s kind."""

    name: str
    body: Callable[[nn.Module, Any, torch.Tensor], torch.Tensor]
    params: str  # "flat" or "nested"


def _swapped(swap: Callable[[Any, nn.Module], Any]) -> Callable:
    def body(model: nn.Module, p: Any, x: torch.Tensor) -> torch.Tensor:
        with swap(p, model):
            return model(x)

    return body


def _count_nested(entries: dict) -> int:
    return sum(
        _count_nested(v._tensordict) if isinstance(v, TensorDict) else 1 for v in entries.values()
    )


OVERHEAD_PEER = "torch.func machinery, flat dict"
OVERHEAD_CELLS = [
    Overhead(
        OVERHEAD_PEER, _swapped(lambda p, m: _reparametrize_module(m, p, tie_weights=True)), "flat"
    ),
    Overhead("nothing", lambda m, p, x: x * 2, "flat"),
    Overhead(
        "walk a flat dict",
        lambda m, p, x: x * len([v for v in p.values() if v is not None]),
        "flat",
    ),
    Overhead(
        "walk a nested TensorDict", lambda m, p, x: x * _count_nested(p._tensordict), "nested"
    ),
    Overhead("fcall.swap, flat dict", _swapped(fcall.swap), "flat"),
    Overhead("fcall.swap, nested TensorDict", _swapped(fcall.swap), "nested"),
    Overhead(
        "torch.func, flat, tie_weights=False",
        _swapped(lambda p, m: _reparametrize_module(m, p, tie_weights=False)),
        "flat",
    ),
    Overhead(
        "fcall.swap, nested, tie_weights=False",
        _swapped(lambda p, m: fcall.swap(p, m, tie_weights=False)),
        "nested",
    ),
]


def _call(body: Callable, model: nn.Module) -> Callable:
    def call(x, p):
        return body(model, p, x)

    return call


def overhead(leaves: int, rounds: int) -> dict[str, dict]:
    model = h.Chain(leaves, reads=False)
    nested = fcall.from_module(model).detach().clone()
    params = {"nested": nested, "flat": h.flat(nested)}
    x = torch.randn(8, 4)
    calls = {}
    with torch.no_grad():
        for index, cell in enumerate(OVERHEAD_CELLS):
            call = h.fresh(_call(cell.body, model), f"overhead_{index}")
            fn = torch.compile(call, backend="eager", fullgraph=True)
            calls[cell.name] = lambda fn=fn, p=params[cell.params]: fn(x, p)
            calls[cell.name]()
        peer_of = lambda name: OVERHEAD_PEER  # noqa: E731
        times, beside = h.rounds_of(calls, rounds, 20, peer_of)
    row = {}
    for name, samples in times.items():
        ratio = h.paired(samples, beside[name]) if name in beside else 1.0
        row[name] = {"µs per call": h.median(samples) * 1e6, "ratio": ratio}
    h.print_rows(f"compiled, {leaves} leaves, forward reads nothing", row, row[OVERHEAD_PEER])
    return {f"compiled overhead, {leaves} leaves": row}


def recompiles(leaves: int = 100, sets: int = 5) -> dict[str, dict]:
    """``fcall.swap`` puts values in as they are, so its sets are Parameters (a plain
    tensor where the model has a Parameter is a new guard); ``fcall.to_module`` keeps the
    registration, so plain tensors are fine there."""
    from torch._dynamo.testing import CompileCounterWithBackend

    row: dict[str, dict] = {}
    x = torch.randn(8, 4)
    for name, swap, as_parameters in [
        ("fcall.swap, Parameter sets", fcall.swap, True),
        ("fcall.to_module, plain tensor sets", fcall.to_module, False),
    ]:
        torch._dynamo.reset()
        model = h.Chain(leaves)
        counter = CompileCounterWithBackend("eager")
        compiled = torch.compile(model, backend=counter, fullgraph=True)
        for _ in range(sets):
            params = fcall.from_module(model).detach().clone().apply(lambda t: t.normal_())
            with swap(params.apply(nn.Parameter) if as_parameters else params, compiled):
                compiled(x)
        row[name] = {"sets": sets, "graphs": counter.frame_count}
        print(f"  {name:<36} graphs over {sets} sets: {counter.frame_count}")
    torch._dynamo.reset()
    return {f"torch.compile(model), swaps outside, {leaves} leaves": row}


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    raise RuntimeError(field)


def memory(gib: float) -> dict[str, dict]:
    """Peak RSS growth during one swap with a set of ``gib`` GiB."""
    side = 8192 if gib >= 0.25 else 1024
    layers = max(1, round(gib * 2**30 / (side * side * 4)))
    model = nn.Sequential(*[nn.Linear(side, side, bias=False) for _ in range(layers)])
    params = fcall.from_module(model).detach().clone()
    row: dict[str, Any] = {"set, MiB": sum(t.nbytes for t in params.values(True, True)) / 2**20}
    for name, enter in {
        "fcall.swap": lambda: fcall.swap(params, model),
        "fcall.to_module": lambda: fcall.to_module(params, model),
        "fcall.to_module(inplace=True)": lambda: fcall.to_module(params, model, inplace=True),
    }.items():
        gc.collect()
        Path("/proc/self/clear_refs").write_text("5")  # the peak := the current RSS
        before = _rss_kib("VmRSS")
        with enter():
            pass
        row[name] = (_rss_kib("VmHWM") - before) / 1024
        print(f"  {name:<32} peak growth {row[name]:>8.1f} MiB for a {row['set, MiB']:.0f} MiB set")
    return {"peak growth of one swap, MiB": row}


SECTIONS = ("eager", "overhead", "recompiles", "memory")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--leaves", type=int, help="overhead: leaves (default 1,000; quick 20)")


def run(args: argparse.Namespace, record: h.Recorder) -> None:
    quick, sections = args.quick, args.sections.split(",")
    rounds = 3 if args.quick else 21
    work = {
        "eager": lambda: eager([10, 100] if quick else [10, 100, 1000, 10_000], rounds),
        "overhead": lambda: overhead(args.leaves or (20 if quick else 1000), rounds),
        "recompiles": lambda: recompiles(10 if quick else 100),
        "memory": lambda: memory(1 / 16 if quick else 1.0),
    }
    for section in sections:
        record.results.update(work[section]())
        record.save()
