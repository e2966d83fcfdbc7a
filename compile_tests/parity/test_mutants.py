"""The suite can fail: the same parity check against deliberately broken swaps.

Each mutant is a stand-in for the ``fcall`` namespace the generated step calls
(``swap``, ``functional_call``). Each must be caught, by the property it breaks.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fcall
from fcall._core import flatten as _flatten

from . import checks

SPEC = {
    "seed": 21,
    "features": 4,
    "heads": 2,
    "dtype": "float32",
    "body": {
        "container": "seq",
        "children": [
            {"kind": "linear"},
            {"container": "dict", "children": [{"kind": "bn2d", "train": True}, {"kind": "tanh"}]},
            {"kind": "layernorm"},
        ],
    },
    "tie": True,
    "buffers": "both",
    "frozen": [],
}
PSPEC = {"seed": 4, "kinds": ["grad", "param"], "container": "nested", "drop_alias": False}


def _use(api):
    kw = {"tie_weights": True, "strict": False}
    return {"api": api, "entry": "step", "vmap": False, "kw": kw}


class _Ctx:
    def __init__(self, impl, params, module):
        self.impl, self.params, self.module = impl, params, module

    def __enter__(self):
        self.state = self.impl._enter(self.params, self.module)
        return self.state[1]

    def __exit__(self, *exc):
        self.impl.exit(self.module, self.state[0])
        return False


class _Namespace:
    """``swap`` and ``functional_call`` around ``fcall.swap``, with hooks to break."""

    def swap(self, params, module, **kw):
        return _Ctx(self, params, module)

    def _enter(self, params, module):
        ctx = fcall.swap(self.transform(params, module), module)
        return ctx, ctx.__enter__()

    def transform(self, params, module):
        return params

    def exit(self, module, ctx):
        ctx.__exit__(None, None, None)

    def functional_call(self, module, params, args=(), kwargs=None, **kw):
        ctx, _ = self._enter(params, module)
        try:
            return module(*args, **(kwargs or {}))
        finally:
            self.exit(module, ctx)


class ForgetsToRestore(_Namespace):
    def exit(self, module, ctx):
        pass


class SwapsTopLevelKeysOnly(_Namespace):
    def transform(self, params, module):
        return {k: v for k, v in params.items() if isinstance(v, torch.Tensor)}


class WrapsLeavesInNewParameters(_Namespace):
    def transform(self, params, module):
        leaves = _flatten.flatten(params)
        return {
            ".".join(key): nn.Parameter(value.detach(), requires_grad=value.requires_grad)
            for key, value in zip(leaves.keys, leaves.values)
        }


class Recompiles(_Namespace):
    """Keeps a swap counter on the module: an int Dynamo guards on."""

    def transform(self, params, module):
        module.swap_count = getattr(module, "swap_count", 0) + 1
        return params


MUTANTS = {
    "forgets_to_restore": (ForgetsToRestore, {"module"}),
    "swaps_top_level_keys_only": (SwapsTopLevelKeysOnly, {"values"}),
    # Eagerly the detached leaves get no gradient ([values]); compiled, Dynamo
    # refuses the Parameter constructor under fullgraph ([error]).
    "wraps_leaves_in_new_parameters": (WrapsLeavesInNewParameters, {"values", "error"}),
    "recompiles": (Recompiles, {"recompile", "graphs"}),
}


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("api", ["swap", "functional_call"])
@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_is_caught(name, api, backend):
    cls, props = MUTANTS[name]
    with pytest.raises(checks.ParityError) as info:
        checks.check_parity(SPEC, PSPEC, _use(api), backend, impl=cls())
    assert info.value.prop in props, str(info.value)
    assert "fcall compile-parity reproducer" in str(info.value)


@pytest.mark.parametrize("api", ["swap", "functional_call"])
def test_the_faithful_stand_in_passes(api):
    """Control: the mutant scaffolding itself, unbroken, passes the same check."""
    checks.check_parity(SPEC, PSPEC, _use(api), "eager", impl=_Namespace())
