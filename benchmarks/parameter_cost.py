"""What a Parameter per leaf costs: `to_module` with plain tensors, beside its peers.

`fcall.to_module(p, m)` keeps `preserve_module_state=True`'s promise: a plain tensor bound
for a parameter slot goes in as an `nn.Parameter` (with the old one's `requires_grad`), a new
one per block. This script shows, in one run, what that promise costs and why neither a
cache of wrappers (eager) nor another representation (compiled) removes it.

    python -m benchmarks parameter_cost                  # eager 100/1,000/10,000, compiled 100
    python -m benchmarks parameter_cost --sections eager --sizes 1000

Eager, per leaf, ratio to torch.func's machinery (`_reparametrize_module`, swap and restore
of a flat dict of the same plain tensors):

- `fcall.swap` (values go in as they are) and `fcall.to_module` with Parameter values;
- `fcall.to_module` with plain tensors (a new Parameter per leaf);
- making the Parameters alone (`Tensor._make_subclass`, what `nn.Parameter` runs);
- the checks a cache of wrappers would need before reusing one, alone: the same values,
  nothing holds the wrapper (`sys.getrefcount`, `Tensor._use_count` for autograd graphs,
  `weakref.getweakrefcount`), no `.grad`, no hooks, no attribute, the `requires_grad` it was
  made with, still aliasing its value (`is_set_to`), each as a C loop over the leaves (`map`);
- a wrapper cache at best: the cached wrappers swapped in as they are (`fcall.swap`), then
  those checks; no lookup, no `.grad` reset, no miss.

Compiled (`fullgraph=True`, `f(x, p)` that swaps and calls, under `torch.no_grad()`), per
call, ratio to `torch.func.functional_call(m, p, (x,))` with the same plain tensors:

- `fcall.swap` and `fcall.to_module` with plain tensors;
- torch.func with the same promise: `functional_call(m, {k: nn.Parameter(v) ...}, (x,))`,
  the Parameters made inside the compiled function;
- and the first call of each (its compile), one each.

Dynamo builds `nn.Parameter(t)` of a graph input in Python before the graph on every call
(`_nn_param_via_prefix_insert`); for a tensor made in the graph it allocates a placeholder
Parameter per call (`create_parameter_op.new_parameter_placeholder`). Either way a Parameter
per leaf per call: the torch.func row with Parameters pays it as `to_module` does.
"""

from __future__ import annotations

import argparse
import operator
import sys
import weakref
from collections.abc import Callable

import torch
from torch import nn
from torch.nn.utils.stateless import _reparametrize_module

import fcall

from . import _harness as h

_make_subclass = torch.Tensor._make_subclass
chain = h.Chain


def plain_values(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: torch.randn_like(p) for name, p in model.named_parameters()}


def eager_cells(leaves: int) -> dict[str, Callable[[], object]]:
    """Each cell: a function that swaps and restores once (or does the part it names)."""
    models = {name: chain(leaves) for name in ("peer", "swap", "param", "plain", "cache")}
    flat = plain_values(models["peer"])
    values = list(flat.values())
    as_parameters = {k: nn.Parameter(v) for k, v in flat.items()}
    wrappers = [_make_subclass(nn.Parameter, v, True) for v in values]
    cached = dict(zip(flat, wrappers))
    checks = _reuse_checks(wrappers, values)  # every check passes: none stops early
    assert checks(), "a fresh wrapper must pass every check"

    def peer():
        with _reparametrize_module(models["peer"], flat):
            pass

    def swap():
        with fcall.swap(flat, models["swap"]):
            pass

    def to_module_parameters():
        with fcall.to_module(as_parameters, models["param"]):
            pass

    def to_module_plain():
        with fcall.to_module(flat, models["plain"]):
            pass

    def cache_at_best():  # the cached wrappers go in as they are, then the checks
        with fcall.swap(cached, models["cache"]):
            pass
        return checks()

    assert cache_at_best(), "a wrapper swapped in and out must pass every check"

    def make_parameters():
        return [_make_subclass(nn.Parameter, v, True) for v in values]

    return {
        "torch.func machinery (peer)": peer,
        "fcall.swap, plain": swap,
        "fcall.to_module, Parameter values": to_module_parameters,
        "fcall.to_module, plain (a Parameter each)": to_module_plain,
        "  making the Parameters alone": make_parameters,
        "  a wrapper cache's reuse checks alone": checks,
        "  a wrapper cache at best (swap + checks)": cache_at_best,
    }


def _reuse_checks(wrappers: list, values: list) -> Callable[[], bool]:
    """What reusing cached wrappers soundly would check per leaf, in C loops: that the
    values are the cached ones, and that each wrapper is as it was made."""
    grad = operator.attrgetter("grad")
    hooks = operator.attrgetter("_backward_hooks")
    post_hooks = operator.attrgetter("_post_accumulate_grad_hooks")
    requires_grad = operator.attrgetter("requires_grad")
    attributes = operator.attrgetter("__dict__")
    use_count = torch.Tensor._use_count
    refs = list(map(sys.getrefcount, wrappers))
    uses = list(map(use_count, wrappers))
    cached_values = list(values)
    nones, trues = [None] * len(wrappers), [True] * len(wrappers)
    zeros = [0] * len(wrappers)

    def checks() -> bool:
        return (
            all(map(operator.is_, values, cached_values))  # the values it wraps
            and list(map(sys.getrefcount, wrappers)) == refs  # nothing else holds it
            and list(map(use_count, wrappers)) == uses  # nor an autograd graph
            and list(map(weakref.getweakrefcount, wrappers)) == zeros  # nor a weak reference
            and list(map(grad, wrappers)) == nones
            and list(map(hooks, wrappers)) == nones
            and list(map(post_hooks, wrappers)) == nones
            and list(map(requires_grad, wrappers)) == trues
            and not any(map(attributes, wrappers))  # no attribute set on it
            and all(map(torch.Tensor.is_set_to, wrappers, values))  # still its value's alias
        )

    return checks


def compiled_cells(leaves: int, backend: str) -> dict[str, tuple[Callable, dict]]:
    cells = {}
    for name in ("peer", "peer_parameters", "swap", "to_module"):
        model = chain(leaves)
        cells[name] = (model, plain_values(model))

    def peer(x, p, m=cells["peer"][0]):
        return torch.func.functional_call(m, p, (x,))

    def peer_parameters(x, p, m=cells["peer_parameters"][0]):
        return torch.func.functional_call(m, {k: nn.Parameter(v) for k, v in p.items()}, (x,))

    def swap(x, p, m=cells["swap"][0]):
        with fcall.swap(p, m):
            return m(x)

    def to_module(x, p, m=cells["to_module"][0]):
        with fcall.to_module(p, m):
            return m(x)

    functions = {"peer": peer, "peer_parameters": peer_parameters, "swap": swap}
    functions["to_module"] = to_module
    labels = {
        "peer": "torch.func, plain (peer)",
        "peer_parameters": "torch.func, a Parameter each inside",
        "swap": "fcall.swap, plain",
        "to_module": "fcall.to_module, plain (a Parameter each)",
    }
    out = {}
    for name, fn in functions.items():
        compiled = torch.compile(fn, backend=backend, fullgraph=True)
        out[labels[name]] = (compiled, cells[name][1])
    return out


def timed_rounds(cells: dict[str, h.Fn], rounds: int, number: int, warm: int) -> dict:
    """Per cell: seconds per call (median) and the ratio to the first cell (the peer), each
    batch paired with the peer's batch beside it."""
    peer = next(iter(cells))
    for cell in cells.values():
        h.warm(cell, warm)  # plans, compiles
    times, beside = h.rounds_of(cells, rounds, number, lambda name: peer)
    return {
        name: (h.median(t), h.paired(t, beside[name]) if name in beside else 1.0)
        for name, t in times.items()
    }


def table(results: dict, per: int, unit: str) -> dict[str, dict[str, float]]:
    return {
        name: {f"ns/{unit}": seconds / per * 1e9, "ratio": ratio}
        for name, (seconds, ratio) in results.items()
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sections", default="eager,compiled")
    parser.add_argument("--sizes", help="eager leaves (default 100,1000,10000; quick 20)")
    parser.add_argument("--compiled-sizes", help="default 100 (quick: 10)")
    parser.add_argument("--backends", help="default aot_eager,inductor (quick: aot_eager)")
    parser.add_argument("--rounds", type=int, help="default 15 (quick: 3)")


def run(args: argparse.Namespace, record: h.Recorder) -> None:
    h.isolate_compiles()
    quick, results = args.quick, record.results
    rounds = args.rounds or (3 if quick else 15)
    if "eager" in args.sections:
        for leaves in map(int, (args.sizes or ("20" if quick else "100,1000,10000")).split(",")):
            timed = timed_rounds(eager_cells(leaves), rounds, max(2, 20_000 // leaves), warm=300)
            title = f"eager, {leaves} leaves, per leaf (swap and restore)"
            results[title] = table(timed, leaves, "leaf")
            h.print_rows(title, results[title], ("ns/leaf", "ratio"))
            record.save()
    if "compiled" not in args.sections:
        return
    x = torch.randn(8, 4)
    sizes = args.compiled_sizes or ("10" if quick else "100")
    for backend in (args.backends or ("aot_eager" if quick else "aot_eager,inductor")).split(","):
        for leaves in map(int, sizes.split(",")):
            torch._dynamo.reset()
            cells = compiled_cells(leaves, backend)
            calls = {name: _bound(fn, x, p) for name, (fn, p) in cells.items()}
            with torch.no_grad():
                first = {name: h.first_call(call)[0] for name, call in calls.items()}
                timed = timed_rounds(calls, rounds, 20, warm=3)
            title = f"compiled {backend}, {leaves} leaves, per call"
            results[title] = table(timed, 1, "call")
            peer_first = first[next(iter(first))]
            for name, seconds in first.items():  # one each, CPU seconds
                results[title][name] |= {
                    "compile s": seconds,
                    "compile ratio": seconds / peer_first,
                }
            h.print_rows(title, results[title], ("ns/call", "ratio", "compile s", "compile ratio"))
            record.save()


def _bound(fn: Callable, x: torch.Tensor, p: dict) -> h.Fn:
    return lambda: fn(x, p)
