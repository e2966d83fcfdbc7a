"""Compiled ``fcall.to_module`` leaves every dict in the order eager leaves it (tensordict's,
``tests/test_registration_order.py``), in one graph; a call that changes a dict's order
may recompile once (Dynamo guards the order it read), as tensordict's to_module does,
and the order is stable from then on."""

from __future__ import annotations

import pytest
import torch

import fcall
from tests.support import assert_same_state, state
from tests.test_registration_order import CASES, orders


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_to_module_leaves_eagers_order(counter, case, backend):
    make, params_of, kwargs = CASES[case]
    eager, compiled = make(), make()
    x = torch.randn(4, 3)

    def step(p, m, x):
        with fcall.to_module(p, m, **kwargs):
            return m(x)

    cnt = counter(backend)
    fn = torch.compile(step, backend=cnt, fullgraph=True)
    before = state(compiled)
    with torch.no_grad():
        for call in range(3):
            expected = step(params_of(eager), eager, x)
            with torch.compiler.set_stance("fail_on_recompile" if call == 2 else "default"):
                out = fn(params_of(compiled), compiled, x)
            torch.testing.assert_close(out, expected)
            assert orders(compiled) == orders(eager), call
            assert_same_state(compiled, before, in_any_order=True)
    assert cnt.frame_count <= 2


def test_compiled_to_module_runs_the_registration_hooks_as_eager(counter):
    make, params_of, _ = CASES["partial"]
    seen: dict[str, list] = {"eager": [], "compiled": []}

    def step(p, m, x):
        with fcall.to_module(p, m):
            return m(x)

    cnt = counter("eager")
    fn = torch.compile(step, backend=cnt, fullgraph=True)

    def hook_into(calls):  # a closure: Dynamo 2.11 does not replay an append to a list
        def hook(module, key, value):  # reached through a function's defaults
            calls.append((key, tuple(value.shape)))

        return hook

    for name, run in (("eager", step), ("compiled", fn)):
        m = make()
        hook = hook_into(seen[name])
        handle = torch.nn.modules.module.register_module_parameter_registration_hook(hook)
        try:
            run(params_of(m), m, torch.randn(4, 3))
        finally:
            handle.remove()
    assert seen["compiled"] == seen["eager"] == [("weight", (2, 3)), ("weight", (2, 3))]
    assert cnt.frame_count == 1
