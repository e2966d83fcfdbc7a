"""A compiled swap beside its floor: the same model compiled with its own parameters.

    python -m benchmarks floor                                  # per call and first call
    python -m benchmarks floor --sections per_call --sizes 100 --backends eager
    python -m benchmarks floor --sections first_call --sizes 200,1000 --repeat 3

``per_call``: for each way a user holds the module (a global, a closure, an attribute of a
compiled ``nn.Module``, an argument), ``f(x, p)`` compiled (``fullgraph=True``) for an
``nn.Sequential`` of ``Linear(8, 8)``: the model with its own parameters (the floor, held
the same way), fcall's ``swap`` and ``functional_call`` with a flat dict and a TensorDict,
``to_module`` with a TensorDict of plain tensors (tensordict's rule: a Parameter per leaf
per call), tensordict's own ``to_module`` and ``torch.func.functional_call``. Each cell is
timed in interleaved rounds right beside the floor of its form; a ratio is the median of
the paired ratios. The ``Parameter alone`` row builds, per call, the Parameters that
``to_module`` must build and calls the model with its own parameters: what the rule costs
without any swap. The two ``leaves read`` rows swap nothing: they call the model with its own
parameters and return every value of a flat dict or of a TensorDict's nodes: what Dynamo
charges to read the container at all.

``apart``: the same per-call ratio with each cell alone in a fresh process beside the floor
of its form (one model, one container, one compiled function of each, as a user's script
has them), for the cells of the targets (``swap`` and ``functional_call``, flat dict and
TensorDict) unless ``--cells`` says otherwise: what ``per_call`` reads with every cell's
models and containers alive at once, and their calls interleaved, is not what one user pays.

``first_call``: the first call of ``swap`` and ``functional_call`` (flat dict, inductor,
``no_grad``) beside the model's, each in a fresh process, with the caches on disk cold (a new
``TORCHINDUCTOR_CACHE_DIR``) and warm (the same directory a second time: inductor's FX graph
cache and AOTAutograd's cache hit, as on every second run of a script), and what Dynamo did
for each (``torch._dynamo.utils.compile_times``, graph-break-free).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import fcall

from . import _harness as h

FORMS = ("global", "closure", "attribute", "argument")
CELLS = (
    "model",
    "swap flat",
    "swap tensordict",
    "functional_call flat",
    "functional_call tensordict",
    "to_module (plain tensors)",
    "tensordict to_module (plain tensors)",
    "torch.func flat",
    "Parameter alone (no swap)",
    "flat leaves read (no swap)",
    "tensordict leaves read (no swap)",
)
BACKENDS = ("eager", "inductor")

# The body a user compiles, per cell: `model` is the module, held as the form says.
_BODIES = {
    "model": "return model(x)",
    "swap flat": "with fcall.swap(p, model):\n    return model(x)",
    "swap tensordict": "with fcall.swap(p, model):\n    return model(x)",
    "functional_call flat": "return fcall.functional_call(model, p, (x,))",
    "functional_call tensordict": "return fcall.functional_call(model, p, (x,))",
    "to_module (plain tensors)": "with fcall.to_module(p, model):\n    return model(x)",
    "tensordict to_module (plain tensors)": "with p.to_module(model):\n    return model(x)",
    "torch.func flat": "return torch.func.functional_call(model, p, (x,))",
    "Parameter alone (no swap)": "tuple(map(nn.Parameter, p.values()))\nreturn model(x)",
    # what any compiled function pays to read every value of the container, beside the model
    # with its own parameters (the values are returned: read, and graph inputs)
    "flat leaves read (no swap)": "return model(x), tuple(p.values())",
    "tensordict leaves read (no swap)": (
        "return model(x), tuple(v for n in p._tensordict.values() for v in n._tensordict.values())"
    ),
}
_FLAT = ("flat", "torch.func", "Parameter alone")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    parser.add_argument("--sizes", type=lambda s: [int(n) for n in s.split(",")])
    parser.add_argument("--forms", nargs="+", default=list(FORMS), choices=FORMS)
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--grad", nargs="+", default=["off", "on"], choices=["off", "on"])
    parser.add_argument("--rounds", type=int, default=15, help="per_call: interleaved rounds")
    parser.add_argument("--repeat", type=int, default=2, help="first_call: rounds of processes")
    parser.add_argument("--apis", nargs="+", default=["model", "swap", "functional_call"])
    parser.add_argument("--cells", nargs="+", choices=CELLS, help="per_call: these cells only")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # first_call: one process's cell
    parser.add_argument("--apart-child", help=argparse.SUPPRESS)  # apart: one process's cell


def model_of(leaves: int) -> nn.Module:
    return nn.Sequential(*[nn.Linear(8, 8) for _ in range(max(1, leaves // 2))])


def params_of(model: nn.Module, cell: str, grad: bool = False) -> Any:
    """The model's values, detached copies; ``grad``: each requires grad, as the model's
    own Parameters do (a meta-learning inner loop's, an ensemble being trained)."""
    td = fcall.from_module(model).detach().clone()
    if grad:
        td.apply_(lambda t: t.requires_grad_())
    return h.flat(td) if any(word in cell for word in _FLAT) else td


def _def(name: str, arguments: str, cell: str, indent: str) -> str:
    """The source of ``def name(arguments)`` with ``cell``'s body, at ``indent``."""
    body = textwrap.indent(_BODIES[cell], indent + "    ")
    return f"{indent}def {name}({arguments}):\n{body}\n"


def compiled(cell: str, form: str, model: nn.Module, backend: str) -> Callable[[Any, Any], Any]:
    """``f(x, p)`` of ``cell``, compiled, with ``model`` held as ``form``, its own code object."""
    names: dict[str, Any] = {"fcall": fcall, "torch": torch, "nn": nn}
    name = "f_" + "".join(c if c.isalnum() else "_" for c in f"{cell}_{form}")
    scope: dict[str, Any] = {}
    if form == "global":
        exec(_def(name, "x, p", cell, ""), {**names, "model": model}, scope)
        return torch.compile(scope[name], backend=backend, fullgraph=True)
    if form == "closure":
        source = "def outer(model):\n" + _def(name, "x, p", cell, "    ") + f"    return {name}\n"
        exec(source, names, scope)
        return torch.compile(scope["outer"](model), backend=backend, fullgraph=True)
    if form == "argument":
        exec(_def(name, "x, p, model", cell, ""), names, scope)
        fn = torch.compile(scope[name], backend=backend, fullgraph=True)
        return lambda x, p: fn(x, p, model)
    # an attribute of a compiled nn.Module (TorchRL's losses hold their networks so)
    method = _def("forward", "self, x, p", cell, "    ")
    method = method.replace("p):\n", "p):\n        model = self.model\n", 1)
    source = "class Loss(nn.Module):\n" + method
    exec(source, names, scope)
    holder = scope["Loss"]()
    holder.model = model
    return torch.compile(holder, backend=backend, fullgraph=True)


def per_call(
    leaves: int, backend: str, grad: bool, forms: list[str], rounds: int, cells: list[str]
) -> dict:
    """Per call, each cell over the model of its form, for every form. The objects made
    before the rounds are frozen out of the garbage collector's walks
    (``gc.freeze``): tens of models and containers alive at once would otherwise make each
    collection, set off by whichever cell allocates, cost in proportion to them all."""
    torch._dynamo.reset()
    torch._dynamo.config.recompile_limit = 64
    x = torch.randn(16, 8)
    fns: dict[str, h.Fn] = {}
    with torch.set_grad_enabled(grad):
        for form in forms:
            model = model_of(leaves)
            for cell in ["model", *(c for c in cells if c != "model")]:
                fn, p = compiled(cell, form, model, backend), params_of(model, cell, grad)
                fns[f"{form}: {cell}"] = (lambda fn, p: lambda: fn(x, p))(fn, p)
                h.warm(fns[f"{form}: {cell}"], 3)
        number = h.calls_in(fns[f"{forms[0]}: model"], 0.02, most=200)
        gc.collect()
        gc.freeze()  # the cells' models and containers: not walked by every collection
        try:
            times, beside = h.rounds_of(
                fns, rounds, number, peer_of=lambda name: name.split(":")[0] + ": model"
            )
        finally:
            gc.unfreeze()
    rows: dict[str, dict] = {}
    for name, samples in times.items():
        form, cell = name.split(": ", 1)
        row = rows.setdefault(cell, {})
        row[f"{form} us"] = h.median(samples) * 1e6
        if name in beside:
            row[f"{form} x"] = h.paired(samples, beside[name])
    return rows


def guards(leaves: int, rounds: int) -> dict:
    """What stands between a swap and the model per call: each cell (a closure, backend
    eager, ``no_grad``) timed whole and its guard check alone (the guard manager of its one
    cache entry), with the guards Dynamo installed, by kind."""
    torch._dynamo.reset()
    x = torch.randn(16, 8)
    cells = ("model", "swap flat", "swap tensordict", "functional_call flat", "torch.func flat")
    fns: dict[str, h.Fn] = {}
    checks: dict[str, h.Fn] = {}
    kinds: dict[str, dict[str, float]] = {}
    with torch.no_grad():
        for cell in cells:
            model = model_of(leaves)
            fn, p = compiled(cell, "closure", model, "eager"), params_of(model, cell)
            fns[cell] = (lambda fn, p: lambda: fn(x, p))(fn, p)
            h.warm(fns[cell], 3)
            original = fn._torchdynamo_orig_callable  # type: ignore[attr-defined]
            found = h.cache_entry(original, x, p)
            assert found is not None, f"{cell} recompiled"
            manager, frame_locals = found[0].guard_manager, found[1]
            checks[cell] = (lambda m, f: lambda: m.check(f))(manager, frame_locals)
            text = str(manager)
            kinds[cell] = {
                kind: float(text.count(f"+- {kind}"))
                for kind in ("TENSOR_MATCH", "TYPE_MATCH", "DICT_LENGTH", "EQUALS_MATCH")
            }
            kinds[cell]["NO_TENSOR_ALIASING"] = float("NO_TENSOR_ALIASING: check" in text)
        number = h.calls_in(fns["model"], 0.02, most=200)
        gc.collect()
        gc.freeze()  # as in per_call
        times, _ = h.rounds_of(
            {**fns, **{f"{c} guards": g for c, g in checks.items()}}, rounds, number
        )
    gc.unfreeze()
    rows = {}
    for cell in cells:
        call, check = h.median(times[cell]), h.median(times[f"{cell} guards"])
        rows[cell] = {"call us": call * 1e6, "guards us": check * 1e6, **kinds[cell]}
    floor_call, floor_guards = rows["model"]["call us"], rows["model"]["guards us"]
    for row in rows.values():
        row["call - model us"] = row["call us"] - floor_call
        row["guards - model us"] = row["guards us"] - floor_guards
    return rows


# --------------------------------------------------------------------------- apart

APART_CELLS = ("swap flat", "swap tensordict", "functional_call flat", "functional_call tensordict")


def _apart_spec(leaves: int, backend: str, grad: str, form: str, cell: str) -> str:
    return json.dumps([leaves, backend, grad, form, cell])


def apart_child(spec: str, rounds: int) -> dict:
    """In this fresh process: ``per_call`` of one cell of one form beside its floor."""
    leaves, backend, grad, form, cell = json.loads(spec)
    return per_call(leaves, backend, grad == "on", [form], rounds, [cell])[cell]


def apart(leaves: int, backend: str, grad: str, forms: list[str], cells: list[str], rounds: int):
    """Each (form, cell) of ``per_call`` alone in a fresh process: its row of ratios."""
    rows: dict[str, dict] = {}
    for cell in cells:
        for form in forms:
            spec = _apart_spec(leaves, backend, grad, form, cell)
            found = h.child("floor", ["--apart-child", spec, "--rounds", str(rounds)], quiet=True)
            rows.setdefault(cell, {}).update(found["child"])
    return rows


# --------------------------------------------------------------------------- first call


_MARK = "fcall-floor: the first call begins"


def first_call_child(spec: str) -> dict[str, float]:
    """In this fresh process: the first call of ``spec`` (``api:leaves``), its seconds and
    what Dynamo spent on it (``compile_inner`` less the backend's ``call_user_compiler``)."""
    api, leaves = spec.split(":")
    model = model_of(int(leaves))
    cell = {"model": "model", "swap": "swap flat", "functional_call": "functional_call flat"}
    fn = compiled(cell[api], "closure", model, "inductor")
    p, x = params_of(model, "flat"), torch.randn(16, 8)
    torch._dynamo.utils.counters.clear()
    print(_MARK, file=sys.stderr, flush=True)  # the imports after it are the first call's
    with torch.no_grad():
        cpu, wall = h.first_call(lambda: fn(x, p))
    phases = torch._dynamo.utils.compile_times(repr="csv", aggregate=True)
    times = dict(zip(phases[0], (float(v) for v in phases[1]))) if phases else {}
    backend = times.get("OutputGraph.call_user_compiler", 0.0)
    hits = torch._dynamo.utils.counters["inductor"]["fxgraph_cache_hit"]
    return {
        "wall s": wall,
        "cpu s": cpu,
        "dynamo s": times.get("_compile.compile_inner", 0.0) - backend,
        "backend s": backend,
        "fx cache hits": float(hits),
    }


def _import_seconds(stderr: str) -> float:
    """The seconds of the imports that ``-X importtime`` logged after ``_MARK``."""
    _, _, after = stderr.partition(_MARK)
    total = 0
    for line in after.splitlines():
        if line.startswith("import time:") and "self [us]" not in line:
            total += int(line.split(":", 1)[1].split("|")[0])
    return total / 1e6


def _run_child(spec: str, cache: str) -> dict[str, float]:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "part.json"
        command = [sys.executable, "-X", "importtime", "-m", "benchmarks", "floor"]
        command += ["--child", spec, "--out", str(out)]
        done = subprocess.run(
            command, check=True, env=env, cwd=h.ROOT, capture_output=True, text=True
        )
        found = json.loads(out.read_text())["child"]
        found["imports s"] = _import_seconds(done.stderr)
        return found


def first_call(sizes: list[int], apis: list[str], repeat: int) -> dict:
    rows: dict[str, dict] = {}
    for leaves in sizes:
        samples: dict[str, dict[str, list[float]]] = {}
        for _ in range(repeat):
            for api in apis:
                with tempfile.TemporaryDirectory(prefix="fcall-floor-cache-") as cache:
                    for state in ("cold", "warm"):
                        found = _run_child(f"{api}:{leaves}", cache)
                        for field, value in found.items():
                            samples.setdefault(f"{api} {state}", {}).setdefault(field, []).append(
                                value
                            )
        for name, fields in samples.items():
            row = {field: h.median(values) for field, values in fields.items()}
            state = name.split()[-1]
            model_wall = samples[f"model {state}"]["wall s"]
            row["x model"] = h.paired(fields["wall s"], model_wall)
            rows[f"{leaves} leaves: {name}"] = row
    return rows


SECTIONS = ("per_call", "apart", "guards", "first_call")


def run(args: argparse.Namespace, record: h.Recorder) -> None:
    if args.child:
        record.results["child"] = first_call_child(args.child)
        return
    if args.apart_child:
        record.results["child"] = apart_child(args.apart_child, args.rounds)
        return
    if "per_call" in args.sections:
        sizes = args.sizes or ([20] if args.quick else [100, 1000])
        rounds = 3 if args.quick else args.rounds
        for leaves in sizes:
            for backend in args.backends:
                for grad in args.grad:
                    title = f"per call, {leaves} leaves, {backend}, grad {grad}"
                    start = time.perf_counter()
                    cells = args.cells or list(CELLS)
                    rows = per_call(leaves, backend, grad == "on", args.forms, rounds, cells)
                    record.results[title] = rows
                    fields = [f"{form} x" for form in args.forms]
                    h.print_rows(f"{title} ({time.perf_counter() - start:.0f} s)", rows, fields)
                    record.save()
    if "apart" in args.sections:  # --quick: one process, to see that it runs
        sizes = args.sizes or ([20] if args.quick else [100, 1000])
        forms = args.forms[:1] if args.quick else args.forms
        cells = args.cells or list(APART_CELLS[:1] if args.quick else APART_CELLS)
        for leaves in sizes:
            for backend in args.backends[:1] if args.quick else args.backends:
                for grad in args.grad[:1] if args.quick else args.grad:
                    title = f"apart, {leaves} leaves, {backend}, grad {grad}"
                    start = time.perf_counter()
                    rounds = 3 if args.quick else args.rounds
                    rows = apart(leaves, backend, grad, forms, cells, rounds)
                    record.results[title] = rows
                    fields = [f"{form} x" for form in forms]
                    h.print_rows(f"{title} ({time.perf_counter() - start:.0f} s)", rows, fields)
                    record.save()
    if "guards" in args.sections:
        for leaves in args.sizes or ([20] if args.quick else [100, 1000]):
            rows = guards(leaves, 3 if args.quick else args.rounds)
            title = f"guards, {leaves} leaves (closure, eager, no_grad)"
            record.results[title] = rows
            fields = ["call us", "guards us", "call - model us", "guards - model us"]
            h.print_rows(title, rows, fields)
            record.save()
    if "first_call" in args.sections:
        sizes = args.sizes or ([20] if args.quick else [200, 1000])
        rows = first_call(sizes, args.apis, 1 if args.quick else args.repeat)
        record.results["first call (fresh processes, inductor, no_grad)"] = rows
        fields = ["wall s", "x model", "dynamo s", "backend s", "imports s", "fx cache hits"]
        h.print_rows("first call (fresh processes, inductor, no_grad)", rows, fields)
        record.save()
