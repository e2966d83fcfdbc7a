"""TorchRL's losses compiled with fcall behind tensordict beside stock tensordict, and the
DQN example's own loss beside TorchRL's (TorchRL stack: torch 2.13.0, tensordict 0.14.3,
torchrl 0.14.1; without torchrl the suite records nothing).

    python -m benchmarks torchrl [--losses sac td3] [--backends aot_eager inductor]
    python -m benchmarks torchrl --sections example

Sections:

1. ``losses``: for each loss (DQN, DoubleDQN, SAC, DDPG, TD3; tiny networks,
   ``tests/torchrl_routed.py``) and backend, ``torch.compile(loss, fullgraph=True)`` built
   and run under ``fcall.behind_tensordict()`` beside the same on stock tensordict, per
   call: ``forward`` (the compiled loss) and ``step`` (forward, backward, ``zero_grad``);
   the ratio fcall / stock is the median of per-round ratios, each fcall batch beside a
   stock one; the graph counts are read after the timed calls (a recompile shows).
2. ``example``: ``examples/torchrl_dqn_target.py``'s ``td_loss`` (``fcall.swap``) beside
   TorchRL's ``DQNLoss.forward`` (tensordict's ``to_module``), eager and compiled
   (inductor; quick: aot_eager): the first call and the median per call, each call on a
   fresh clone of a batch (made before the clock starts).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import sys
import warnings
from typing import Any

import torch

from . import _harness as h

sys.path[:0] = [str(h.ROOT), str(h.ROOT / "examples")]  # the package tests; the examples
LIBRARIES = ("tensordict", "fcall")


def loss_cells(name: str, backend: str) -> tuple[dict[str, h.Fn], dict[str, Any]]:
    """``forward`` and ``step`` of one compiled loss per library, warmed up; counters."""
    from torch._dynamo.testing import CompileCounterWithBackend

    from tests import torchrl_routed as trl

    fns: dict[str, h.Fn] = {}
    counters = {}
    for library in LIBRARIES:
        with trl.backed_by(library):
            loss = trl.make_loss(name)
            counters[library] = CompileCounterWithBackend(backend)
            compiled = torch.compile(loss, backend=counters[library], fullgraph=True)
            td = trl.make_batch(name)

            def forward(compiled=compiled, td=td) -> Any:
                return compiled(td)

            def step(compiled=compiled, td=td, loss=loss) -> None:
                trl.total(compiled(td)).backward()
                loss.zero_grad(set_to_none=True)

            for _ in range(3):
                step()
                forward()
        fns[f"{library} forward"], fns[f"{library} step"] = forward, step
    return fns, counters


def losses(args: argparse.Namespace, rounds: int, calls: int) -> dict[str, dict]:
    from tests import torchrl_routed as trl

    table: dict[str, dict] = {}
    for name in args.losses:
        for backend in args.backends:
            torch._dynamo.reset()
            fns, counters = loss_cells(name, backend)
            stock = lambda cell: cell.replace("fcall", "tensordict")  # noqa: E731
            # fcall's cells run with the route on, as compiled; turned on before the clock
            within = lambda cell: trl.backed_by(cell.split()[0])  # noqa: E731
            times, beside = h.rounds_of(fns, rounds, calls, stock, within)
            row: dict[str, Any] = {}
            for what in ("forward", "step"):
                row[f"{what}: stock µs"] = h.median(times[f"tensordict {what}"]) * 1e6
                row[f"{what}: fcall µs"] = h.median(times[f"fcall {what}"]) * 1e6
                row[f"{what}: ratio"] = h.paired(times[f"fcall {what}"], beside[f"fcall {what}"])
            row["graphs (stock/fcall)"] = "/".join(
                str(counters[lib].frame_count) for lib in LIBRARIES
            )
            table[f"{name}, {backend}"] = row
            h.print_rows(f"{name}, {backend}", {name: row}, row)
    return {"TorchRL losses, fcall behind tensordict against stock, per call": table}


def example(rounds: int, calls: int, backend: str) -> dict[str, dict]:
    import torchrl_dqn_target as dqn

    loss, _ = dqn.make_loss()
    generator = torch.Generator().manual_seed(1)
    batches = [dqn.batch(generator) for _ in range(calls)]

    def stock(loss, data):
        return loss(data)["loss"]

    stock(loss, batches[0].clone())  # TorchRL builds its value estimator lazily
    cells = {
        "DQNLoss.forward, eager": stock,
        "fcall td_loss, eager": dqn.td_loss,
        "DQNLoss.forward, compiled": torch.compile(stock, backend=backend, fullgraph=True),
        "fcall td_loss, compiled": torch.compile(dqn.td_loss, backend=backend, fullgraph=True),
    }
    first = {
        name: h.first_call(lambda fn=fn: fn(loss, batches[0].clone()))[1]
        for name, fn in cells.items()
    }
    # a fresh clone of a batch per call, made before the clock starts
    clones = {name: iter([b.clone() for _ in range(rounds) for b in batches]) for name in cells}
    fns = {name: (lambda fn=fn, c=clones[name]: fn(loss, next(c))) for name, fn in cells.items()}
    times, _ = h.rounds_of(fns, rounds, calls)
    row = {
        name: {"first call, s": first[name], "per call, µs": h.median(times[name]) * 1e6}
        for name in cells
    }
    h.print_rows("the DQN example's loss beside TorchRL's", row, ("first call, s", "per call, µs"))
    return {"the DQN example (fcall.swap) beside DQNLoss.forward": row}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sections", default="losses,example")
    parser.add_argument("--losses", nargs="+", help="default: all five (quick: dqn)")
    parser.add_argument(
        "--backends", nargs="+", help="default: aot_eager inductor (quick: aot_eager)"
    )
    parser.add_argument("--rounds", type=int, help="default 15 (quick: 3)")
    parser.add_argument("--calls", type=int, help="default 20 (quick: 5)")


def run(args: argparse.Namespace, record: h.Recorder) -> None:
    if importlib.util.find_spec("torchrl") is None:
        print("torchrl: skipped, torchrl is not installed (the TorchRL stack: noxfile.py)")
        return
    from tests import torchrl_routed as trl

    warnings.filterwarnings("ignore")
    quick = args.quick
    args.losses = args.losses or (["dqn"] if quick else trl.LOSSES)
    args.backends = args.backends or (["aot_eager"] if quick else ["aot_eager", "inductor"])
    rounds, calls = args.rounds or (3 if quick else 15), args.calls or (5 if quick else 20)
    with contextlib.suppress(ImportError):
        import torchrl

        record.results["meta"]["torchrl"] = torchrl.__version__
    if "losses" in args.sections:
        record.results.update(losses(args, rounds, calls))
        record.save()
    if "example" in args.sections:
        record.results.update(example(rounds, calls, "aot_eager" if quick else "inductor"))
