"""fcall behaves the same on every supported tensordict (fcall/_compat.py).

These tests run on every stack of the version matrix (noxfile.py); on tensordict 0.15
they pin tensordict's own behaviour, on 0.14 the code in ``_compat`` that gives it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import tensordict.base
import torch
from tensordict import TensorDict
from torch import nn

import fcall
from tests.support import assert_same_state, state


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))


def _zeros(m: nn.Module) -> TensorDict:
    return fcall.from_module(m).detach().clone().zero_()


def test_a_block_that_raises_restores_the_module():
    m = _model()
    before = state(m)
    with pytest.raises(ValueError, match="inside the block"):
        with fcall.to_module(_zeros(m), m):
            assert bool((m[0].weight == 0).all())
            raise ValueError("inside the block")
    assert_same_state(m, before)


def _restored_after_raise(to_module) -> bool:
    m = _model()
    weight = m[0].weight
    with pytest.raises(ValueError, match="inside the block"):
        with to_module(_zeros(m), m, swap_dest=_zeros(m)):
            raise ValueError("inside the block")
    return m[0].weight is weight


def test_a_swap_dest_block_that_raises_exits_as_tensordicts_own():
    # swap_dest is a plain TensorDict: its __exit__ is tensordict's, which fcall does not
    # replace (tensordict 0.15 undoes the swap, 0.14 does not; docs/versions.md)
    undoes = hasattr(tensordict.base, "_UNDO_ON_ERROR_OPS")  # tensordict >= 0.15
    assert _restored_after_raise(fcall.to_module) == undoes
    if not undoes:  # (0.15's own undo of a swap_dest block raises KeyError('swap_dest'))
        assert not _restored_after_raise(TensorDict.to_module)


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
