"""Issue 26: importing and using fcall has no process-wide side effect.

No torch global hook, no mark written into a module, no tensordict method replaced (fcall's
own op names are added to tensordict's registries of `with`-undoable ops, nothing else); a
model whose forward slices its layer list (transformers' Llama, Mistral, Qwen, ...)
keeps its cached plan between swaps. The speed side is measured by
``python -m benchmarks side_effects``, beside a process without fcall.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import torch

import fcall
from fcall._core import plan as _plan
from tests.support import Sliced


def test_import_and_use_leave_torch_and_tensordict_as_they_were():
    script = textwrap.dedent(
        """
        import torch
        from torch import nn
        from torch.nn.modules import module as torch_module
        import tensordict
        from tensordict import TensorDictBase

        def hooks():
            return {
                name: dict(getattr(torch_module, name))
                for name in dir(torch_module)
                if name.startswith("_global_") and isinstance(getattr(torch_module, name), dict)
            }

        from tensordict import base as td_base
        from tensordict._contextlib import LAST_OP_MAPS

        before = hooks()
        methods = dict(vars(TensorDictBase))
        exit_ops = dict(LAST_OP_MAPS)
        undo_ops = set(getattr(td_base, "_UNDO_ON_ERROR_OPS", ()))
        import fcall

        m = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
        p = fcall.from_module(m).detach().clone()
        with fcall.swap(p, m):
            m(torch.randn(3, 2))
        with fcall.to_module(p, m):
            m(torch.randn(3, 2))
        fcall.functional_call(m, dict(p.flatten_keys(".")), (torch.randn(3, 2),))
        with fcall.TensorDictParams(p).to_module(m):
            pass
        assert hooks() == before, (hooks(), before)
        assert dict(vars(TensorDictBase)) == methods
        # fcall's own `with`-undoable ops are added to tensordict's registries, nothing else
        assert {k: v for k, v in LAST_OP_MAPS.items() if k in exit_ops} == exit_ops
        added = set(LAST_OP_MAPS) - set(exit_ops)
        assert added and all(name.startswith("_fcall_") for name in added), added
        undo_now = set(getattr(td_base, "_UNDO_ON_ERROR_OPS", ()))
        assert undo_ops <= undo_now and all(n.startswith("_fcall_") for n in undo_now - undo_ops)
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr


def test_a_layer_slicing_forward_keeps_the_cached_plan():
    m = Sliced()
    p = fcall.from_module(m).detach().clone()
    x = torch.randn(2, 4)
    with fcall.swap(p, m):
        m(x)
    (cached,) = _plan.cached(m)
    expected = torch.func.functional_call(m, dict(p.flatten_keys(".")), x)
    for _ in range(3):
        m(x)  # registers every layer into a new ModuleList
        with fcall.swap(p, m):
            torch.testing.assert_close(m(x), expected)
        assert _plan.cached(m) == [cached]
        assert cached.staleness.holds()
