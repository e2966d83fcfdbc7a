"""What a TorchRL DQN loss step costs, TorchRL's own forward against fcall's swaps.

Run from the repository root, on the torchrl stack (torchrl 0.14.1, tensordict 0.14.3):

    python benchmarks/torchrl_dqn.py

The loss is ``examples/torchrl_dqn_target.py``'s: ``DQNLoss(delay_value=True)`` on a
``QValueActor`` (an MLP 4-32-3), batch 64. Timed in turns, one thread, forward only
(the loss value): TorchRL's ``DQNLoss.forward`` (tensordict's ``to_module`` swaps) and
the example's ``td_loss`` (``fcall.swap``), each eager and compiled with
``fullgraph=True`` on the default backend (inductor). Prints the first call (the
compile, for the compiled ones) and the median per call over rounds.
"""

from __future__ import annotations

import pathlib
import statistics
import sys
import time
from collections.abc import Callable

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
import torchrl_dqn_target as example

ROUNDS, CALLS = 15, 50


def stock(loss, data):
    return loss(data)["loss"]


def timed(fn: Callable, loss, batches: list) -> float:
    start = time.perf_counter()
    for data in batches:
        fn(loss, data)
    return (time.perf_counter() - start) / len(batches) * 1e6


def main() -> None:
    if not example.HAVE_TORCHRL:
        print("torchrl_dqn: skipped, torchrl is not installed")
        return
    torch.set_num_threads(1)
    torch.manual_seed(0)
    loss, _ = example.make_loss()
    generator = torch.Generator().manual_seed(1)
    batches = [example.batch(generator) for _ in range(CALLS)]
    stock(loss, batches[0].clone())  # TorchRL builds its value estimator lazily
    peers = {
        "DQNLoss.forward, eager": stock,
        "fcall td_loss, eager": example.td_loss,
        "DQNLoss.forward, compiled": torch.compile(stock, fullgraph=True),
        "fcall td_loss, compiled": torch.compile(example.td_loss, fullgraph=True),
    }
    first = {}
    for name, fn in peers.items():
        start = time.perf_counter()
        fn(loss, batches[0].clone())
        first[name] = time.perf_counter() - start
    times: dict[str, list[float]] = {name: [] for name in peers}
    for _ in range(ROUNDS):
        for name, fn in peers.items():
            times[name].append(timed(fn, loss, [b.clone() for b in batches]))
    print(f"{'':28s} {'first call':>12s} {'per call (median)':>18s}")
    for name in peers:
        median = statistics.median(times[name])
        print(f"{name:28s} {first[name]:10.2f} s {median:15.0f} µs")


if __name__ == "__main__":
    main()
