"""Every API x params container x kind of value, eager and compiled, beside torch.func.

Run from the repository root:

    python benchmarks/matrix.py            # the whole matrix (~2 h in one process), JSON, plot
    python benchmarks/matrix.py --quick    # tiny sizes, few rounds, aot_eager only (< 2 min)
    python benchmarks/matrix.py --only "to_module | TensorDict | plain" --sections compiled
    python benchmarks/matrix.py --markdown benchmarks/results/matrix.json  # a run's tables

A cell is ``api | container | kind``:

- api: ``swap`` (``with fcall.swap(p, m)``), ``to_module`` (``with fcall.to_module(p, m)``,
  ``preserve_module_state=True``), ``functional_call`` (``fcall.functional_call(m, p, (x,))``);
- container: ``TensorDict`` (nested), ``flat dict`` (``"0.weight"`` keys), ``nested dict``,
  ``TensorDictParams`` (``fcall.TensorDictParams``: the default conversion for Parameters,
  ``no_convert=True`` otherwise, so that it holds the kind's values), ``TD with _last_op`` (the
  TensorDict of values that tensordict's own ``to_module`` returns: it carries ``_last_op``);
- kind: ``plain`` (detached tensors, a target network's values), ``Parameter``
  (``nn.Parameter``), ``requires_grad`` (plain tensors that require grad).

The model is ``nn.Sequential`` of ``Linear(4, 4)`` (two leaves per layer); every cell and
every peer has a module of its own (fcall caches a plan per module). The peer
of a cell is torch.func with a flat dict of the same tensors:

1. Eager swap + restore, the module's ``forward`` reading nothing (what is timed is the swap):
   ``swap`` / ``to_module`` against ``torch.nn.utils.stateless._reparametrize_module`` (the
   machinery of ``torch.func.functional_call``), ``functional_call`` against
   ``torch.func.functional_call``; tensordict's ``with td.to_module(m)`` beside, for reference.
2. Compiled ``f(x, p)`` that swaps and calls (``fullgraph=True``, each backend), against
   ``torch.compile(lambda x, p: torch.func.functional_call(m, p, (x,)))`` with a flat dict of
   the same tensors: per call; first compile, in CPU seconds of the process and the C++
   compiler it waits for (inductor compiles in-process, ``compile_threads = 1``; the wall time
   is kept beside it), each peer compiling three times, at the start, middle and end of the
   section, and a cell set against its peer's median (at 100 leaves and fewer, that whole
   schedule three times: each cell's compile is a median of three, each peer's of nine; the
   garbage collector frozen before each compile, so that it walks only that compile's
   objects); and the guard check alone (the guard
   manager of the compiled frame's cache entry, called on the frame's arguments), in rounds
   beside its peer's.
3. Guard check per call against leaves (``eager`` backend, a ``forward`` that reads no
   parameter, so the guards are the swap's): ``fcall.swap`` with each container against
   ``torch.func.functional_call``, every container holding the same tensors; each size
   built several times (``--builds``, the build order rotated), medians over the builds.

Everything runs in one thread, under ``torch.no_grad()`` when compiled; each size of the
eager and guard sections in a process of its own (``sizes_apart``), the rest in one. Each
section runs in rounds; in each round every cell runs one batch right beside a batch of its
peer (before it in even rounds, after it in odd ones, the cells in reversed order every
other round), and a cell's ratio is the median over rounds of its batch's time over the
peer batch beside it, so load that comes and goes on a shared machine hits both alike.
Times are medians.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import tensordict
import torch
from tensordict import TensorDict
from torch import nn
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch.nn.utils.stateless import _reparametrize_module

import fcall

ROOT = Path(__file__).resolve().parent.parent
APIS = ("swap", "to_module", "functional_call")
CONTAINERS = ("TensorDict", "flat dict", "nested dict", "TensorDictParams", "TD with _last_op")
KINDS = ("plain", "Parameter", "requires_grad")
CELLS = [f"{a} | {c} | {k}" for a in APIS for c in CONTAINERS for k in KINDS]
# The targets, as ratios to torch.func (eager, compiled per call, first compile)
TARGETS = {"eager": 0.25, "call": 1.1, "compile": 1.0}


class Chain(nn.Sequential):
    """``Linear(4, 4)`` layers, two leaves each; ``forward`` reads them all, or none."""

    def __init__(self, leaves: int, reads: bool = True) -> None:
        super().__init__(*[nn.Linear(4, 4) for _ in range(max(1, leaves // 2))])
        self.reads = reads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) if self.reads else x


def kind_values(model: nn.Module, kind: str) -> TensorDict:
    """A nested TensorDict of new values for ``model``, of one kind."""
    td = fcall.from_module(model).detach().clone()
    if kind == "Parameter":
        return td.apply(nn.Parameter)
    if kind == "requires_grad":
        return td.apply(lambda t: t.requires_grad_())
    return td


def flat(td: TensorDict) -> dict[str, torch.Tensor]:
    return {".".join(key): value for key, value in td.items(True, True)}


def container(td: TensorDict, name: str, kind: str, model: nn.Module) -> Any:
    """The values of ``td`` held by the container ``name``."""
    if name == "TensorDict":
        return td
    if name == "flat dict":
        return flat(td)
    if name == "nested dict":
        return td.to_dict()
    if name == "TensorDictParams":
        return fcall.TensorDictParams(td, no_convert=kind != "Parameter")
    if name == "TD with _last_op":
        # tensordict's to_module returns the values it swapped out, carrying _last_op: the
        # scratch module's own Parameters, then td's own tensors in their place (the values
        # that to_module hands back for td's would be Parameters made of plain ones)
        scratch = Chain(len(td.keys(True, True)))
        carrier = td.to_module(scratch).update(td)
        assert carrier.__dict__.get("_last_op") is not None
        assert all(a is b for a, b in zip(carrier.values(True, True), td.values(True, True)))
        return carrier
    raise ValueError(name)


def parse(cell: str) -> tuple[str, str, str]:
    api, container_name, kind = cell.split(" | ")
    return api, container_name, kind


def fresh(fn: Callable, name: str) -> Callable:
    """``fn`` with a code object of its own: Dynamo caches per code object, and closures
    from one ``def`` share theirs (one cell's guards would be checked by every other)."""
    code = fn.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


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


def eager_swap(api: str, model: nn.Module, params: Any, x: torch.Tensor) -> Callable[[], Any]:
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


def in_turn(items: dict[str, Any], round_: int) -> list[tuple[str, Any]]:
    """In reversed order every other round: no one always runs right after the same one."""
    order = list(items.items())
    return order[::-1] if round_ % 2 else order


def _batch(fn: Callable[[], Any], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def rounds_of(
    fns: dict[str, Callable[[], Any]], rounds: int, number: int, peer_of: Callable[[str], str]
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Seconds per call, one batch of ``number`` calls per round: each cell's batch right
    beside a batch of its peer (before it in even rounds, after it in odd ones), so that
    load that comes and goes hits both alike; the other functions once per round.
    Returns the times of every function and, per cell, its peer's batches beside it."""
    cells = [name for name in fns if peer_of(name) in fns and peer_of(name) != name]
    times: dict[str, list[float]] = {name: [] for name in fns}
    beside: dict[str, list[float]] = {name: [] for name in cells}
    others = {name: fn for name, fn in fns.items() if name not in cells}
    for round_ in range(rounds):
        for name in cells if round_ % 2 == 0 else cells[::-1]:
            peer = peer_of(name)
            if round_ % 2:
                times[name].append(_batch(fns[name], number))
            beside[name].append(_batch(fns[peer], number))
            times[peer].append(beside[name][-1])
            if not round_ % 2:
                times[name].append(_batch(fns[name], number))
        for name, fn in in_turn(others, round_):
            if not any(peer_of(cell) == name for cell in cells):
                times[name].append(_batch(fn, number))
    return times, beside


def paired(times: list[float], base: list[float]) -> float:
    return statistics.median(t / b for t, b in zip(times, base))


def _peer_or_self(cells: list[str], peer: Callable[[str], str]) -> Callable[[str], str]:
    return lambda name: peer(name) if name in cells else name


def eager_section(
    cells: list[str], sizes: list[int], rounds: int, budget_s: float
) -> dict[str, dict[str, dict[str, float]]]:
    """Per size, per cell and peer: µs per swap + restore (median), and the cell's ratio."""
    results: dict[str, dict[str, dict[str, float]]] = {}
    x = torch.randn(8, 4)
    for leaves in sizes:
        fns: dict[str, Callable[[], Any]] = {}
        peers = {eager_peer(cell) for cell in cells}
        peers |= {
            f"tensordict | TensorDict | {parse(c)[2]}" for c in cells if "| TensorDict |" in c
        }
        for name in [*cells, *sorted(peers)]:
            api, container_name, kind = parse(name)
            model = Chain(leaves, reads=False)
            params = container(kind_values(model, kind), container_name, kind, model)
            fns[name] = eager_swap(api, model, params, x)
            for _ in range(2):  # fcall: its cached plan
                fns[name]()
        start = time.perf_counter()
        fns[cells[0]]()
        number = max(1, min(200, int(budget_s / max(time.perf_counter() - start, 1e-6))))
        times, beside = rounds_of(fns, rounds, number, _peer_or_self(cells, eager_peer))
        results[str(leaves)] = row = {}
        for name, samples in times.items():
            row[name] = {"us": statistics.median(samples) * 1e6}
            if name in cells:
                row[name]["ratio"] = paired(samples, beside[name])
        print_section_rows(f"eager, {leaves} leaves", row, cells, ("us", "ratio"))
    return results


def sizes_apart(section: str, sizes: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """A section (``eager`` or ``guards``), each size in a process of its own.

    Run one after the other in one process, a size's models land in the memory the
    previous size's models left, scattered: the swaps of a 1,000-leaf table measured
    after the 100-leaf one took 1.1-2x as long (0.18x -> 0.21-0.32x) in the same run,
    and torch.func's beside them as many microseconds more. A user's program builds its
    model once; each table here does too."""
    table: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix=f"fcall-matrix-{section}-") as parts:
        for leaves in sizes:
            out = Path(parts) / f"{leaves}.json"
            command = [sys.executable, __file__, "--sections", section, "--sizes", str(leaves)]
            command += ["--out", str(out), "--plot", "none"]
            command += ["--quick"] * args.quick + (["--only", args.only] if args.only else [])
            command += ["--builds", str(args.builds)] if args.builds else []
            subprocess.run(command, check=True)
            table.update(json.loads(out.read_text())[section])
    return table


def print_section_rows(
    title: str, row: dict[str, dict[str, float]], cells: list[str], fields: Iterable[str]
) -> None:
    fields = list(fields)
    print(f"\n{title}: " + ", ".join(fields))
    for name, values in row.items():
        mark = "" if name in cells else "  (peer)"
        cells_text = "".join(f"{values[f]:>12.2f}" if f in values else f"{'':>12}" for f in fields)
        print(f"  {name:<52}{cells_text}{mark}")


def _warm_compile(backend: str, leaves: int, x: torch.Tensor) -> None:
    """Compile a model of this size once (discarded): lazy imports, and inductor's C++
    kernels, which are cached by their source, so that no peer pays the C++ compiler."""
    model = Chain(leaves)
    flat_params = flat(kind_values(model, "plain"))
    call = fresh(swap_and_call("torch.func", model), "warm")
    with torch.no_grad():
        torch.compile(call, backend=backend, fullgraph=True)(x, flat_params)


def guard_check(fn: Callable, x: torch.Tensor, params: Any) -> Callable[[], bool] | None:
    """One guard check of ``fn``'s compiled frame on ``(x, params)``: the guard manager of
    its only cache entry, called with the frame's locals (free variables included).
    ``None`` if the frame has several entries (it recompiled)."""
    entries = _debug_get_cache_entry_list(fn.__code__)
    if len(entries) != 1:
        return None
    manager = entries[0].guard_manager
    frame_locals = {"x": x, "p": params}
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        frame_locals[name] = cell.cell_contents
    if not manager.check(frame_locals):
        raise AssertionError(f"guards of {fn.__name__} fail on its own inputs")
    return lambda: manager.check(frame_locals)


def cpu_seconds() -> float:
    """CPU seconds of this process and of the children it waited for (a C++ compiler):
    a compile's cost, where its wall time also holds whatever else the machine ran."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def compiled_peer(cell: str) -> str:
    return f"torch.func | flat dict | {parse(cell)[2]}"


def compiled_section(
    cells: list[str],
    sizes: list[int],
    backend: str,
    rounds: int,
    number: int,
    repeat_compiles_up_to: int = 100,
) -> dict[str, dict[str, dict[str, float]]]:
    """Per size, per cell and peer: first compile, µs per call and per guard check, ratios."""
    x = torch.randn(8, 4)
    results: dict[str, dict[str, dict[str, float]]] = {}
    for leaves in sizes:
        torch._dynamo.reset()
        _warm_compile(backend, leaves, x)
        compiled: dict[str, tuple[Callable, Callable, Any]] = {}
        compiles: dict[str, list[float]] = {}  # CPU seconds, see cpu_seconds
        wall: dict[str, list[float]] = {}
        peers = sorted({compiled_peer(cell) for cell in cells})
        names = [*cells, *peers]
        # Each peer compiles at the start, in the middle and at the end, and a cell's
        # first compile is set against the median of its peer's: a compile is one shot,
        # and the machine's load drifts over the section. Where compiles are cheap (up to
        # repeat_compiles_up_to leaves), the whole schedule runs three times and every
        # cell's first compile is a median of three too. The last compile is the one timed
        # per call.
        half = len(cells) // 2
        schedule = [*peers, *cells[:half], *peers, *cells[half:], *peers]
        schedule *= 3 if leaves <= repeat_compiles_up_to else 1
        for index, name in enumerate(schedule):
            api, container_name, kind = parse(name)
            model = Chain(leaves)
            params = container(kind_values(model, kind), container_name, kind, model)
            call = fresh(swap_and_call(api, model), f"cell_{index}")
            fn = torch.compile(call, backend=backend, fullgraph=True)
            # What the collector would walk during this compile is this compile's own
            # objects: the compiled functions kept before it are not, so a later cell
            # does not pay for the earlier ones' heap.
            gc.collect()
            gc.freeze()
            start, start_cpu = time.perf_counter(), cpu_seconds()
            with torch.no_grad():
                fn(x, params)
            wall.setdefault(name, []).append(time.perf_counter() - start)
            compiles.setdefault(name, []).append(cpu_seconds() - start_cpu)
            compiled[name] = (fn, call, params)
        first = {name: statistics.median(seconds) for name, seconds in compiles.items()}
        with torch.no_grad():
            times, beside = rounds_of(
                {name: (lambda fn=fn, p=p: fn(x, p)) for name, (fn, _, p) in compiled.items()},
                rounds,
                number,
                _peer_or_self(cells, compiled_peer),
            )
            checks = {name: guard_check(call, x, p) for name, (_, call, p) in compiled.items()}
            guard_times, guards_beside = rounds_of(
                {name: check for name, check in checks.items() if check is not None},
                5,
                20,
                _peer_or_self([c for c in cells if checks[c] is not None], compiled_peer),
            )
        results[str(leaves)] = row = {}
        for name in names:
            row[name] = {
                "us": statistics.median(times[name]) * 1e6,
                "compile_s": first[name],
                "compile_wall_s": statistics.median(wall[name]),
            }
            if name in guard_times:
                row[name]["guard_us"] = statistics.median(guard_times[name]) * 1e6
            if name in cells:
                peer = compiled_peer(name)
                row[name]["ratio"] = paired(times[name], beside[name])
                row[name]["compile_ratio"] = first[name] / first[peer]
                if name in guards_beside:
                    row[name]["guard_ratio"] = paired(guard_times[name], guards_beside[name])
        fields = ("us", "ratio", "compile_s", "compile_ratio", "guard_us", "guard_ratio")
        print_section_rows(f"compiled ({backend}), {leaves} leaves", row, cells, fields)
    torch._dynamo.reset()
    return results


GUARD_CONTAINERS = (
    "TensorDict",
    "flat dict",
    "nested dict",
    "TensorDictParams",
    "TD with _last_op",
)


def guard_section(
    sizes: list[int], rounds: int, builds: int, kind: str = "Parameter"
) -> dict[str, dict[str, Any]]:
    """Guard check per call against leaves: fcall.swap with each container, torch.func,
    every container holding the same tensors (a TensorDictParams wraps the very TensorDict
    of the TensorDict cell), so that what differs is the containers' guards.

    A guard check walks the frame's guard tree and the objects it guards, so its time
    follows where they lie in memory: with tensors of their own, cells with the same guards
    measured 0.75-1.5x each other. So each size is built ``builds`` times (the cells' build
    order rotated each time, models and compiles dropped between builds), and each build
    measured in rounds, each check's batch beside a batch of torch.func's (as
    ``rounds_of``). A cell's ``guard_us`` and ``ratio`` are medians over the builds of each
    build's; ``builds`` keeps each build's ratio. ``to_tensordict`` is the median over the
    builds of the cell's ratio over the TensorDict cell's (``guard_ratios_to``): both run as
    often, beside the same peer. (Paired with the TensorDict cell directly, that cell ran
    once beside each of the others, five times as often as each, stayed warmer in cache,
    and measured 10-17% faster than the ratios to torch.func said.)"""
    results: dict[str, dict[str, Any]] = {}
    peer = f"torch.func | flat dict | {kind}"
    names = [f"swap | {c} | {kind}" for c in GUARD_CONTAINERS] + [peer]
    for leaves in sizes:
        per_build = [
            _guard_build(names, leaves, b * len(names) // builds, rounds) for b in range(builds)
        ]
        results[str(leaves)] = row = {}
        for name in names:
            done = [build[name] for build in per_build if name in build]
            if len(done) < builds:  # a build recompiled: its guards are not this cell's alone
                row[name] = {"guard_us": float("nan"), "ratio": float("nan")}
                continue
            row[name] = {
                "guard_us": statistics.median(b["guard_us"] for b in done),
                "ratio": statistics.median(b["ratio"] for b in done),
                "builds": [round(b["ratio"], 3) for b in done],
            }
        for name, ratio in guard_ratios_to(row, names[0]).items():
            row[name]["to_tensordict"] = ratio
        print_section_rows(
            f"guard check per call, {leaves} leaves, medians of {builds} builds "
            "(eager backend, forward reads nothing)",
            row,
            names[:-1],
            ("guard_us", "ratio", "to_tensordict"),
        )
    return results


def _guard_build(
    names: list[str], leaves: int, first: int, rounds: int
) -> dict[str, dict[str, float]]:
    """One build of every guard cell, from ``names[first]`` on, and its rounds beside
    torch.func's check (``names[-1]``)."""
    torch._dynamo.reset()
    gc.collect()
    x = torch.randn(8, 4)
    peer = names[-1]
    checks: dict[str, Callable[[], Any]] = {}
    values: TensorDict | None = None  # every cell's container holds the same tensors
    with torch.no_grad():
        for name in names[first:] + names[:first]:
            api, container_name, kind = parse(name)
            model = Chain(leaves, reads=False)
            values = kind_values(model, kind) if values is None else values
            params = container(values, container_name, kind, model)
            call = fresh(swap_and_call(api, model), f"guards_{names.index(name)}")
            torch.compile(call, backend="eager", fullgraph=True)(x, params)
            check = guard_check(call, x, params)
            if check is not None:
                checks[name] = check
        times, beside = rounds_of(checks, rounds, 20, lambda n: peer if n != peer else n)
    measured = {}
    for name in checks:
        ratio = paired(times[name], beside[name]) if name != peer else 1.0
        measured[name] = {"guard_us": statistics.median(times[name]) * 1e6, "ratio": ratio}
    del checks
    torch._dynamo.reset()
    return measured


def guard_ratios_to(row: dict[str, dict[str, Any]], base: str) -> dict[str, float]:
    """Each guard cell's ratio to ``base``: the median over builds of its ratio to
    torch.func over ``base``'s in the same build."""
    return {
        name: paired(values["builds"], row[base]["builds"])
        for name, values in row.items()
        if "builds" in values and "builds" in row[base]
    }


def extremes(results: dict[str, Any], cells: list[str]) -> dict[str, Any]:
    """The slowest and the fastest cell of each table, by ratio to torch.func."""
    found: dict[str, Any] = {}
    for table, sizes in results.items():
        if not isinstance(sizes, dict) or table in ("meta", "guards", "extremes"):
            continue
        for leaves, row in sizes.items():
            ratios = {c: row[c]["ratio"] for c in cells if c in row and "ratio" in row[c]}
            if ratios:
                slow, fast = max(ratios, key=ratios.get), min(ratios, key=ratios.get)
                found[f"{table} @ {leaves}"] = {
                    "slowest": [slow, ratios[slow]],
                    "fastest": [fast, ratios[fast]],
                }
    return found


def plot(results: dict[str, Any], cells: list[str], path: Path) -> None:
    """A heat map of every cell's ratio to torch.func, one column per table and size; the
    slowest and the fastest cell of each column are boxed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    columns, targets = [], []
    for table, sizes in results.items():
        if table in ("meta", "guards", "extremes") or not isinstance(sizes, dict):
            continue
        target = TARGETS["eager"] if table == "eager" else TARGETS["call"]
        for leaves, row in sizes.items():
            columns.append((f"{table}\n{leaves}", [row.get(c, {}).get("ratio") for c in cells]))
            targets.append(target)
    fig, ax = plt.subplots(figsize=(2.0 + 1.25 * len(columns), 0.28 * len(cells) + 1.8))
    for j, ((_, ratios), target) in enumerate(zip(columns, targets)):
        known = [r for r in ratios if r is not None]
        slow, fast = (max(known), min(known)) if known else (None, None)
        for i, ratio in enumerate(ratios):
            if ratio is None:
                continue
            shade = min(1.0, ratio / target / 2)  # 0.5: at the target
            colour = (shade, 1 - shade, 0.25, 0.55)
            ax.add_patch(Rectangle((j, i), 1, 1, facecolor=colour, edgecolor="white"))
            ax.text(j + 0.5, i + 0.5, f"{ratio:.2f}", ha="center", va="center", fontsize=7)
            if ratio in (slow, fast):
                ax.add_patch(Rectangle((j, i), 1, 1, fill=False, edgecolor="black", lw=1.5))
    ax.set_xlim(0, len(columns))
    ax.set_ylim(len(cells), 0)
    ax.set_xticks([j + 0.5 for j in range(len(columns))], [c for c, _ in columns], fontsize=7)
    ax.set_yticks([i + 0.5 for i in range(len(cells))], cells, fontsize=7)
    ax.xaxis.tick_top()
    ax.set_title(
        "fcall / torch.func, every cell (boxed: slowest and fastest of each column;\n"
        f"targets: eager <= {TARGETS['eager']}x, compiled per call <= {TARGETS['call']}x)",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown(results: dict[str, Any]) -> str:
    """The run as markdown tables: every cell's ratios, then the guard section."""
    columns = []
    for table, sizes in results.items():
        if table.startswith(("eager", "compiled")):
            name = table.replace("compiled ", "")
            for leaves, row in sizes.items():
                columns.append((f"{name} {int(leaves):,}", row, "ratio"))
    for table, sizes in results.items():
        if table.startswith("compiled"):
            for leaves, row in sizes.items():
                label = f"compile {table.replace('compiled ', '')} {int(leaves):,}"
                columns.append((label, row, "compile_ratio"))
    cells = [c for c in CELLS if any(c in row for _, row, _ in columns)]
    lines = [
        "| cell | " + " | ".join(label for label, _, _ in columns) + " |",
        "| --- |" + " ---: |" * len(columns),
    ]
    for cell in cells:
        values = [row.get(cell, {}).get(field) for _, row, field in columns]
        text = ["" if v is None else f"{v:.2f}" for v in values]
        lines.append(f"| {cell.replace(' | ', ' · ')} | " + " | ".join(text) + " |")
    if "guards" in results:
        sizes = list(results["guards"])
        header = "| guard check per call (to torch.func, to TensorDict) | "
        lines += ["", header + " | ".join(f"{int(n):,}" for n in sizes) + " |"]
        lines.append("| --- |" + " ---: |" * len(sizes))
        for name in results["guards"][sizes[0]]:
            row = [results["guards"][n][name] for n in sizes]
            lines.append(
                f"| {name.replace(' | ', ' · ')} | "
                + " | ".join(
                    f"{r['guard_us']:.0f} µs ({r['ratio']:.2f}x, "
                    f"{r.get('to_tensordict', float('nan')):.2f}x)"
                    for r in row
                )
                + " |"
            )
    return "\n".join(lines)


def meta(args: argparse.Namespace) -> dict[str, Any]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "torch": torch.__version__,
        "tensordict": tensordict.__version__,
        "python": platform.python_version(),
        "argv": sys.argv[1:],
        "quick": args.quick,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, few rounds, aot_eager")
    parser.add_argument("--only", help="a regular expression: the cells to run")
    parser.add_argument("--sections", default="eager,compiled,guards")
    parser.add_argument("--backends", help="default: inductor,aot_eager (quick: aot_eager)")
    parser.add_argument("--sizes", help="leaves, comma-separated, for every section")
    parser.add_argument(
        "--builds",
        type=int,
        help="guard section: builds per size (default 6, 3 above 1,000 leaves; quick: 2)",
    )
    parser.add_argument("--markdown", metavar="JSON", help="print a run's tables, run nothing")
    parser.add_argument("--out", help="JSON path (default: results/matrix.json, quick: /tmp)")
    parser.add_argument(
        "--plot", help="PNG path (default: docs/perf_matrix.png; not in quick; none: no plot)"
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="JSON",
        help="write the sections of these runs (e.g. one process per core) as one",
    )
    args = parser.parse_args(argv)
    if args.merge:
        return merge(args.merge, args.out, args.plot)
    if args.markdown:
        results = json.loads(Path(args.markdown).read_text())
        print(markdown(results))
        return results
    torch.set_num_threads(1)
    torch.manual_seed(0)
    torch._inductor.config.fx_graph_cache = False  # a peer must not reuse another's graph
    torch._inductor.config.autotune_local_cache = False
    torch._functorch.config.enable_autograd_cache = False
    torch._inductor.config.compile_threads = 1  # in this process: its CPU time is the compile's
    cells = [c for c in CELLS if args.only is None or re.search(args.only, c)]
    if not cells:
        parser.error(f"--only {args.only!r} matches no cell")
    sections = args.sections.split(",")
    quick = args.quick
    backends = (args.backends or ("aot_eager" if quick else "inductor,aot_eager")).split(",")
    sizes = [int(n) for n in args.sizes.split(",")] if args.sizes else None
    began = time.perf_counter()
    default = (
        Path("/tmp/fcall-matrix-quick.json") if quick else ROOT / "benchmarks/results/matrix.json"
    )
    out = Path(args.out) if args.out else default
    out.parent.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"meta": meta(args)}

    def save(done: bool) -> None:  # after each section: a run cut short keeps what it measured
        results["meta"]["seconds"] = time.perf_counter() - began
        results["meta"]["complete"] = done
        results["extremes"] = extremes(results, cells)
        out.write_text(json.dumps(results, indent=1))

    if "eager" in sections:
        eager_sizes = sizes or ([4, 16] if quick else [100, 1000, 10_000])
        if len(eager_sizes) > 1:
            results["eager"] = sizes_apart("eager", eager_sizes, args)
        else:
            results["eager"] = eager_section(
                cells, eager_sizes, rounds=3 if quick else 15, budget_s=0.0005 if quick else 0.004
            )
        save(False)
    if "compiled" in sections:
        for backend in backends:
            results[f"compiled {backend}"] = compiled_section(
                cells,
                sizes or ([4] if quick else [100, 1000]),
                backend,
                rounds=3 if quick else 15,
                number=2 if quick else 10,
                repeat_compiles_up_to=0 if quick else 100,
            )
            save(False)
    if "guards" in sections:
        guard_sizes = sizes or ([4, 16] if quick else [100, 1000, 10_000])
        if len(guard_sizes) > 1:
            results["guards"] = sizes_apart("guards", guard_sizes, args)
        else:
            builds = args.builds or (2 if quick else 6 if guard_sizes[0] <= 1000 else 3)
            results["guards"] = guard_section(guard_sizes, rounds=3 if quick else 15, builds=builds)
    save(True)
    print("\nslowest and fastest cell of each table (ratio to torch.func):")
    for table, pair in results["extremes"].items():
        print(
            f"  {table:<28} slowest {pair['slowest'][0]:<48}{pair['slowest'][1]:>7.2f}x   "
            f"fastest {pair['fastest'][0]:<48}{pair['fastest'][1]:>7.2f}x"
        )
    print(f"\nwrote {out} ({results['meta']['seconds']:.0f} s)")
    # after the JSON: a missing matplotlib loses no measurement
    if args.plot != "none" and (args.plot or not quick):
        path = Path(args.plot) if args.plot else ROOT / "docs" / "perf_matrix.png"
        plot(results, cells, path)
        print(f"drew {path}")
    return results


def merge(
    paths: list[str], out: str | None, plot_path: str | None, draw: bool = True
) -> dict[str, Any]:
    """The sections of several runs as one result, with the extremes and the plot
    recomputed; ``meta`` keeps each run's own under ``parts``, and ``commits`` lists the
    commits measured (more than one is printed: say which cells each measured)."""
    parts = [json.loads(Path(path).read_text()) for path in paths]
    commits = sorted({part["meta"].get("commit", "") for part in parts})
    if len(commits) != 1:
        print(f"--merge: the runs come from different commits: {commits}")
    results: dict[str, Any] = {
        "meta": {**parts[0]["meta"], "commits": commits, "parts": [p["meta"] for p in parts]}
    }
    for part in parts:
        for table, value in part.items():
            if table not in ("meta", "extremes"):
                results.setdefault(table, {}).update(value)
    results["meta"]["seconds"] = max(part["meta"]["seconds"] for part in parts)
    results["meta"]["complete"] = all(part["meta"]["complete"] for part in parts)
    results["extremes"] = extremes(results, CELLS)
    target = Path(out) if out else ROOT / "benchmarks/results/matrix.json"
    target.write_text(json.dumps(results, indent=1))
    print(f"wrote {target}")
    if draw and plot_path != "none":  # after the JSON: a missing matplotlib loses nothing
        path = Path(plot_path) if plot_path else ROOT / "docs" / "perf_matrix.png"
        plot(results, CELLS, path)
        print(f"drew {path}")
    return results


if __name__ == "__main__":
    main()
