"""The path of one warm eager call of each API through fcall's modules (no timing).

    python -m benchmarks call_path            # the three APIs: modules crossed, calls
    python -m benchmarks call_path --calls    # and every fcall function called, in order

The same numbers on every machine. A warm call is the second of two identical ones (the plan
is cached), on an ``nn.Sequential(Linear, ReLU, Linear)`` with a TensorDict. Counted: the calls of
functions defined in ``fcall/`` (not ``fcall/testing``), from the API's entry to its return
(for ``swap``: ``swap(...)``, ``__enter__`` and ``__exit__``). The path is the sequence of fcall
modules the calls pass through, a module repeated only when the path comes back to it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

import fcall

from . import _harness as h

ROOT = Path(fcall.__file__).parent
TESTING = ROOT / "testing"


class CallPath(NamedTuple):
    api: str
    calls: list[str]  # "module.function", in call order
    modules: list[str]  # the modules in order, each run of one module once


def _module_of(filename: str) -> str | None:
    path = Path(filename)
    if ROOT not in path.parents or TESTING in path.parents:
        return None
    return ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)


def trace(api: str, run: Callable[[], object]) -> CallPath:
    run()  # warm: the plan is cached
    calls: list[str] = []
    path: list[str] = []
    stack: list[str | None] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            module = _module_of(frame.f_code.co_filename)
            stack.append(module)
            if module is not None:
                calls.append(f"{module}.{frame.f_code.co_qualname}")
                if not path or path[-1] != module:
                    path.append(module)
        elif event == "return" and stack:
            stack.pop()
            back = next((m for m in reversed(stack) if m is not None), None)
            if back is not None and path[-1] != back:
                path.append(back)

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return CallPath(api, calls, path)


def paths() -> list[CallPath]:
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1))
    params = fcall.from_module(model).detach().clone()
    x = torch.ones(2)

    def swap() -> None:
        with fcall.swap(params, model):
            pass

    def to_module() -> None:
        with fcall.to_module(params, model):
            pass

    def functional_call() -> None:
        fcall.functional_call(model, params, (x,))

    return [
        trace("swap", swap),
        trace("to_module", to_module),
        trace("functional_call", functional_call),
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", action="store_true", help="also list every call")


def run(args: argparse.Namespace, record: h.Recorder) -> None:
    table: dict[str, dict[str, Any]] = {}
    for p in paths():
        distinct = len(set(p.modules))
        path = " > ".join(m.removeprefix("fcall.") for m in p.modules)
        table[p.api] = {"modules": distinct, "calls": len(p.calls), "path": path}
        print(f"{p.api}: {distinct} fcall modules, {len(p.calls)} calls\n  {path}")
        if args.calls:
            for call in p.calls:
                print("    " + call.removeprefix("fcall."))
    record.results["warm eager call path"] = table
