"""Where a compiled swap-and-call spends its time outside the graph.

Run from the repository root:

    python benchmarks/compiled_overhead.py             # 1,000 leaves
    python benchmarks/compiled_overhead.py --leaves 100

The model's ``forward`` reads no parameter (it returns ``x * 2``), so what is
timed is the guards and the bytecode Dynamo runs around the graph. Peers, each
compiled with ``fullgraph=True`` on the ``eager`` backend and timed in turns
(median per call):

- nothing: ``x * 2`` alone;
- walking a flat dict / a nested TensorDict of the same leaves (their guards);
- ``torch.nn.utils.stateless._reparametrize_module`` (torch.func's machinery) with a flat dict
  and ``tie_weights=True``, as ``torch.func.functional_call`` calls it;
- ``fcall.swap`` with a flat dict and with a nested TensorDict;
- both with ``tie_weights=False`` (no scan of the module for tied names).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from tensordict import TensorDict
from torch import nn
from torch.nn.utils.stateless import _reparametrize_module

import fcall


class ParamsUnread(nn.Module):
    def __init__(self, leaves: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(4, 4) for _ in range(leaves // 2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def _count_nested(entries: dict) -> int:
    return sum(
        _count_nested(v._tensordict) if isinstance(v, TensorDict) else 1 for v in entries.values()
    )


def peers(model: nn.Module) -> dict[str, tuple[Callable, str]]:
    def nothing(x, p):
        return x * 2

    def walk_flat(x, p):
        return x * len([v for v in p.values() if v is not None])

    def walk_nested(x, p):
        return x * _count_nested(p._tensordict)

    def reparametrize(x, p):  # tie_weights=True, as torch.func.functional_call passes it
        with _reparametrize_module(model, p, tie_weights=True):
            return model(x)

    def reparametrize_untied(x, p):
        with _reparametrize_module(model, p):
            return model(x)

    def fcall_swap_flat(x, p):  # one def per peer: Dynamo caches per code object
        with fcall.swap(p, model):
            return model(x)

    def fcall_swap(x, p):
        with fcall.swap(p, model):
            return model(x)

    def fcall_swap_untied(x, p):
        with fcall.swap(p, model, tie_weights=False):
            return model(x)

    return {
        "nothing": (nothing, "flat"),
        "walk a flat dict": (walk_flat, "flat"),
        "walk a nested TensorDict": (walk_nested, "nested"),
        "torch.func machinery, flat dict": (reparametrize, "flat"),
        "fcall.swap, flat dict": (fcall_swap_flat, "flat"),
        "fcall.swap, nested TensorDict": (fcall_swap, "nested"),
        "torch.func, flat, tie_weights=False": (reparametrize_untied, "flat"),
        "fcall.swap, nested, tie_weights=False": (fcall_swap_untied, "nested"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leaves", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = ParamsUnread(args.leaves)
    nested = fcall.from_module(model).detach().clone()
    params = {"nested": nested, "flat": {".".join(k): v for k, v in nested.items(True, True)}}
    x = torch.randn(8, 4)
    compiled = {}
    with torch.no_grad():
        for name, (fn, kind) in peers(model).items():
            compiled[name] = (torch.compile(fn, backend="eager", fullgraph=True), params[kind])
            compiled[name][0](x, params[kind])
        times: dict[str, list[float]] = {name: [] for name in compiled}
        for _ in range(args.rounds):
            for name, (fn, p) in compiled.items():
                start = time.perf_counter()
                for _ in range(20):
                    fn(x, p)
                times[name].append((time.perf_counter() - start) / 20)
    base = times["torch.func machinery, flat dict"]
    print(f"{args.leaves} leaves, forward reads no parameter, per call: median, and minimum")
    print("(guard checks read MBs of guard tree per call: load on the other core moves the")
    print("median more than the minimum)")
    for name, samples in times.items():
        median, least = statistics.median(samples), min(samples)
        print(
            f"  {name:<40}{median * 1e6:>10.1f} µs{median / statistics.median(base):>7.2f}x"
            f"{least * 1e6:>10.1f} µs{least / min(base):>7.2f}x torch.func"
        )


if __name__ == "__main__":
    main()
