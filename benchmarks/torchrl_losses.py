"""TorchRL's losses compiled, with fcall behind tensordict beside stock tensordict, in one run.

For each loss (DQN, DoubleDQN, SAC, DDPG, TD3; tiny networks, ``tests/torchrl_routed.py``)
and backend, it compiles ``torch.compile(loss, fullgraph=True)`` twice: once on stock
tensordict, once built and run under ``fcall.behind_tensordict()``. It prints, per call:

* ``forward``: the compiled loss on a batch;
* ``step``: forward, backward of the summed loss entries, and ``zero_grad``;

as medians over rounds, each round timing both cells back to back (order alternating), and
the ratio fcall / stock as the median of the per-round ratios (the target is <= 1.0x), with
the graph count of each cell (one compile each, so the counts must be equal).

Run on the TorchRL stack (torch 2.13.0, tensordict 0.14.3, torchrl 0.14.1)::

    python benchmarks/torchrl_losses.py [--losses sac td3] [--backends aot_eager inductor]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounterWithBackend

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
warnings.filterwarnings("ignore")

import torchrl_routed as trl  # noqa: E402

LIBRARIES = ("tensordict", "fcall")


def _cell(
    name: str, library: str, backend: str
) -> tuple[dict[str, Callable[[], Any]], CompileCounterWithBackend]:
    """The forward and step closures of one compiled loss, warmed up; its graph counter."""
    with trl.backed_by(library):
        loss = trl.make_loss(name)
        counter = CompileCounterWithBackend(backend)
        compiled = torch.compile(loss, backend=counter, fullgraph=True)
        td = trl.make_batch(name)

        def forward() -> Any:
            return compiled(td)

        def step() -> None:
            trl.total(compiled(td)).backward()
            loss.zero_grad(set_to_none=True)

        for _ in range(3):
            step()
            forward()
    return {"forward": forward, "step": step}, counter


def _time(fn: Callable[[], Any], library: str, calls: int) -> float:
    with trl.backed_by(library):  # fcall's cells run with the route on, as compiled
        start = time.perf_counter()  # after the route is on: turning it on is not a call's
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - start
    return elapsed / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--losses", nargs="+", default=trl.LOSSES)
    parser.add_argument("--backends", nargs="+", default=["aot_eager", "inductor"])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import tensordict
    import torchrl

    print(
        f"torch {torch.__version__}, tensordict {tensordict.__version__}, "
        f"torchrl {torchrl.__version__}; medians of {args.rounds} paired rounds of "
        f"{args.calls} calls; microseconds per call"
    )
    header = f"{'loss':<11}{'backend':<10}{'what':<8}{'stock':>10}{'fcall':>10}{'ratio':>8}"
    print(header + f"{'graphs (stock/fcall)':>22}")
    for name in args.losses:
        for backend in args.backends:
            torch._dynamo.reset()
            cells = {}
            graphs = {}
            for library in LIBRARIES:
                cells[library], graphs[library] = _cell(name, library, backend)
            for what in ("forward", "step"):
                times: dict[str, list[float]] = {library: [] for library in LIBRARIES}
                ratios = []
                for index in range(args.rounds):
                    order = LIBRARIES if index % 2 == 0 else LIBRARIES[::-1]
                    for library in order:
                        times[library].append(_time(cells[library][what], library, args.calls))
                    ratios.append(times["fcall"][-1] / times["tensordict"][-1])
                stock = statistics.median(times["tensordict"]) * 1e6
                ours = statistics.median(times["fcall"]) * 1e6
                ratio = statistics.median(ratios)
                # read after the timed calls: a recompile while timing shows here
                counts = f"{graphs['tensordict'].frame_count}/{graphs['fcall'].frame_count}"
                print(
                    f"{name:<11}{backend:<10}{what:<8}{stock:>10.1f}{ours:>10.1f}"
                    f"{ratio:>7.2f}x{counts:>22}"
                )


if __name__ == "__main__":
    main()
