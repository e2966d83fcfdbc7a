"""What every suite shares: interleaved timing, compile settings, processes apart, JSON.

Timing. A suite's functions run in rounds; a round runs one batch of each function, in
reversed order every other round, so that load that comes and goes on a shared machine
hits all alike. A function given a peer (``peer_of``) has its batch run right beside a
batch of that peer (before it in even rounds, after it in odd ones), and its ratio is the
median over rounds of its batch time over the peer batch beside it (``paired``). Times
are medians.

Results. A suite returns a dict of tables, ``{table: {row: {column: value}}}`` (the
matrix keeps its own layout, see ``_report``); ``save`` writes them with ``meta`` (date,
commit, versions, argv, duration) to ``benchmarks/results/<suite>.json`` (``--quick``: to
``/tmp``), after each section, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import importlib.metadata
import inspect
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
Fn = Callable[[], Any]


# ------------------------------------------------------------------------------ timing


def batch(fn: Fn, number: int, within: Any = None) -> float:
    """Seconds per call of ``number`` calls of ``fn`` in a row (inside the context
    manager ``within``, entered before the clock starts)."""
    with within or contextlib.nullcontext():
        start = time.perf_counter()
        for _ in range(number):
            fn()
        return (time.perf_counter() - start) / number


def calls_in(fn: Fn, budget_s: float, most: int = 2000) -> int:
    """How many calls of ``fn`` fill about ``budget_s`` (at least one)."""
    fn()
    return max(1, min(most, round(budget_s / max(batch(fn, 1), 1e-7))))


def warm(fn: Fn, times: int) -> None:
    """``fn`` run ``times`` times: fcall's plan built and cached, a function compiled."""
    for _ in range(times):
        fn()


def rounds_of(
    fns: dict[str, Fn],
    rounds: int,
    number: int | dict[str, int],
    peer_of: Callable[[str], str] = lambda name: name,
    within: Callable[[str], Any] = lambda name: None,
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Seconds per call, one batch of ``number`` calls (per function, or one for all) per
    round: each function with a peer (``peer_of(name)`` another of ``fns``) right beside a
    batch of that peer, before it in even rounds, after it in odd ones; the others once a
    round, in reversed order every other round. Returns every function's times and, per
    function with a peer, the peer's batches beside it. ``within(name)``: a context
    manager each batch of ``name`` runs in (``batch``), or None."""
    numbers = number if isinstance(number, dict) else dict.fromkeys(fns, number)
    cells = [name for name in fns if peer_of(name) in fns and peer_of(name) != name]
    peers = {peer_of(name) for name in cells}
    times: dict[str, list[float]] = {name: [] for name in fns}
    beside: dict[str, list[float]] = {name: [] for name in cells}
    others = [name for name in fns if name not in cells and name not in peers]
    for round_ in range(rounds):
        odd = round_ % 2
        for name in cells[::-1] if odd else cells:
            peer = peer_of(name)
            if odd:
                times[name].append(batch(fns[name], numbers[name], within(name)))
            beside[name].append(batch(fns[peer], numbers[peer], within(peer)))
            times[peer].append(beside[name][-1])
            if not odd:
                times[name].append(batch(fns[name], numbers[name], within(name)))
        for name in others[::-1] if odd else others:
            times[name].append(batch(fns[name], numbers[name], within(name)))
    return times, beside


def median(samples: Iterable[float]) -> float:
    return statistics.median(samples)


def paired(times: Iterable[float], base: Iterable[float]) -> float:
    """The median over rounds of each round's ``time / base``."""
    return statistics.median(t / b for t, b in zip(times, base))


def difference(times: Iterable[float], base: Iterable[float]) -> float:
    """The median over rounds of each round's ``time - base``."""
    return statistics.median(t - b for t, b in zip(times, base))


def cpu_seconds() -> float:
    """CPU seconds of this process and of the children it waited for (a C++ compiler):
    a compile's cost, where its wall time also holds whatever else the machine ran."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def first_call(fn: Fn) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one call of ``fn`` (a compile), the garbage
    collector frozen first so that it walks only this call's objects."""
    gc.collect()
    gc.freeze()
    start, start_cpu = time.perf_counter(), cpu_seconds()
    fn()
    return cpu_seconds() - start_cpu, time.perf_counter() - start


# ------------------------------------------------------------------------ compiled code


def isolate_compiles() -> None:
    """No compile reuses another's work through a cache on disk, and inductor compiles
    in this process (one thread), so that a compile's CPU time is its own."""
    torch._inductor.config.fx_graph_cache = False
    torch._inductor.config.autotune_local_cache = False
    torch._functorch.config.enable_autograd_cache = False
    torch._inductor.config.compile_threads = 1


def fresh(fn: Callable, name: str) -> Callable:
    """``fn`` with a code object of its own: Dynamo caches per code object, and closures
    from one ``def`` share theirs (one cell's guards would be checked by every other)."""
    code = fn.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


def guard_check(fn: Callable, x: torch.Tensor, params: Any) -> Callable[[], bool] | None:
    """One guard check of ``fn``'s compiled frame on ``(x, params)``: the guard manager of
    its cache entry (``cache_entry``), called with the frame's locals. ``None`` if the frame
    has several entries (it recompiled)."""
    found = cache_entry(fn, x, params)
    if found is None:
        return None
    manager, frame_locals = found[0].guard_manager, found[1]
    return lambda: manager.check(frame_locals)


def cache_entry(fn: Callable, x: torch.Tensor, params: Any) -> tuple[Any, dict] | None:
    """The cache entry of ``fn``'s compiled frame on ``(x, params)`` and the frame's locals
    (free variables included): its only entry, ``None`` if it has several (it recompiled).
    On torch 2.12 a function made by ``exec()`` is compiled through a wrapper whose code
    every such function shares: there, the one entry whose guards pass."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    code = fn.__code__
    entries = _debug_get_cache_entry_list(code)
    shared = code.co_filename.endswith("external_utils.py")
    if not entries or (len(entries) != 1 and not shared):
        return None
    names = code.co_varnames[: code.co_argcount]
    frame_locals: dict[str, Any] = dict(zip(names, (x, params)))
    # torch 2.12 compiles a function made by exec() through a wrapper of its own,
    # `inner(*args, **kwargs)` (torch/_dynamo/external_utils.py), the function in its closure
    rest = iter(code.co_varnames[code.co_argcount :])
    if code.co_flags & inspect.CO_VARARGS:
        frame_locals[next(rest)] = (x, params)
    if code.co_flags & inspect.CO_VARKEYWORDS:
        frame_locals[next(rest)] = {}
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        frame_locals[name] = cell.cell_contents
    passing = [entry for entry in entries if entry.guard_manager.check(frame_locals)]
    if len(passing) != 1:
        raise AssertionError(f"guards of {fn.__name__} fail on its own inputs")
    return passing[0], frame_locals


class Chain(nn.Sequential):
    """``Linear(4, 4)`` layers, two leaves each; ``forward`` reads them all, or none
    (then what is timed around it is the swap)."""

    def __init__(self, leaves: int, reads: bool = True) -> None:
        super().__init__(*[nn.Linear(4, 4) for _ in range(max(1, leaves // 2))])
        self.reads = reads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) if self.reads else x


def flat(td: Any) -> dict[str, torch.Tensor]:
    """A TensorDict's leaves under dotted names (what torch.func takes)."""
    return {".".join(key): value for key, value in td.items(True, True)}


# -------------------------------------------------------------------------- results


def meta(argv: list[str], quick: bool) -> dict[str, Any]:
    def git(*args: str) -> str:
        try:
            found = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        except OSError:
            return ""
        return found.stdout.strip()

    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "fcall")),  # uncommitted fcall/ changes
        "torch": torch.__version__,
        "tensordict": importlib.metadata.version("tensordict"),
        "python": platform.python_version(),
        "argv": argv,
        "quick": quick,
    }


def default_out(suite: str, quick: bool) -> Path:
    """Where a run writes: the results the docs render, or ``/tmp`` for a quick run
    (which must not overwrite them)."""
    return Path(f"/tmp/fcall-bench-{suite}-quick.json") if quick else RESULTS / f"{suite}.json"


class Recorder:
    """A run's results, written after each section with their ``meta``."""

    def __init__(self, suite: str, argv: list[str], quick: bool, out: Path) -> None:
        self.out = out
        self.began = time.perf_counter()
        self.results: dict[str, Any] = {"meta": {"suite": suite, **meta(argv, quick)}}
        out.parent.mkdir(parents=True, exist_ok=True)

    def save(self, done: bool = False) -> None:
        self.results["meta"]["seconds"] = time.perf_counter() - self.began
        self.results["meta"]["complete"] = done
        self.out.write_text(json.dumps(self.results, indent=1))


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The tables of several runs as one result; ``meta`` keeps each run's own under
    ``parts`` and ``commits`` lists the commits measured (more than one is printed)."""
    commits = sorted({part["meta"].get("commit", "") for part in parts})
    if len(commits) != 1:
        print(f"merge: the runs come from different commits: {commits}")
    results: dict[str, Any] = {
        "meta": {**parts[0]["meta"], "commits": commits, "parts": [p["meta"] for p in parts]}
    }
    for part in parts:
        for table, value in part.items():
            if table != "meta":
                results.setdefault(table, {}).update(value)
    results["meta"]["seconds"] = max(part["meta"].get("seconds", 0.0) for part in parts)
    results["meta"]["complete"] = all(part["meta"].get("complete", True) for part in parts)
    return results


def child(suite: str, args: list[str], quiet: bool = False) -> dict[str, Any]:
    """The results of ``python -m benchmarks <suite> <args>`` in a fresh process."""
    with tempfile.TemporaryDirectory(prefix=f"fcall-bench-{suite}-") as folder:
        out = Path(folder) / "part.json"
        command = [sys.executable, "-m", "benchmarks", suite, *args, "--out", str(out)]
        subprocess.run(command, check=True, cwd=ROOT, capture_output=quiet)
        return json.loads(out.read_text())


def apart(suite: str, runs: list[list[str]]) -> dict[str, Any]:
    """``child`` for each args of ``runs``, one after the other, their results merged
    (``merge``). A process of its own gives a run memory that no earlier run left
    scattered."""
    return merge([child(suite, args) for args in runs])


def print_rows(
    title: str, row: dict[str, dict[str, float]], fields: Iterable[str], cells: Iterable[str] = ()
) -> None:
    """A table on stdout: a line per name, a column per field (peers marked)."""
    fields, cells = list(fields), set(cells)
    print(f"\n{title}: " + ", ".join(fields))
    for name, values in row.items():
        mark = "  (peer)" if cells and name not in cells else ""
        text = "".join(
            f"{values[f]:>12.3f}"
            if isinstance(values.get(f), float)
            else f"{values.get(f, ''):>12}"
            for f in fields
        )
        print(f"  {name:<52}{text}{mark}")
