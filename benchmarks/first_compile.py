"""What a first compile of a swapped call costs, beside the model alone and torch.func.

    python -m benchmarks first_compile                      # 200 and 1,000 leaves
    python -m benchmarks first_compile --sizes 10000 --apis swap --containers tensordict \\
        --backends aot_eager                                # the 10,000-leaf row
    python -m benchmarks first_compile --sections per_call  # compiled calls, paired
    python -m benchmarks first_compile --apart --repeat 5 --sizes 1000 --backends aot_eager \
        --apis swap functional_call                         # fresh processes, 5 rounds

It compiles ``f(x, p)`` (``fullgraph=True``, under ``no_grad``) for an ``nn.Sequential`` of
``Linear(4, 4)``: the model with its own parameters (no swap: the floor),
``torch.func.functional_call`` with a flat dict (the peer), and each fcall API with each
container. Per cell it prints the Dynamo bytecode steps (counted on the eager backend by
wrapping ``InstructionTranslatorBase.step``: the same on every machine) and the first
call's CPU seconds per backend, each as a ratio to the no-swap model of the same run.

``per_call`` times the compiled calls at 1,000 leaves in interleaved rounds: fcall's
``swap`` and ``functional_call`` against ``torch.func.functional_call``, and
``tie_weights=True`` against ``tie_weights=False``; medians of the paired ratios.
"""

from __future__ import annotations

import argparse
import collections
import time
from collections.abc import Callable
from typing import Any

import torch
from torch._dynamo import symbolic_convert

import fcall

from . import _harness as h
from . import matrix

APIS = ("swap", "functional_call", "to_module")
CONTAINERS = ("tensordict", "flat", "nested", "tensordictparams")
BACKENDS = ("eager", "aot_eager", "inductor")
MODEL, PEER = "no swap (the model's own parameters)", "torch.func.functional_call (flat dict)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sections", nargs="+", default=["first_call"], choices=SECTIONS)
    parser.add_argument("--sizes", type=lambda s: [int(n) for n in s.split(",")])
    parser.add_argument("--apis", nargs="+", default=list(APIS), choices=APIS)
    parser.add_argument("--containers", nargs="+", default=list(CONTAINERS), choices=CONTAINERS)
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--rounds", type=int, default=15, help="per_call: interleaved rounds")
    parser.add_argument("--plot", help="also draw steps and seconds against leaves (PNG path)")
    parser.add_argument(
        "--apart",
        action="store_true",
        help="first_call: each cell in a process of its own (no compile runs after another's)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="with --apart: rounds of first calls, each over every cell in turn; seconds "
        "are medians, x the median of each round's ratio to the no-swap model",
    )
    parser.add_argument("--cells", nargs="+", help=argparse.SUPPRESS)  # a child's: names
    parser.add_argument(  # a child's: the steps, or the first call's seconds, alone
        "--only", choices=["steps", "seconds"], help=argparse.SUPPRESS
    )


def compiled_call(api: str, model: torch.nn.Module, **options: Any) -> Callable:
    """The function a user compiles: swap ``p`` into ``model`` and call it on ``x``."""
    if api == "model":
        return lambda x, p: model(x)
    if api == "torch.func":
        return lambda x, p: torch.func.functional_call(model, p, (x,))
    if api == "functional_call":
        return lambda x, p: fcall.functional_call(model, p, (x,), **options)
    if api == "to_module":

        def with_to_module(x: torch.Tensor, p: Any) -> torch.Tensor:
            with fcall.to_module(p, model):
                return model(x)

        return with_to_module

    def with_swap(x: torch.Tensor, p: Any) -> torch.Tensor:
        with fcall.swap(p, model, **options):
            return model(x)

    return with_swap


# this suite's container names -> the matrix's (benchmarks/matrix.py builds them)
_MATRIX_CONTAINERS = {
    "tensordict": "TensorDict",
    "flat": "flat dict",
    "nested": "nested dict",
    "tensordictparams": "TensorDictParams",
}


def params_of(model: torch.nn.Module, container: str) -> Any:
    """The model's own values, detached copies of plain tensors, held by ``container``."""
    td = fcall.from_module(model).detach().clone()
    return matrix.container(td, _MATRIX_CONTAINERS[container], "plain")


_STEPS = collections.Counter()
_step = symbolic_convert.InstructionTranslatorBase.step


def _counting_step(self: symbolic_convert.InstructionTranslatorBase) -> object:
    _STEPS["all"] += 1
    return _step(self)


def steps_of(fn: Callable, x: torch.Tensor, p: Any) -> int:
    """Dynamo's bytecode steps to compile ``fn(x, p)`` (backend eager)."""
    torch._dynamo.reset()
    _STEPS.clear()
    symbolic_convert.InstructionTranslatorBase.step = _counting_step
    try:
        with torch.no_grad():
            torch.compile(fn, backend="eager", fullgraph=True)(x, p)
    finally:
        symbolic_convert.InstructionTranslatorBase.step = _step
    return _STEPS["all"]


def first_call_s(fn: Callable, x: torch.Tensor, p: Any, backend: str) -> float:
    """CPU seconds of the first call of ``torch.compile(fn, backend=backend)``."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend, fullgraph=True)

    def call() -> None:
        with torch.no_grad():
            compiled(x, p)

    return h.first_call(call)[0]


def _cells(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    cells = [(MODEL, "model", "flat"), (PEER, "torch.func", "flat")]
    for api in args.apis:
        for container in args.containers:
            cells.append((f"fcall.{api} ({container})", api, container))
    if args.cells:
        cells = [cell for cell in cells if cell[0] in args.cells]
    return cells


def _measured(
    leaves: int, cells: list[tuple[str, str, str]], backends: list[str], only: str | None
) -> dict:
    model = h.Chain(leaves)
    x = torch.randn(8, 4)
    table: dict[str, dict[str, Any]] = {}
    for name, api, container in cells:
        p = params_of(model, container)
        fn = h.fresh(compiled_call(api, model), f"{api}_{container}")
        row: dict[str, Any] = {} if only == "seconds" else {"steps": steps_of(fn, x, p)}
        for backend in backends if only != "steps" else []:
            fn = h.fresh(compiled_call(api, model), f"{api}_{container}_{backend}")
            row[f"{backend} s"] = first_call_s(fn, x, p, backend)
        table[name] = row
        print(f"  {leaves} leaves, {name}: {row}", flush=True)
    return table


def first_call(args: argparse.Namespace, record: h.Recorder) -> None:
    h.isolate_compiles()
    sizes = args.sizes or ([20] if args.quick else [200, 1000])
    for leaves in sizes:
        title = f"first compile, {leaves} leaves"
        samples: dict[str, dict[str, list[float]]] = {}  # apart: cell -> backend -> seconds
        if args.apart:  # each cell's steps, and each first call, in a fresh process
            table = {
                name: _apart(title, leaves, name, "steps", args) for name, _, _ in _cells(args)
            }
            for _ in range(args.repeat):  # a round over every cell: they share the drift
                for name, _, _ in _cells(args):
                    for backend in args.backends:
                        part = _apart(title, leaves, name, "seconds", args, backend)
                        runs = samples.setdefault(name, {}).setdefault(backend, [])
                        runs.append(part[f"{backend} s"])
            for name, by_backend in samples.items():
                for backend, runs in by_backend.items():
                    table[name][f"{backend} s"] = h.median(runs)
        else:
            table = _measured(leaves, _cells(args), args.backends, args.only)
        if MODEL in table and not args.only:
            floor = table[MODEL]
            for name, row in table.items():
                row["steps x"] = row["steps"] / floor["steps"]
                for backend in args.backends:
                    if samples:  # per round, against that round's model
                        ratio = h.paired(samples[name][backend], samples[MODEL][backend])
                    else:
                        ratio = row[f"{backend} s"] / floor[f"{backend} s"]
                    row[f"{backend} x"] = ratio
        fields = ["steps", "steps x"] + [f"{b} {u}" for b in args.backends for u in ("s", "x")]
        h.print_rows(f"First compile, {leaves} leaves (x: / the no-swap model)", table, fields)
        if args.apart and not args.quick:
            title = f"first compile apart, {leaves} leaves"  # each compile a first one
        record.results[title] = table
        record.save()


def _apart(
    title: str,
    leaves: int,
    name: str,
    only: str,
    args: argparse.Namespace,
    backend: str | None = None,
) -> dict[str, Any]:
    """Cell ``name``'s steps (backend eager's) or one backend's first call, in a fresh process."""
    backends = [backend] if backend else args.backends[:1]
    part = h.child(
        "first_compile",
        ["--sizes", str(leaves), "--backends", *backends, "--cells", name, "--only", only]
        + (["--quick"] if args.quick else []),
    )
    return dict(part[title][name])


def per_call(args: argparse.Namespace, record: h.Recorder) -> None:
    leaves = 20 if args.quick else 1000
    model = h.Chain(leaves)
    x = torch.randn(8, 4)
    p = h.flat(fcall.from_module(model).detach().clone())
    variants = {
        "torch.func.functional_call": compiled_call("torch.func", model),
        "fcall.functional_call": compiled_call("functional_call", model),
        "fcall.swap": compiled_call("swap", model),
        "fcall.swap(tie_weights=False)": compiled_call("swap", model, tie_weights=False),
    }
    torch._dynamo.reset()
    compiled = {}
    for name, fn in variants.items():
        compiled[name] = torch.compile(h.fresh(fn, name.replace(".", "_")), fullgraph=True)
    number = 20 if args.quick else 200
    times: dict[str, list[float]] = {name: [] for name in compiled}
    with torch.no_grad():
        for fn in compiled.values():
            h.warm(lambda fn=fn: fn(x, p), 3)
        for _ in range(args.rounds):
            for name, fn in compiled.items():
                times[name].append(h.batch(lambda fn=fn: fn(x, p), number))
    peer, untied = times["torch.func.functional_call"], times["fcall.swap(tie_weights=False)"]
    table = {
        name: {
            "us per call": h.median(samples) * 1e6,
            "x torch.func": h.paired(samples, peer),
            "x tie_weights=False": h.paired(samples, untied),
        }
        for name, samples in times.items()
    }
    h.print_rows(
        f"Compiled calls, {leaves} leaves (inductor)",
        table,
        ["us per call", "x torch.func", "x tie_weights=False"],
    )
    record.results[f"compiled calls, {leaves} leaves"] = table


SECTIONS = {"first_call": first_call, "per_call": per_call}


def run(args: argparse.Namespace, record: h.Recorder) -> None:
    started = time.perf_counter()
    for section in args.sections:
        SECTIONS[section](args, record)
    if args.plot:
        plot(record.results, args.plot)
    print(f"({time.perf_counter() - started:.0f} s)")


PLOTTED = {
    MODEL: "no swap (the floor)",
    PEER: "torch.func.functional_call",
    "fcall.swap (tensordict)": "fcall.swap",
    "fcall.functional_call (flat)": "fcall.functional_call",
    "fcall.to_module (tensordict)": "fcall.to_module",
}


def plot(results: dict[str, Any], path: str) -> None:
    """Dynamo steps and first-call seconds (aot_eager) against leaves, a line per cell."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tables: dict[int, dict[str, Any]] = {}
    for title, table in results.items():  # a size's "apart" rows after, and over, the others
        if title.startswith("first compile"):
            size = int(title.split(", ")[1].split()[0].replace(",", ""))
            tables.setdefault(size, {}).update(table)
    sizes = sorted(tables)
    fig, (steps_ax, seconds_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for cell, label in PLOTTED.items():
        found = [n for n in sizes if cell in tables[n]]
        steps_ax.plot(found, [tables[n][cell]["steps"] for n in found], "o-", label=label)
        timed = [n for n in found if "aot_eager s" in tables[n][cell]]
        seconds = [tables[n][cell]["aot_eager s"] for n in timed]
        seconds_ax.plot(timed, seconds, "o-", label=label)
    for ax, title in ((steps_ax, "Dynamo steps"), (seconds_ax, "first call, CPU s (aot_eager)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("leaves")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    steps_ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")
