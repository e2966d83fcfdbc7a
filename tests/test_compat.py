"""fcall behaves the same on every supported tensordict (fcall/_compat.py).

These tests run on every stack of the version matrix (noxfile.py); on tensordict 0.15
they pin tensordict's own behaviour, on 0.14 the code in ``_compat`` that gives it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from support import assert_same_state, state
from tensordict import TensorDict
from torch import nn

import fcall


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))


def _zeros(m: nn.Module) -> TensorDict:
    return fcall.from_module(m).detach().clone().zero_()


@pytest.mark.parametrize("form", ["returned", "swap_dest"])
def test_a_block_that_raises_restores_the_module(form):
    m = _model()
    before = state(m)
    dest = TensorDict() if form == "swap_dest" else None
    with pytest.raises(ValueError, match="inside the block"):
        with fcall.to_module(_zeros(m), m, swap_dest=dest):
            assert bool((m[0].weight == 0).all())
            raise ValueError("inside the block")
    assert_same_state(m, before)


def test_a_block_that_raises_leaves_the_op_queue_empty():
    m = _model()
    out = fcall.to_module(_zeros(m), m)
    with pytest.raises(ValueError):
        with out:
            raise ValueError("inside the block")
    assert not out.__dict__.get("_last_op_queue")


_LOCK_AFTER_RAISE = """
import tensordict, sys
if sys.argv[1] == "with-fcall":
    import fcall
td = tensordict.TensorDict(a=0)
try:
    with td.lock_():
        raise ValueError
except ValueError:
    pass
print(td.is_locked)
"""


def test_tensordicts_own_ops_keep_the_installed_tensordicts_behaviour():
    # fcall registers its ops with tensordict; tensordict's own ops (here lock_ in a
    # block that raises: undone by 0.15, not by 0.14) must behave as without fcall.
    def locked_after_raise(mode: str) -> str:
        run = [sys.executable, "-c", _LOCK_AFTER_RAISE, mode]
        return subprocess.run(run, capture_output=True, text=True, check=True).stdout

    assert locked_after_raise("with-fcall") == locked_after_raise("without-fcall")


def test_to_keeps_each_leafs_registration():
    p = fcall.TensorDictParams(
        TensorDict(w=torch.ones(2), i=torch.arange(2), frozen=nn.Parameter(torch.ones(2), False))
    )
    q = p.to(torch.float64)
    assert isinstance(q, fcall.TensorDictParams)
    assert isinstance(q["w"], nn.Parameter) and q["w"].dtype == torch.float64
    assert isinstance(q["frozen"], nn.Parameter) and not q["frozen"].requires_grad
    # an integer buffer cast to a float dtype stays a buffer
    assert not isinstance(q["i"], nn.Parameter) and q["i"].dtype == torch.float64
    assert [n for n, _ in q.named_buffers()] == ["i"]
