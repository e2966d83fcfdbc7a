"""The eager express lane (fcall/_express.py) against fcall's generic path, in one process.

Run from the repository root:

    python benchmarks/express_lane.py

Per size, two modules of the same structure swap the same params: one with its
express built, one whose plans never get one (the generic path). They take turns in
each round, in reversed order every other round; the ratio is the median over rounds
of each round's express / generic time. Also printed: the time to generate and
compile the express source once (with the generic swap that triggers it), and after
how many swaps the time it saves has paid for it.
The params are a nested TensorDict and a flat dict with dotted keys (what
``torch.func.functional_call`` takes); sizes past ``_MAX_LEAVES`` get an express
here anyway, to show why the lane stops there.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

import fcall
from fcall import _express, _plan

SIZES = [10, 100, 1000, 10_000]
ROUNDS = 15


def chain(leaves: int) -> nn.Sequential:
    return nn.Sequential(*[nn.Linear(4, 4) for _ in range(leaves // 2)])


def swapper(api: str, params: object, module: nn.Module) -> Callable[[], None]:
    swap = fcall.swap if api == "swap" else fcall.to_module

    def run() -> None:
        with swap(params, module):
            pass

    return run


def build_seconds(api: str, params: object, module: nn.Module) -> float:
    """Time of the swap that builds the express (it offers the plan its last time)."""
    _express._OFFERS_BEFORE_BUILD = 2
    run = swapper(api, params, module)
    run()
    start = time.perf_counter()
    run()
    seconds = time.perf_counter() - start
    assert _plan.current_express(module) is not None
    return seconds


def generic(api: str, params: object, module: nn.Module) -> Callable[[], None]:
    _express._OFFERS_BEFORE_BUILD = 10**9  # this module's plans never get an express
    run = swapper(api, params, module)
    run()
    return run


def ratio(express: Callable[[], None], plain: Callable[[], None], number: int) -> tuple:
    times: dict[str, list[float]] = {"express": [], "generic": []}
    for round_ in range(ROUNDS):
        pair = [("express", express), ("generic", plain)]
        for name, run in pair[::-1] if round_ % 2 else pair:
            start = time.perf_counter()
            for _ in range(number):
                run()
            times[name].append((time.perf_counter() - start) / number)
    ratios = [a / b for a, b in zip(times["express"], times["generic"])]
    return statistics.median(ratios), statistics.median(times["generic"])


def main() -> None:
    torch.set_num_threads(1)
    limits = _express._MAX_LEAVES, _express._MAX_FLAT_LEAVES, _express._OFFERS_BEFORE_BUILD
    _express._MAX_LEAVES = _express._MAX_FLAT_LEAVES = max(SIZES)
    print("express / generic, eager swap + restore (median of per-round ratios);")
    print("build: generating and compiling the express once; paid off after that many swaps")
    print(f"{'leaves':>7}  {'params':<12}{'api':<11}{'ratio':>8}{'build ms':>11}{'paid off':>10}")
    try:
        for leaves in SIZES:
            for kind in ("TensorDict", "flat dict"):
                for api in ("swap", "to_module"):
                    row(leaves, kind, api)
    finally:
        _express._MAX_LEAVES, _express._MAX_FLAT_LEAVES, _express._OFFERS_BEFORE_BUILD = limits


def row(leaves: int, kind: str, api: str) -> None:
    fast, plain = chain(leaves), chain(leaves)
    td = fcall.from_module(fast).detach().clone().requires_grad_().apply(nn.Parameter)
    params = td if kind == "TensorDict" else {".".join(k): v for k, v in td.items(True, True)}
    built = build_seconds(api, params, fast)
    express = swapper(api, params, fast)
    value, generic_seconds = ratio(express, generic(api, params, plain), max(3, 20_000 // leaves))
    saved = generic_seconds * (1 - value)
    paid_off = f"{built / saved:>10.0f}" if saved > 0 else f"{'never':>10}"
    print(f"{leaves:>7}  {kind:<12}{api:<11}{value:>7.2f}x{built * 1e3:>11.1f}{paid_off}")


if __name__ == "__main__":
    main()
