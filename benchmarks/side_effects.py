"""What a process that uses fcall pays where it does not call fcall (issue 26).

Run from the repository root:

    python benchmarks/side_effects.py            # 9 rounds of interleaved processes

Each round starts two fresh processes in turn, one that never imports fcall and one that
imports it and swaps a parameter set into a model first, and times in each:

- building a 24-layer ``nn.TransformerEncoderLayer`` stack (module construction);
- a plain forward of an 8-layer ``ModuleList`` of ``Linear(16, 16)`` whose forward
  slices its layer list (``for layer in self.layers[:n]``, as transformers' Llama does).

Then, in one process, ``with fcall.swap(p, net): net(x)`` on that slicing model beside
``torch.func.functional_call``. Medians over rounds; ratios with fcall / without.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap

SLICED = """
class Sliced(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(8))

    def forward(self, x):
        for layer in self.layers[: len(self.layers)]:
            x = layer(x)
        return x
"""

CHILD = textwrap.dedent(
    """
    import json, sys, time
    import torch
    from torch import nn
    torch.set_num_threads(1)
    USE_FCALL = sys.argv[1] == "1"

    {sliced}

    if USE_FCALL:
        import fcall
        warm = Sliced()
        with fcall.swap(fcall.from_module(warm).detach().clone(), warm):
            warm(torch.randn(2, 16))

    def best(fn, repeat, number):
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(number):
                fn()
            times.append((time.perf_counter() - start) / number)
        return min(times)

    def build():
        nn.Sequential(*[nn.TransformerEncoderLayer(64, 4, 128) for _ in range(24)])

    net, x = Sliced(), torch.randn(4, 16)
    with torch.no_grad():
        out = {"build": best(build, 5, 3), "forward": best(lambda: net(x), 7, 300)}
    print(json.dumps(out))
    """
).replace("{sliced}", SLICED)

SWAP = textwrap.dedent(
    """
    import json, time
    import torch
    from torch import nn
    import fcall
    torch.set_num_threads(1)

    {sliced}

    net, x = Sliced(), torch.randn(4, 16)
    td = fcall.from_module(net).detach().clone()
    flat = dict(td.flatten_keys("."))

    def with_fcall():
        with fcall.swap(td, net):
            net(x)

    def with_torch_func():
        torch.func.functional_call(net, flat, (x,))

    def best(fn):
        times = []
        for _ in range(9):
            start = time.perf_counter()
            for _ in range(300):
                fn()
            times.append((time.perf_counter() - start) / 300)
        return min(times)

    with torch.no_grad():
        rows = []
        for _ in range(5):  # in turns
            rows.append((best(with_fcall), best(with_torch_func)))
    print(json.dumps(rows))
    """
).replace("{sliced}", SLICED)


def _child(source: str, *args: str) -> object:
    done = subprocess.run(
        [sys.executable, "-c", source, *args], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    rounds = parser.parse_args().rounds
    without: dict[str, list[float]] = {"build": [], "forward": []}
    with_fcall: dict[str, list[float]] = {"build": [], "forward": []}
    for _ in range(rounds):
        for flag, into in (("0", without), ("1", with_fcall)):
            result = _child(CHILD, flag)
            assert isinstance(result, dict)
            for key in into:
                into[key].append(result[key])
    print(f"{rounds} rounds of interleaved processes, medians (ratio: with fcall / without)")
    labels = {
        "build": "build 24 TransformerEncoderLayers",
        "forward": "forward, 8 sliced Linear(16, 16)",
    }
    for key, label in labels.items():
        a, b = statistics.median(without[key]), statistics.median(with_fcall[key])
        print(f"  {label:36s} without {a * 1e6:10.1f} µs   with {b * 1e6:10.1f} µs   {b / a:5.2f}x")
    rows = _child(SWAP)
    assert isinstance(rows, list)
    ratios = [ours / peer for ours, peer in rows]
    ours = statistics.median(r[0] for r in rows)
    peer = statistics.median(r[1] for r in rows)
    print(
        f"  swap + forward, sliced model: fcall.swap {ours * 1e6:.1f} µs,"
        f" torch.func.functional_call {peer * 1e6:.1f} µs,"
        f" ratio median {statistics.median(ratios):.2f}x"
    )


if __name__ == "__main__":
    main()
