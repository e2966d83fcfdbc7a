"""How much Python Dynamo traces to compile a swap: bytecode steps, per function.

Compile time of a swap is mostly Dynamo stepping through Python, and unlike a
wall-clock time the number of steps is the same on every run and machine:

    python -m benchmarks dynamo_steps            # 200 leaves (quick: 20)
    python -m benchmarks dynamo_steps --leaves 1000 --top 15

It compiles ``f(x, params)`` that swaps and calls an ``nn.Sequential`` of
``Linear(4, 4)`` (backend ``eager``: no code generation), once with
``torch.func.functional_call`` and a flat dict, once with ``fcall.swap`` and a
nested TensorDict, once with ``fcall.functional_call`` of a model whose last weight is tied to
its first (the generic path), and prints the steps of each and the functions that take the
most.
"""

from __future__ import annotations

import argparse
import collections
import time

import torch
from torch._dynamo import symbolic_convert

import fcall

from . import _harness as h

STEPS: collections.Counter = collections.Counter()
_step = symbolic_convert.InstructionTranslatorBase.step


def _counting_step(self: symbolic_convert.InstructionTranslatorBase) -> object:
    code = self.f_code
    STEPS[f"{code.co_filename.rpartition('site-packages/')[2]}:{code.co_name}"] += 1
    return _step(self)


def with_functional_call(model):
    return lambda x, p: torch.func.functional_call(model, p, (x,))


def with_fcall_swap(model):
    def call(x, p):
        with fcall.swap(p, model):
            return model(x)

    return call


def with_fcall_functional_call(model):
    return lambda x, p: fcall.functional_call(model, p, (x,))


# (name, the compiled function for a model, its params: "flat" dict or "nested" TensorDict;
# "tied": a flat dict for the model with its last weight tied to its first, which no Route
# covers: fcall's generic path, the builder traced)
CELLS = [
    ("torch.func.functional_call (flat dict)", with_functional_call, "flat"),
    ("fcall.swap (nested TensorDict)", with_fcall_swap, "nested"),
    ("fcall.functional_call (a tied pair: the generic path)", with_fcall_functional_call, "tied"),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--leaves", type=int, help="default 200 (quick: 20)")
    parser.add_argument("--top", type=int, default=8)


def run(args: argparse.Namespace, record: h.Recorder) -> None:
    leaves = args.leaves or (20 if args.quick else 200)
    model = h.Chain(leaves)
    td = fcall.from_module(model).detach().clone()
    tied = h.Chain(leaves)
    tied[-1].weight = tied[0].weight
    alias = f"{len(tied) - 1}.weight"
    params = {"nested": td, "flat": h.flat(td)}
    params["tied"] = {k: v for k, v in params["flat"].items() if k != alias}
    models = {"nested": model, "flat": model, "tied": tied}
    x = torch.randn(8, 4)
    symbolic_convert.InstructionTranslatorBase.step = _counting_step
    totals: dict[str, dict[str, float]] = {}
    try:
        for name, make, kind in CELLS:
            torch._dynamo.reset()
            STEPS.clear()
            start = time.perf_counter()
            with torch.no_grad():
                torch.compile(make(models[kind]), backend="eager", fullgraph=True)(x, params[kind])
            totals[name] = {"steps": sum(STEPS.values()), "compile s": time.perf_counter() - start}
            print(f"{name}: {totals[name]['steps']} steps ({totals[name]['compile s']:.1f} s here)")
            for where, steps in STEPS.most_common(args.top):
                print(f"  {steps:>8}  {where}")
    finally:
        symbolic_convert.InstructionTranslatorBase.step = _step
    base = totals[CELLS[0][0]]["steps"]
    for row in totals.values():
        row["ratio"] = row["steps"] / base
    record.results[f"Dynamo steps to compile, {leaves} leaves"] = totals
