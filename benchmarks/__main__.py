"""The one runner of fcall's benchmarks. From the repository root:

    python -m benchmarks                       # the suites, one line each
    python -m benchmarks SUITE [--quick] [--out FILE] [the suite's options; -h lists them]
    python -m benchmarks merge A.json B.json --out FILE   # runs of one suite made apart
    python -m benchmarks report [--check]      # docs/performance.md's results from the JSON

A full run writes ``benchmarks/results/SUITE.json``; ``--quick`` (a smoke run: tiny sizes,
few rounds) writes to ``/tmp`` unless ``--out`` says where. Every run is one thread, seed 0.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from . import _harness, _report

# name -> module: each has a docstring, add_arguments(parser) and run(args, record)
SUITES = {
    "matrix": "every API x container x kind of value, eager and compiled, vs torch.func",
    "swap": "per leaf vs tensordict and a floor; overhead outside the graph; recompiles; memory",
    "parameter_cost": "what a Parameter per leaf costs to_module with plain tensors",
    "dynamo_steps": "bytecode steps Dynamo traces to compile a swap, per function",
    "call_path": "the fcall modules and functions a warm eager call of each API runs through",
    "floor": "compiled swaps per call and first call beside the model alone, per holding form",
    "first_compile": "first compile (steps, CPU s) and compiled calls vs the model and torch.func",
    "step_share": "the eager swap's share of four realistic steps",
    "side_effects": "what a process using fcall pays where it does not call fcall",
    "torchrl": "TorchRL's losses with fcall behind tensordict vs stock (TorchRL stack)",
    "checkpoint_memory": "memory per rank of sets read from DCP checkpoints (2 gloo ranks)",
    "gpu": "compiled swaps on CUDA beside the model alone; reduce-overhead's CUDA graphs",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("list", "-h", "--help"):
        print(__doc__)
        for name, line in SUITES.items():
            print(f"  {name:<18} {line}")
        return 0
    if argv[0] == "report":
        parser = argparse.ArgumentParser(prog="python -m benchmarks report")
        parser.add_argument("--check", action="store_true", help="fail if the page is stale")
        return _report.report(check=parser.parse_args(argv[1:]).check)
    if argv[0] == "merge":
        parser = argparse.ArgumentParser(prog="python -m benchmarks merge")
        parser.add_argument("parts", nargs="+", metavar="JSON")
        parser.add_argument("--out", required=True)
        args = parser.parse_args(argv[1:])
        merged = _harness.merge([json.loads(Path(p).read_text()) for p in args.parts])
        Path(args.out).write_text(json.dumps(merged, indent=1))
        print(f"wrote {args.out}")
        return 0
    name = argv[0]
    if name not in SUITES:
        print(f"no suite {name!r}: one of {', '.join(SUITES)}, merge, report", file=sys.stderr)
        return 2
    suite = importlib.import_module(f"benchmarks.{name}")
    parser = argparse.ArgumentParser(
        prog=f"python -m benchmarks {name}",
        description=suite.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny, few rounds")
    parser.add_argument("--out", type=Path, help="JSON path (default: results/ or /tmp)")
    suite.add_arguments(parser)
    args = parser.parse_args(argv[1:])
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    out = args.out or _harness.default_out(name, args.quick)
    record = _harness.Recorder(name, argv[1:], args.quick, out)
    suite.run(args, record)
    record.save(done=True)
    print(f"\nwrote {out} ({record.results['meta']['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
