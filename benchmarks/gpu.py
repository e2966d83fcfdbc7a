"""Compiled swaps on a CUDA device beside the model alone, and with CUDA graphs.

    python -m benchmarks gpu                        # every section, CUDA (not yet timed)
    python -m benchmarks gpu --sections reduce_overhead --sets 2,4,8
    python -m benchmarks gpu --quick --device cpu   # the same code paths on CPU: a smoke test

Without a CUDA device (and ``--device cuda``, the default) it prints so, records
``cuda: false`` (``meta`` and the ``device`` table) and runs nothing else.

The model: ``nn.Sequential`` of ``Linear(w, w)`` each followed by ``Tanh``, a batch of 64
rows: ``narrow`` is 50 x ``Linear(64, 64)`` (100 leaves: Python overhead matters),
``wide`` 8 x ``Linear(1024, 1024)`` (16 leaves). Its floor is the model alone: the same
function compiled with the model's own parameters. Every cell is ``f(x, p)`` compiled with
inductor, ``fullgraph=True``, a closure over the model, on a code object of its own; its
``graphs`` column is the count of its Dynamo cache entries (1: it compiled once; more are
recompiles) and its first call's seconds (``compile s``) are its compile (with grad on,
the forward's: AOTAutograd compiles the backward at the first backward).

``per_call``: the model alone, ``fcall.swap`` with a flat dict and with a TensorDict,
``fcall.functional_call`` with a flat dict, ``torch.func.functional_call`` with a flat
dict, grad off (``no_grad``) and on (forward and backward of the output's sum, the sets'
leaves requiring grad). A batch is as many calls as fill about 20 ms and then
``torch.cuda.synchronize()``; batches run in interleaved rounds, each cell's right beside
the model alone's; ``us`` is the median time per call, ``x model`` the median of the paired
ratios. ``max err``: the first output against the eager model.

``reduce_overhead``: ``mode="reduce-overhead"`` (CUDA graph trees), ``no_grad``, the narrow
model, cycling K parameter sets (K = 2, 4, 8, the same compiled functions throughout):
``with fcall.swap(td_k, model)`` with TensorDicts of plain tensors, ``with
fcall.to_module(tdp_k, model)`` with ``fcall.TensorDictParams`` (a Parameter per leaf), the
model alone, and ``torch.func.functional_call`` with flat dicts. Per cell, ``--cycles``
cycles through the K sets, ``torch.compiler.cudagraph_mark_step_begin()`` before each call,
every output cloned at once (a later replay overwrites it) and checked
(``torch.testing.assert_close``, rtol = atol = 1e-4) against an eager copy of the model that
loaded the same set: ``mismatches`` counts the failures.

* ``recordings``: CUDA graphs recorded, new for this K and all so far: the nodes of the
  cudagraph tree manager (inductor counts no recordings as such). Inductor takes a Parameter
  for a static input, whose address a recording fixes, so each set of ``TensorDictParams``
  may need a recording of its own; plain tensors are copied in instead.
* ``copied inputs / replay``: inductor counts the non-static inputs of each recording
  (``counters["inductor"]["cudagraph_recorded_non_static_inputs"]``); each is copied into the
  graph's own buffer on every replay, so this is the tensors copied per call (no counter
  counts the copies themselves).
* ``cudagraph skips``: graphs inductor runs without CUDA graphs
  (``counters["inductor"]["cudagraph_skips"]``: on CPU every graph; on CUDA a mutated input
  or more re-recordings than ``cudagraph_unexpected_rerecord_limit``).
* memory: ``torch.cuda.memory_allocated`` before the first cycle, after it and after the
  last (``growth / cycle``: after the first cycle, over the cycles left; bounded is 0), and
  the peak over the cycles.

Then per call, cycling the K sets, timed as in ``per_call``; a last row counts the
recordings made while timing (none expected). On CPU the mode compiles with inductor and
records no CUDA graph: the CUDA columns read n/a.

``first_call``: the first call (its compile) of the model alone and of ``swap`` with a flat
dict (inductor, ``no_grad``, the narrow model), each in a fresh process, with the caches on
disk cold (a new ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR``) and warm (the same
directories a second time); ``x model`` pairs the wall seconds with the model's.

On the device machine (no network, Python 3.12, torch with CUDA, no tensordict), fcall runs
from the work tree; tensordict and what it needs travel as wheels. Here, at the root:

    pip download tensordict==0.15.3 cloudpickle "pyvers>=0.2,<0.3" numpy --no-deps \\
        --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 -d wheels/

(``PIP_CONFIG_FILE=/dev/null`` in front if a pip config caps the index). tensordict 0.15.3 is
one pure-Python wheel (py3-none-any, 0.9 MB); cloudpickle and pyvers are its other
requirements (typing_extensions only below Python 3.11); numpy, 16 MB, only in case the
image lacks it. ``wheels/`` is git-ignored, so carry it by name with the work tree. There:

    pip install --no-index --find-links wheels tensordict==0.15.3 && \\
        python -m benchmarks gpu --out $OUT/gpu.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from . import _gpu_cells as c
from . import _harness as h

SECTIONS = ("per_call", "reduce_overhead", "first_call")
MODELS = {"narrow": (64, 50), "wide": (1024, 8)}  # width, layers
QUICK_MODEL = (16, 5)
PER_CALL = {  # cell: (body, container)
    "model": ("model", "td"),
    "swap flat": ("swap", "flat"),
    "swap tensordict": ("swap", "td"),
    "functional_call flat": ("functional_call", "flat"),
    "torch.func flat": ("torch.func", "flat"),
}
REDUCE_OVERHEAD = {
    "swap tensordict": ("swap", "td"),
    "to_module TensorDictParams": ("to_module", "tdp"),
    "model": ("model", "td"),
    "torch.func flat": ("torch.func", "flat"),
}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu: a smoke test")
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--grad", nargs="+", default=["off", "on"], choices=["off", "on"])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds")
    parser.add_argument(
        "--sets",
        type=lambda s: [int(n) for n in s.split(",")],
        default=[2, 4, 8],
        help="reduce_overhead: the numbers K of sets cycled (2,4,8)",
    )
    parser.add_argument("--cycles", type=int, default=20, help="reduce_overhead: checked cycles")
    parser.add_argument("--repeat", type=int, default=1, help="first_call: rounds of processes")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # first_call: one process's cell


def timed(
    calls: dict[str, h.Fn], device: torch.device, rounds: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Per cell, ``(us per call, x model)``: batches of calls then a synchronize, in
    interleaved rounds, each beside the model alone's (``_harness.rounds_of``)."""

    def batch_of(call: h.Fn, number: int) -> h.Fn:
        def run() -> None:
            for _ in range(number):
                call()
            c.synchronize(device)

        return run

    def one(call: h.Fn) -> h.Fn:
        return batch_of(call, 1)

    number = h.calls_in(one(calls["model"]), 0.02, most=500) if "model" in calls else 50
    batches = {name: batch_of(call, number) for name, call in calls.items()}
    gc.collect()
    gc.freeze()  # the cells' models and sets: not walked by every collection
    try:
        times, beside = h.rounds_of(batches, rounds, 1, peer_of=lambda name: "model")
    finally:
        gc.unfreeze()
    us = {name: h.median(samples) / number * 1e6 for name, samples in times.items()}
    return us, {name: h.paired(times[name], beside[name]) for name in beside}


def ratio(ratios: dict[str, float], cell: str) -> float | str:
    """``cell``'s paired ratio to the model alone: 1 for the model, n/a if it failed."""
    return 1.0 if cell == "model" else ratios.get(cell, "n/a")


def per_call(width: int, layers: int, grad: bool, device: torch.device, rounds: int) -> dict:
    """Per cell of ``PER_CALL``: its compile (first call), its error against the eager model,
    time per call and ratio to the model alone, Dynamo graphs. Every set holds the model's own
    values, so every cell's output is the model's."""
    torch._dynamo.reset()
    model = c.mlp(width, layers, device)
    x = torch.randn(c.BATCH, width, device=device)
    with torch.no_grad():
        expected = model(x)
    base = c.values(model, 0)  # the model's own values: every cell computes `expected`
    rows: dict[str, dict[str, Any]] = {}
    calls: dict[str, h.Fn] = {}
    fns: dict[str, c.Cell] = {}
    with torch.set_grad_enabled(grad):
        for cell, (body, container) in PER_CALL.items():
            td = base.clone()
            if grad:
                td.apply_(lambda t: t.requires_grad_())
            fn, fns[cell] = c.compiled(model, cell, body, None)
            p = c.holding(td, container)
            if grad:
                call = (lambda fn, p: lambda: fn(x, p).sum().backward())(fn, p)
            else:
                call = (lambda fn, p: lambda: fn(x, p))(fn, p)
            try:
                start = time.perf_counter()
                fn(x, p)
                c.synchronize(device)
                compile_s = time.perf_counter() - start
                h.warm(call, 3)
                err = (fn(x, p).detach() - expected).abs().max().item()
            except Exception as exc:  # recorded in the table: the cell failed
                rows[cell] = {"error": c.error(exc)}
                print(f"  {cell}: {rows[cell]['error']}")
                continue
            rows[cell] = {"compile s": compile_s, "max err": err}
            calls[cell] = call
        us, ratios = timed(calls, device, rounds)
    for cell in calls:
        rows[cell].update({"us": us[cell], "x model": ratio(ratios, cell)})
        rows[cell].update({"graphs": c.graphs(fns[cell]), "recompiles": c.graphs(fns[cell]) - 1})
    return rows


def reduce_overhead(
    width: int, layers: int, ks: list[int], cycles: int, device: torch.device, rounds: int
) -> Iterator[tuple[int, dict[str, dict[str, Any]]]]:
    """A table per K, ``(K, {cell: row})``, as each is done; the same compiled cells serve
    every K, so a recording made for K = 2 serves K = 4 too (``new recordings``;
    ``recordings``: all so far)."""
    torch._dynamo.reset()
    model = c.mlp(width, layers, device)
    x = torch.randn(c.BATCH, width, device=device)
    sets = [c.values(model, 1 + k) for k in range(max(ks))]
    expected = c.eager_outputs(model, sets, x)
    with torch.no_grad():
        own = model(x).clone()
    cells: dict[str, tuple[c.Cell, c.Cell, list[Any]]] = {}
    for cell, (body, container) in REDUCE_OVERHEAD.items():
        fn, original = c.compiled(model, cell, body, "reduce-overhead")
        cells[cell] = (fn, original, [c.holding(td, container) for td in sets])
    totals = {cell: [0, 0] for cell in cells}  # recordings, copied inputs
    failed: dict[str, str] = {}
    for k in ks:
        rows: dict[str, dict[str, Any]] = {}
        calls: dict[str, h.Fn] = {}
        for cell, (fn, _, held) in cells.items():
            if cell in failed:
                rows[cell] = {"error": failed[cell]}
                continue
            refs = [own] * k if cell == "model" else expected[:k]
            try:
                row = c.check_cycles(fn, x, held[:k], refs, cycles, device, TOLERANCE)
            except Exception as exc:  # recorded in the table: the cell failed
                failed[cell] = c.error(exc)
                rows[cell] = {"error": failed[cell]}
                print(f"  {cell}, K={k}: {failed[cell]}")
                continue
            new, copied = row.pop("new recordings"), row.pop("copied inputs")
            if new is None:  # not CUDA: no CUDA graph
                rows[cell] = {"new recordings": "n/a", "recordings": "n/a", **row}
                rows[cell]["copied inputs / replay"] = "n/a"
            else:
                totals[cell][0] += new
                totals[cell][1] += copied
                recorded, inputs = totals[cell]
                per_replay = inputs / recorded if recorded else "n/a"
                rows[cell] = {"new recordings": new, "recordings": recorded, **row}
                rows[cell]["copied inputs / replay"] = per_replay
            calls[cell] = c.cycling(fn, x, held[:k])
        before = c.recordings(device)
        with torch.no_grad():
            us, ratios = timed(calls, device, rounds)
        after = c.recordings(device)
        for cell in calls:
            made = c.graphs(cells[cell][1])
            rows[cell].update({"us": us[cell], "x model": ratio(ratios, cell)})
            rows[cell].update({"graphs": made, "recompiles": made - 1})
        timed_recordings = "n/a" if before is None or after is None else after - before
        rows["(all cells, while timed)"] = {"new recordings": timed_recordings}
        yield k, rows


# --------------------------------------------------------------------------- first call


def first_call_child(cell: str, device: torch.device, quick: bool) -> dict[str, float]:
    """In this fresh process: the first call of ``cell`` (``model`` or ``swap flat``)."""
    width, layers = QUICK_MODEL if quick else MODELS["narrow"]
    model = c.mlp(width, layers, device)
    body, container = PER_CALL[cell]
    fn, original = c.compiled(model, cell, body, None)
    p = c.holding(c.values(model, 1), container)
    x = torch.randn(c.BATCH, width, device=device)
    torch._dynamo.utils.counters.clear()
    with torch.no_grad():
        cpu, wall = h.first_call(lambda: (fn(x, p), c.synchronize(device)))
    inductor = torch._dynamo.utils.counters["inductor"]
    return {
        "wall s": wall,
        "cpu s": cpu,
        "fx cache hits": float(inductor["fxgraph_cache_hit"]),
        "fx cache misses": float(inductor["fxgraph_cache_miss"]),
        "graphs": float(c.graphs(original)),
    }


def _run_child(cell: str, cache: str, device: torch.device, quick: bool) -> dict[str, Any]:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": f"{cache}/triton"}
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "part.json"
        command = [sys.executable, "-m", "benchmarks", "gpu", "--child", cell]
        command += ["--device", str(device), "--out", str(out)] + ["--quick"] * quick
        done = subprocess.run(command, env=env, cwd=h.ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
            return {"error": lines[-1][:240]}
        return json.loads(out.read_text())["child"]


def first_call(device: torch.device, repeat: int, quick: bool) -> dict[str, dict[str, Any]]:
    samples: dict[str, list[dict[str, Any]]] = {}
    for _ in range(repeat):
        for cell in ("model", "swap flat"):
            with tempfile.TemporaryDirectory(prefix="fcall-gpu-cache-") as cache:
                for state in ("cold", "warm"):
                    found = _run_child(cell, cache, device, quick)
                    samples.setdefault(f"{cell} {state}", []).append(found)
    rows: dict[str, dict[str, Any]] = {}
    for name, runs in samples.items():
        errors = [run["error"] for run in runs if "error" in run]
        if errors:
            rows[name] = {"error": errors[0]}
            continue
        rows[name] = {field: h.median(run[field] for run in runs) for field in runs[0]}
        models = samples[f"model {name.split()[-1]}"]
        if not any("error" in run for run in models):
            walls = [run["wall s"] for run in runs]
            rows[name]["x model"] = h.paired(walls, [run["wall s"] for run in models])
    return rows


# -------------------------------------------------------------------------------- run


def device_row(device: torch.device) -> dict[str, Any]:
    if device.type != "cuda":
        note = "a smoke run on CPU: no CUDA graph, no CUDA timing"
        return {"cuda": torch.cuda.is_available(), "device": str(device), "note": note}
    properties = torch.cuda.get_device_properties(device)
    return {
        "cuda": True,
        "device": properties.name,
        "capability": f"{properties.major}.{properties.minor}",
        "memory GiB": properties.total_memory / 2**30,
        "CUDA": str(torch.version.cuda),
    }


def run(args: argparse.Namespace, record: h.Recorder) -> None:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu: no CUDA device here, so the GPU benchmarks did not run (recorded: cuda false)")
        record.results["meta"]["cuda"] = False
        record.results["device"] = {"cuda": {"available": False, "ran": "nothing"}}
        return
    if args.child:
        record.results["child"] = first_call_child(args.child, device, args.quick)
        return
    record.results["meta"]["cuda"] = device.type == "cuda"
    record.results["device"] = {str(device): device_row(device)}
    record.save()
    models = {"quick": QUICK_MODEL} if args.quick else {m: MODELS[m] for m in args.models}
    rounds = 3 if args.quick else args.rounds
    fields = ["us", "x model", "graphs", "recompiles", "compile s", "max err"]
    if "per_call" in args.sections:
        for name, (width, layers) in models.items():
            for grad in args.grad:
                title = f"per call, {name}: {layers} x Linear({width}, {width}), grad {grad}"
                start = time.perf_counter()
                rows = per_call(width, layers, grad == "on", device, rounds)
                record.results[title] = rows
                h.print_rows(f"{title} ({time.perf_counter() - start:.0f} s)", rows, fields)
                record.save()
    if "reduce_overhead" in args.sections:
        width, layers = next(iter(models.values()))
        ks = [2] if args.quick else args.sets
        cycles = 3 if args.quick else args.cycles
        fields = ["recordings", "copied inputs / replay", "mismatches", "growth / cycle KiB"]
        fields += ["us", "x model", "graphs", "recompiles"]
        for k, rows in reduce_overhead(width, layers, ks, cycles, device, rounds):
            title = f"reduce-overhead, {layers} x Linear({width}, {width}), K = {k} sets"
            record.results[title] = rows
            h.print_rows(title, rows, fields)
            record.save()
    if "first_call" in args.sections:
        rows = first_call(device, 1 if args.quick else args.repeat, args.quick)
        title = "first call (fresh processes, inductor, no_grad)"
        record.results[title] = rows
        h.print_rows(title, rows, ["wall s", "x model", "cpu s", "fx cache hits", "graphs"])
        record.save()
