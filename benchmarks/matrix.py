"""Every API x params container x kind of value, eager and compiled, beside torch.func.

    python -m benchmarks matrix            # the whole matrix (~2 h in one process), JSON, plot
    python -m benchmarks matrix --quick    # tiny sizes, few rounds, aot_eager only (< 2 min)
    python -m benchmarks matrix --only "to_module . TensorDict . plain" --sections compiled

A cell is ``api | container | kind`` (``CELLS``, the product of ``APIS``, ``CONTAINERS``
and ``KINDS``): ``swap`` (``with fcall.swap(p, m)``), ``to_module`` (``with
fcall.to_module(p, m)``), ``functional_call``; a nested ``TensorDict``, a ``flat dict``, a
``nested dict``, a ``TensorDictParams`` (``no_convert=True`` unless the kind is
Parameter), a ``TD with _last_op`` (what tensordict's own ``to_module`` returns); ``plain``
tensors, ``Parameter``, ``requires_grad``. The model is ``Chain`` (``Linear(4, 4)``
layers); every cell and peer has a module of its own. A cell's peer is torch.func with a
flat dict of the same tensors. Sections (``SECTIONS``):

1. ``eager``: swap + restore, a ``forward`` that reads nothing, against
   ``_reparametrize_module`` (``torch.func.functional_call`` for ``functional_call``),
   tensordict's ``to_module`` beside; each size in a process of its own.
2. ``compiled``: ``f(x, p)`` that swaps and calls (``fullgraph=True``, per backend)
   against ``torch.compile`` of ``torch.func.functional_call``: per call; first compile in
   CPU seconds, each peer compiling at the start, middle and end of the section (at 100
   leaves and fewer that schedule three times); the guard check alone.
3. ``guards``: guard check per call of ``fcall.swap`` with each container (eager backend,
   forward reads nothing) against torch.func's, every container holding the same tensors;
   each size in a process of its own, built ``--builds`` times, medians over builds.

docs/performance.md, "Method", says why each choice was made.
"""

from __future__ import annotations

import argparse
import gc
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict
from torch import nn
from torch.nn.utils.stateless import _reparametrize_module

import fcall

from . import _harness as h

APIS = ("swap", "to_module", "functional_call")
CONTAINERS = ("TensorDict", "flat dict", "nested dict", "TensorDictParams", "TD with _last_op")
KINDS = ("plain", "Parameter", "requires_grad")
CELLS = [f"{a} | {c} | {k}" for a in APIS for c in CONTAINERS for k in KINDS]
# The targets, as ratios to torch.func (eager, compiled per call, first compile)
TARGETS = {"eager": 0.25, "call": 1.1, "compile": 1.0}


@dataclass(frozen=True)
class Section:
    """A section's sizes and rounds, full and ``--quick``; ``apart``: each size in a
    process of its own."""

    sizes: tuple[int, ...]
    quick_sizes: tuple[int, ...]
    rounds: int = 15
    quick_rounds: int = 3
    apart: bool = False


SECTIONS = {
    "eager": Section((100, 1000, 10_000), (4, 16), apart=True),
    "compiled": Section((100, 1000), (4,)),
    "guards": Section((100, 1000, 10_000), (4, 16), apart=True),
}


def kind_values(model: nn.Module, kind: str) -> TensorDict:
    """A nested TensorDict of new values for ``model``, of one kind."""
    td = fcall.from_module(model).detach().clone()
    if kind == "Parameter":
        return td.apply(nn.Parameter)
    if kind == "requires_grad":
        return td.apply(lambda t: t.requires_grad_())
    return td


def container(td: TensorDict, name: str, kind: str) -> Any:
    """The values of ``td`` held by the container ``name``."""
    if name == "TensorDict":
        return td
    if name == "flat dict":
        return h.flat(td)
    if name == "nested dict":
        return td.to_dict()
    if name == "TensorDictParams":
        return fcall.TensorDictParams(td, no_convert=kind != "Parameter")
    if name == "TD with _last_op":
        # tensordict's to_module returns the values it swapped out, carrying _last_op: the
        # scratch module's own Parameters, then td's own tensors in their place
        carrier = td.to_module(h.Chain(len(td.keys(True, True)))).update(td)
        assert carrier.__dict__.get("_last_op") is not None
        assert all(a is b for a, b in zip(carrier.values(True, True), td.values(True, True)))
        return carrier
    raise ValueError(name)


def parse(cell: str) -> tuple[str, str, str]:
    api, container_name, kind = cell.split(" | ")
    return api, container_name, kind


def build(name: str, leaves: int, reads: bool, values: TensorDict | None = None):
    """A module of its own for the cell or peer ``name``, and its params."""
    _, container_name, kind = parse(name)
    model = h.Chain(leaves, reads=reads)
    values = kind_values(model, kind) if values is None else values
    return model, container(values, container_name, kind)


def swap_and_call(api: str, model: nn.Module) -> Callable:
    if api == "swap":

        def call(x, p):
            with fcall.swap(p, model):
                return model(x)

    elif api == "to_module":

        def call(x, p):
            with fcall.to_module(p, model):
                return model(x)

    elif api == "functional_call":

        def call(x, p):
            return fcall.functional_call(model, p, (x,))

    elif api == "torch.func":

        def call(x, p):
            return torch.func.functional_call(model, p, (x,))

    else:
        raise ValueError(api)
    return call


def eager_swap(api: str, model: nn.Module, params: Any, x: torch.Tensor) -> h.Fn:
    """Swap and restore (``functional_call``s: a call of a forward that reads nothing)."""
    if api == "swap":

        def run():
            with fcall.swap(params, model):
                pass

    elif api == "to_module":

        def run():
            with fcall.to_module(params, model):
                pass

    elif api == "functional_call":

        def run():
            return fcall.functional_call(model, params, (x,))

    elif api == "torch.func machinery":

        def run():
            with _reparametrize_module(model, params):
                pass

    elif api == "torch.func.functional_call":

        def run():
            return torch.func.functional_call(model, params, (x,))

    elif api == "tensordict":

        def run():
            with params.to_module(model):
                pass

    else:
        raise ValueError(api)
    return run


def eager_peer(cell: str) -> str:
    api, _, kind = parse(cell)
    name = "torch.func.functional_call" if api == "functional_call" else "torch.func machinery"
    return f"{name} | flat dict | {kind}"


def compiled_peer(cell: str) -> str:
    return f"torch.func | flat dict | {parse(cell)[2]}"


def peer_or_self(cells: list[str], peer: Callable[[str], str]) -> Callable[[str], str]:
    return lambda name: peer(name) if name in cells else name


def eager_section(cells: list[str], leaves: int, rounds: int, budget_s: float) -> dict:
    """Per cell and peer: µs per swap + restore (median), and the cell's ratio."""
    x = torch.randn(8, 4)
    fns: dict[str, h.Fn] = {}
    peers = {eager_peer(cell) for cell in cells}
    peers |= {f"tensordict | TensorDict | {parse(c)[2]}" for c in cells if "| TensorDict |" in c}
    for name in [*cells, *sorted(peers)]:
        model, params = build(name, leaves, reads=False)
        fns[name] = eager_swap(parse(name)[0], model, params, x)
        h.warm(fns[name], 2)  # fcall: its cached plan
    number = h.calls_in(fns[cells[0]], budget_s, most=200)
    times, beside = h.rounds_of(fns, rounds, number, peer_or_self(cells, eager_peer))
    row: dict[str, dict[str, float]] = {}
    for name, samples in times.items():
        row[name] = {"us": h.median(samples) * 1e6}
        if name in cells:
            row[name]["ratio"] = h.paired(samples, beside[name])
    h.print_rows(f"eager, {leaves} leaves", row, ("us", "ratio"), cells)
    return row


def _warm_compile(backend: str, leaves: int, x: torch.Tensor) -> None:
    """Compile a model of this size once (discarded): lazy imports, and inductor's C++
    kernels, which are cached by their source, so that no peer pays the C++ compiler."""
    model = h.Chain(leaves)
    call = h.fresh(swap_and_call("torch.func", model), "warm")
    with torch.no_grad():
        torch.compile(call, backend=backend, fullgraph=True)(x, h.flat(kind_values(model, "plain")))


def compiled_section(
    cells: list[str], leaves: int, backend: str, rounds: int, number: int, repeats: int
) -> dict:
    """Per cell and peer: first compile, µs per call and per guard check, ratios."""
    x = torch.randn(8, 4)
    torch._dynamo.reset()
    _warm_compile(backend, leaves, x)
    compiled: dict[str, tuple[Callable, Callable, Any]] = {}
    compiles: dict[str, list[float]] = {}  # CPU seconds, see h.cpu_seconds
    wall: dict[str, list[float]] = {}
    peers = sorted({compiled_peer(cell) for cell in cells})
    # Each peer compiles at the start, in the middle and at the end, and a cell's first
    # compile is set against the median of its peer's: the machine's load drifts over the
    # section. The last compile is the one timed per call.
    half = len(cells) // 2
    schedule = [*peers, *cells[:half], *peers, *cells[half:], *peers] * repeats
    for index, name in enumerate(schedule):
        model, params = build(name, leaves, reads=True)
        call = h.fresh(swap_and_call(parse(name)[0], model), f"cell_{index}")
        fn = torch.compile(call, backend=backend, fullgraph=True)
        with torch.no_grad():
            cpu, seconds = h.first_call(lambda: fn(x, params))
        compiles.setdefault(name, []).append(cpu)
        wall.setdefault(name, []).append(seconds)
        compiled[name] = (fn, call, params)
    first = {name: h.median(seconds) for name, seconds in compiles.items()}
    with torch.no_grad():
        calls = {name: (lambda fn=fn, p=p: fn(x, p)) for name, (fn, _, p) in compiled.items()}
        times, beside = h.rounds_of(calls, rounds, number, peer_or_self(cells, compiled_peer))
        checks = {name: h.guard_check(call, x, p) for name, (_, call, p) in compiled.items()}
        checked = {name: check for name, check in checks.items() if check is not None}
        guard_times, guards_beside = h.rounds_of(
            checked, 5, 20, peer_or_self([c for c in cells if c in checked], compiled_peer)
        )
    row: dict[str, dict[str, float]] = {}
    for name in [*cells, *peers]:
        row[name] = {
            "us": h.median(times[name]) * 1e6,
            "compile_s": first[name],
            "compile_wall_s": h.median(wall[name]),
        }
        if name in guard_times:
            row[name]["guard_us"] = h.median(guard_times[name]) * 1e6
        if name in cells:
            row[name]["ratio"] = h.paired(times[name], beside[name])
            row[name]["compile_ratio"] = first[name] / first[compiled_peer(name)]
            if name in guards_beside:
                row[name]["guard_ratio"] = h.paired(guard_times[name], guards_beside[name])
    fields = ("us", "ratio", "compile_s", "compile_ratio", "guard_us", "guard_ratio")
    h.print_rows(f"compiled ({backend}), {leaves} leaves", row, fields, cells)
    torch._dynamo.reset()
    return row


def guard_section(leaves: int, rounds: int, builds: int, kind: str = "Parameter") -> dict:
    """Guard check per call: fcall.swap with each container against torch.func, every
    container holding the same tensors (a TensorDictParams wraps the very TensorDict of
    the TensorDict cell), so that what differs is the containers' guards.

    A guard check's time follows where the guard tree and its objects lie in memory, so
    the size is built ``builds`` times (the build order rotated), each build measured in
    rounds beside torch.func's check; ``guard_us`` and ``ratio`` are medians over builds,
    ``builds`` keeps each build's ratio, and ``to_tensordict`` is the median over builds of
    the cell's ratio over the TensorDict cell's (both run as often, beside the same peer)."""
    names = [f"swap | {c} | {kind}" for c in CONTAINERS] + [f"torch.func | flat dict | {kind}"]
    per_build = [
        _guard_build(names, leaves, b * len(names) // builds, rounds) for b in range(builds)
    ]
    row: dict[str, dict[str, Any]] = {}
    for name in names:
        done = [b[name] for b in per_build if name in b]
        if len(done) < builds:  # a build recompiled: its guards are not this cell's alone
            row[name] = {"guard_us": float("nan"), "ratio": float("nan")}
            continue
        row[name] = {
            "guard_us": h.median(b["guard_us"] for b in done),
            "ratio": h.median(b["ratio"] for b in done),
            "builds": [round(b["ratio"], 3) for b in done],
        }
    base = row[names[0]]
    for values in row.values():
        if "builds" in values and "builds" in base:
            values["to_tensordict"] = h.paired(values["builds"], base["builds"])
    h.print_rows(
        f"guard check per call, {leaves} leaves, medians of {builds} builds",
        row,
        ("guard_us", "ratio", "to_tensordict"),
        names[:-1],
    )
    return row


def _guard_build(names: list[str], leaves: int, first: int, rounds: int) -> dict:
    """One build of every guard cell, from ``names[first]`` on, and its rounds beside
    torch.func's check (``names[-1]``)."""
    torch._dynamo.reset()
    gc.collect()
    x = torch.randn(8, 4)
    peer = names[-1]
    checks: dict[str, h.Fn] = {}
    values: TensorDict | None = None  # every cell's container holds the same tensors
    with torch.no_grad():
        for name in names[first:] + names[:first]:
            model = h.Chain(leaves, reads=False)
            values = kind_values(model, parse(name)[2]) if values is None else values
            _, params = build(name, leaves, reads=False, values=values)
            call = h.fresh(swap_and_call(parse(name)[0], model), f"guards_{names.index(name)}")
            torch.compile(call, backend="eager", fullgraph=True)(x, params)
            check = h.guard_check(call, x, params)
            if check is not None:
                checks[name] = check
        times, beside = h.rounds_of(checks, rounds, 20, lambda n: peer if n != peer else n)
    measured = {}
    for name in checks:
        ratio = h.paired(times[name], beside[name]) if name != peer else 1.0
        measured[name] = {"guard_us": h.median(times[name]) * 1e6, "ratio": ratio}
    del checks
    torch._dynamo.reset()
    return measured


def extremes(results: dict[str, Any]) -> dict[str, Any]:
    """The slowest and the fastest cell of each table, by ratio to torch.func."""
    found: dict[str, Any] = {}
    for table, sizes in results.items():
        if not table.startswith(("eager", "compiled")):
            continue
        for leaves, row in sizes.items():
            ratios = {c: row[c]["ratio"] for c in CELLS if "ratio" in row.get(c, {})}
            if ratios:
                slow, fast = max(ratios, key=ratios.get), min(ratios, key=ratios.get)
                found[f"{table} @ {leaves}"] = {
                    "slowest": [slow, ratios[slow]],
                    "fastest": [fast, ratios[fast]],
                }
    return found


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--only", help="a regular expression: the cells to run")
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--backends", help="default: inductor,aot_eager (quick: aot_eager)")
    parser.add_argument("--sizes", help="leaves, comma-separated, for every section")
    parser.add_argument(
        "--builds", type=int, help="guards: builds per size (default 6, 3 above 1,000; quick 2)"
    )
    parser.add_argument(
        "--plot", help="PNG path (default: docs/perf_matrix.png; not in quick; none: no plot)"
    )


def run(args: argparse.Namespace, record: h.Recorder) -> None:
    h.isolate_compiles()
    cells = [c for c in CELLS if args.only is None or re.search(args.only, c)]
    if not cells:
        raise SystemExit(f"--only {args.only!r} matches no cell")
    quick, results = args.quick, record.results
    backends = (args.backends or ("aot_eager" if quick else "inductor,aot_eager")).split(",")
    for section in args.sections.split(","):
        spec = SECTIONS[section]
        sizes = [int(n) for n in args.sizes.split(",")] if args.sizes else None
        sizes = sizes or list(spec.quick_sizes if quick else spec.sizes)
        rounds = spec.quick_rounds if quick else spec.rounds
        if spec.apart and len(sizes) > 1:  # see docs/performance.md, "Method"
            same = [*(["--quick"] * quick), *(["--only", args.only] if args.only else [])]
            same += ["--builds", str(args.builds)] if args.builds else []
            runs = [
                ["--sections", section, "--sizes", str(n), "--plot", "none", *same] for n in sizes
            ]
            merged = h.apart("matrix", runs)
            results[section] = merged[section]
            results["meta"].setdefault("parts", []).extend(merged["meta"]["parts"])
        elif section == "eager":
            budget = 0.0005 if quick else 0.004
            results[section] = {str(n): eager_section(cells, n, rounds, budget) for n in sizes}
        elif section == "guards":
            builds = args.builds or (2 if quick else 6 if sizes[0] <= 1000 else 3)
            results[section] = {str(n): guard_section(n, rounds, builds) for n in sizes}
        else:
            for backend in backends:
                results[f"compiled {backend}"] = {
                    str(n): compiled_section(
                        cells,
                        n,
                        backend,
                        rounds,
                        2 if quick else 10,
                        3 if n <= 100 and not quick else 1,
                    )
                    for n in sizes
                }
                results["extremes"] = extremes(results)
                record.save()
        results["extremes"] = extremes(results)
        record.save()
    print("\nslowest and fastest cell of each table (ratio to torch.func):")
    for table, pair in results["extremes"].items():
        (slow, slow_ratio), (fast, fast_ratio) = pair["slowest"], pair["fastest"]
        print(f"  {table:<28} slowest {slow:<48}{slow_ratio:>7.2f}x", end="")
        print(f"   fastest {fast:<48}{fast_ratio:>7.2f}x")
    if args.plot != "none" and (args.plot or not quick):
        from ._report import plot_matrix

        record.save(done=True)  # before the plot: a missing matplotlib loses no measurement
        plot_matrix(results, args.plot or h.ROOT / "docs" / "perf_matrix.png")
