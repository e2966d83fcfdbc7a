"""How much Python Dynamo traces to compile a swap: bytecode steps, per function.

Compile time of a swap is mostly Dynamo stepping through Python, and unlike a
wall-clock time the number of steps is the same on every run and machine. Run
from the repository root:

    python benchmarks/dynamo_steps.py            # 200 leaves
    python benchmarks/dynamo_steps.py --leaves 1000 --top 15

It compiles ``f(x, params)`` that swaps and calls an ``nn.Sequential`` of
``Linear(4, 4)`` (backend ``eager``: no code generation), once with
``torch.func.functional_call`` and a flat dict, once with ``fcall.swap`` and a
nested TensorDict, and prints the steps of each and the functions that take the most.
"""

from __future__ import annotations

import argparse
import collections
import time

import torch
from torch import nn
from torch._dynamo import symbolic_convert

import fcall

STEPS: collections.Counter = collections.Counter()
_step = symbolic_convert.InstructionTranslatorBase.step


def _counting_step(self: symbolic_convert.InstructionTranslatorBase) -> object:
    code = self.f_code
    STEPS[f"{code.co_filename.rpartition('site-packages/')[2]}:{code.co_name}"] += 1
    return _step(self)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leaves", type=int, default=200)
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(args.leaves // 2)])
    td = fcall.from_module(model).detach().clone()
    flat = {".".join(key): value for key, value in td.items(True, True)}
    x = torch.randn(8, 4)

    def with_functional_call(x, p):
        return torch.func.functional_call(model, p, (x,))

    def with_fcall_swap(x, p):
        with fcall.swap(p, model):
            return model(x)

    symbolic_convert.InstructionTranslatorBase.step = _counting_step
    totals = {}
    for peer, fn, params in [
        ("torch.func.functional_call (flat dict)", with_functional_call, flat),
        ("fcall.swap (nested TensorDict)", with_fcall_swap, td),
    ]:
        torch._dynamo.reset()
        STEPS.clear()
        start = time.perf_counter()
        with torch.no_grad():
            torch.compile(fn, backend="eager", fullgraph=True)(x, params)
        seconds = time.perf_counter() - start
        totals[peer] = sum(STEPS.values())
        print(f"{peer}: {totals[peer]} steps ({seconds:.1f} s to compile here)")
        for where, steps in STEPS.most_common(args.top):
            print(f"  {steps:>8}  {where}")
    func_steps, fcall_steps = totals.values()
    ratio = fcall_steps / func_steps
    print(f"\nfcall / functional_call steps at {args.leaves} leaves: {ratio:.2f}x")


if __name__ == "__main__":
    main()
