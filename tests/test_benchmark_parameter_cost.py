"""``python -m benchmarks parameter_cost``: every eager cell runs, and the checks that a cache of
Parameter wrappers would need (what its "cache at best" row times) catch each way a block
can leave its mark on a wrapper, so the row times checks that would be enough."""

import pathlib
import sys
import weakref

import pytest
import torch
from torch import nn

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import parameter_cost  # noqa: E402


def test_every_eager_cell_runs():
    cells = parameter_cost.eager_cells(4)
    assert len(cells) == 7
    for cell in cells.values():
        cell()
    assert cells["  a wrapper cache at best (swap + checks)"]() is True


def _wrappers() -> tuple[list[nn.Parameter], list[torch.Tensor]]:
    values = [torch.randn(3), torch.randn(2)]
    return [torch.Tensor._make_subclass(nn.Parameter, v, True) for v in values], values


MARKS = {
    "a .grad": lambda w, v, held: setattr(w[0], "grad", torch.ones(3)),
    "a hook": lambda w, v, held: w[0].register_hook(lambda g: g),
    "a post-accumulate hook": lambda w, v, held: w[1].register_post_accumulate_grad_hook(
        lambda p: None
    ),
    "requires_grad turned off": lambda w, v, held: w[0].requires_grad_(False),
    "an attribute": lambda w, v, held: setattr(w[1], "note", 1),
    "a reference kept": lambda w, v, held: held.append(w[0]),
    "a weak reference kept": lambda w, v, held: held.append(weakref.ref(w[1])),
    "an autograd graph": lambda w, v, held: held.append(w[0] * 2),
    "new data": lambda w, v, held: setattr(w[0], "data", torch.zeros(3)),
    "another value": lambda w, v, held: v.__setitem__(1, torch.randn(2)),
}


@pytest.mark.parametrize("mark", MARKS)
def test_the_reuse_checks_catch(mark):
    wrappers, values = _wrappers()
    checks = parameter_cost._reuse_checks(wrappers, values)
    assert checks()
    held: list = []
    MARKS[mark](wrappers, values, held)
    assert not checks(), f"a wrapper with {mark} would be reused"
