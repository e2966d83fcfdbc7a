"""What a process that uses fcall pays where it does not call fcall (issue 26).

    python -m benchmarks side_effects            # 9 rounds of interleaved processes

Each round starts two fresh processes in turn (``--child without`` / ``--child with``),
one that never imports fcall and one that imports it and swaps a parameter set into a
model first, and times in each (the least of its batches, ``CHILD_CELLS``):

- building a 24-layer ``nn.TransformerEncoderLayer`` stack (module construction);
- a plain forward of an 8-layer ``ModuleList`` of ``Linear(16, 16)`` whose forward
  slices its layer list (``for layer in self.layers[:n]``, as transformers' Llama does).

Then, in one process (``--child swap``), ``with fcall.swap(p, net): net(x)`` on that
slicing model beside ``torch.func.functional_call``. Medians over rounds; with / without.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from . import _harness as h


class Sliced(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[: len(self.layers)]:
            x = layer(x)
        return x


def _build() -> None:
    nn.Sequential(*[nn.TransformerEncoderLayer(64, 4, 128) for _ in range(24)])


# name: (the timed function, given the sliced model and its input; calls per batch; batches)
CHILD_CELLS = {
    "build 24 TransformerEncoderLayers, µs": (lambda net, x: _build, 3, 5),
    "forward of 8 sliced Linear(16, 16), µs": (lambda net, x: lambda: net(x), 300, 7),
}


def child(use_fcall: bool) -> dict[str, float]:
    if use_fcall:
        import fcall

        warm = Sliced()
        with fcall.swap(fcall.from_module(warm).detach().clone(), warm):
            warm(torch.randn(2, 16))
    net, x = Sliced(), torch.randn(4, 16)
    row = {}
    with torch.no_grad():
        for name, (make, number, batches) in CHILD_CELLS.items():
            times, _ = h.rounds_of({name: make(net, x)}, batches, number)
            row[name] = min(times[name]) * 1e6
    return row


def swap_beside_torch_func() -> dict[str, dict[str, float]]:
    import fcall

    net, x = Sliced(), torch.randn(4, 16)
    td = fcall.from_module(net).detach().clone()
    params = h.flat(td)

    def with_fcall() -> None:
        with fcall.swap(td, net):
            net(x)

    fns = {"fcall.swap": with_fcall}
    fns["torch.func.functional_call"] = lambda: torch.func.functional_call(net, params, (x,))
    with torch.no_grad():
        h.warm(with_fcall, 3)
        times, beside = h.rounds_of(fns, 9, 300, lambda n: "torch.func.functional_call")
    return {
        name: {
            "µs": h.median(t) * 1e6,
            "ratio": h.paired(t, beside[name]) if name in beside else 1.0,
        }
        for name, t in times.items()
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, help="default 9 (quick: 1)")
    parser.add_argument("--child", choices=("without", "with", "swap"), help=argparse.SUPPRESS)


def run(args: argparse.Namespace, record: h.Recorder) -> None:
    if args.child == "swap":
        record.results["swap"] = swap_beside_torch_func()
        return
    if args.child:
        record.results["child"] = child(args.child == "with")
        return
    runs: dict[str, list[dict[str, float]]] = {"without": [], "with": []}
    for _ in range(args.rounds or (1 if args.quick else 9)):
        for flag, into in runs.items():
            into.append(h.child("side_effects", ["--child", flag], quiet=True)["child"])
    row = {}
    for name in CHILD_CELLS:
        without = h.median(r[name] for r in runs["without"])
        with_fcall = h.median(r[name] for r in runs["with"])
        row[name] = {
            "without fcall": without,
            "with fcall": with_fcall,
            "ratio": with_fcall / without,
        }
    h.print_rows("least of each process's batches, medians over processes", row, row[name])
    title = "a process with fcall against one without (medians over processes)"
    record.results[title] = row
    swap = h.child("side_effects", ["--child", "swap"], quiet=True)["swap"]
    record.results["with fcall.swap(p, net): net(x) on the sliced model, per call"] = swap
    h.print_rows("fcall.swap + forward on the sliced model", swap, ("µs", "ratio"))
