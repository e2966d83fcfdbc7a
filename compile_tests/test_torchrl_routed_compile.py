"""TorchRL's losses compiled with fcall behind tensordict (issue 25, point 5): no more graphs,
breaks or recompiles than on stock tensordict, ``fullgraph=True`` where stock has it, and the
losses and gradients of stock's eager forward.

``torch.compile(loss)`` over three batches (a new random state each), counted by a counting
backend; stock tensordict is compiled the same way in the same test, so the comparison is
the test's own. Skipped without torchrl (the torchrl nox stack runs it).
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch._inductor.config
from torch._dynamo.utils import counters

import fcall
from tests import torchrl_routed as trl

pytestmark = [pytest.mark.filterwarnings(w) for w in trl.FILTERWARNINGS]

SEEDS = (1, 2, 3)


def _compiled_runs(name: str, library: str, backend: str, counter, fullgraph: bool):
    """(frames, graph breaks, [(losses, grads) per seed]) of the compiled loss."""
    torch._dynamo.reset()
    counters.clear()
    with trl.backed_by(library):
        loss = trl.make_loss(name)
        if library == "fcall":  # the route took effect: the loss holds fcall's class
            assert all(
                type(p) is fcall.TensorDictParams
                for n, p in loss.named_children()
                if n.endswith("_params")
            )
        cnt = counter(backend)
        compiled = torch.compile(loss, backend=cnt, fullgraph=fullgraph)
        runs = [trl.run(loss, compiled, trl.make_batch(name, seed), seed) for seed in SEEDS]
    breaks = sum(counters["graph_break"].values())
    return cnt.frame_count, breaks, runs


def _eager_runs(name: str):
    loss = trl.make_loss(name)
    return [trl.run(loss, loss, trl.make_batch(name, seed), seed) for seed in SEEDS]


def _assert_same(runs, reference) -> None:
    for (losses, grads), (ref_losses, ref_grads) in zip(runs, reference, strict=True):
        assert losses.keys() == ref_losses.keys() and grads.keys() == ref_grads.keys()
        for key in ref_losses:
            torch.testing.assert_close(losses[key], ref_losses[key])
        for key in ref_grads:
            torch.testing.assert_close(grads[key], ref_grads[key])


@pytest.mark.parametrize("name", trl.LOSSES)
def test_routed_loss_compiles_as_on_stock(name, counter):
    """fullgraph=True on both (so no graph break on either), the same graph count over three
    batches (so no recompile stock does not have), and stock's eager losses and grads."""
    stock = _compiled_runs(name, "tensordict", "aot_eager", counter, fullgraph=True)
    ours = _compiled_runs(name, "fcall", "aot_eager", counter, fullgraph=True)
    assert ours[0] <= stock[0], f"graphs: fcall {ours[0]}, stock {stock[0]}"
    assert ours[1] == stock[1] == 0, f"graph breaks: fcall {ours[1]}, stock {stock[1]}"
    reference = _eager_runs(name)
    _assert_same(stock[2], reference)
    _assert_same(ours[2], reference)


def test_routed_sac_compiles_with_inductor(counter):
    """Inductor's own random numbers differ from eager's: fallback_random draws eager's."""
    with torch._inductor.config.patch(fallback_random=True):
        stock = _compiled_runs("sac", "tensordict", "inductor", counter, fullgraph=True)
        ours = _compiled_runs("sac", "fcall", "inductor", counter, fullgraph=True)
    assert ours[0] <= stock[0]
    reference = _eager_runs("sac")
    for (losses, grads), (ref_losses, ref_grads) in zip(ours[2], reference, strict=True):
        for key in ref_losses:
            torch.testing.assert_close(losses[key], ref_losses[key], rtol=1e-4, atol=1e-5)
        for key in ref_grads:
            torch.testing.assert_close(grads[key], ref_grads[key], rtol=1e-4, atol=1e-5)
