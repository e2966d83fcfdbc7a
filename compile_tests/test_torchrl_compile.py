"""TorchRL as a client, compiled (issue 14, point 4): the swaps of real DQN and SAC
losses through fcall under ``torch.compile(fullgraph=True)``, counted.

Each test compiles once, then runs 5 new batches under ``fail_on_recompile`` with a
SoftUpdate step (and, for the losses, an optimizer step) between them: the target
parameters change in place, which must not recompile. Every output equals TorchRL's
own eager path, computed first in each step: tensordict 0.14.3's compiled
TensorDictModule guards on the size of its global ``_TENSORCLASS_MEMO``, which an eager
call seeing a new class grows (a recompile with or without fcall). Skipped when
torchrl is not installed. The eager half is ``tests/test_torchrl.py``.
"""

from __future__ import annotations

import pytest
import tensordict
import torch

pytest.importorskip("torchrl", reason="torchrl is not installed (the torchrl nox stack has it)")

from tests import torchrl_losses as trl

pytestmark = [pytest.mark.filterwarnings(w) for w in trl.FILTERWARNINGS]

BATCHES = 5


def _bump(params) -> None:
    """Move the online parameters, so that the SoftUpdate after it changes the target."""
    with torch.no_grad():
        for p in params.values(True, True):
            p.add_(0.05)


@pytest.mark.parametrize("api", trl.APIS)
def test_dqn_target_swap_compiled_matches_tensordict(api, counter):
    loss, updater = trl.dqn_loss()
    net, target = loss.value_network, loss.target_value_network_params

    def q_values(net, params, td):
        return trl.call_with(api, params, net, td.clone(False))["action_value"]

    cnt = counter("aot_eager")
    compiled = torch.compile(q_values, backend=cnt, fullgraph=True)
    generator = torch.Generator().manual_seed(0)
    outputs = []
    for step in range(1 + BATCHES):
        td = trl.dqn_batch(generator)
        theirs = trl.call_with_tensordict(target, net, td.clone(False))["action_value"]
        before = trl.snapshot(net)
        with torch.compiler.set_stance("fail_on_recompile" if step else "default"):
            ours = compiled(net, target, td)
        trl.assert_restored(net, before)
        torch.testing.assert_close(ours, theirs)
        outputs.append(ours)
        _bump(loss.value_network_params)
        updater.step()
    assert cnt.frame_count == 1
    assert not torch.equal(outputs[0], outputs[-1])


@pytest.mark.parametrize("api", trl.APIS)
def test_compiled_swap_leaves_nothing_in_the_graph(api):
    """The graph of the network called with the target params swapped in is, op for op,
    the graph of the network called as it is: the swap is traced away."""
    loss, _ = trl.dqn_loss()
    net, target = loss.value_network, loss.target_value_network_params
    graphs = []

    def backend(gm, example_inputs):
        # placeholders are named after where the tensors come from: keep their count
        graphs.append(
            [(n.op, "" if n.op == "placeholder" else str(n.target)) for n in gm.graph.nodes]
        )
        return gm.forward

    def swapped(net, params, td):
        return trl.call_with(api, params, net, td.clone(False))["action_value"]

    def plain(net, params, td):
        return net(td.clone(False))["action_value"]

    td = trl.dqn_batch(torch.Generator().manual_seed(4))
    for fn in (swapped, plain):
        torch.compile(fn, backend=backend, fullgraph=True)(net, target, td)
    assert len(graphs) == 2 and graphs[0] == graphs[1]
    assert sum(op == "call_function" for op, _ in graphs[0]) >= 3  # linear, tanh, linear


def test_tensordict_guards_its_class_memo_without_fcall(counter):
    """A limit of tensordict 0.14.3, no fcall involved (why the tests here run the eager
    reference first): a compiled TensorDictModule call guards on the size of
    ``tensordict.utils._TENSORCLASS_MEMO``, which any eager ``is_tensorclass`` check of
    a class never seen before grows, so the next call recompiles."""
    loss, _ = trl.dqn_loss()
    net = loss.value_network
    cnt = counter("eager")
    compiled = torch.compile(
        lambda net, td: net(td.clone(False))["action_value"], backend=cnt, fullgraph=True
    )
    generator = torch.Generator().manual_seed(5)
    compiled(net, trl.dqn_batch(generator))
    tensordict.is_tensorclass(type("NeverSeen", (), {}))
    with torch.compiler.set_stance("fail_on_recompile"):
        with pytest.raises(RuntimeError, match=r"len\(.*_TENSORCLASS_MEMO\) != "):
            compiled(net, trl.dqn_batch(generator))
    assert cnt.frame_count == 1


@pytest.mark.parametrize("api", trl.APIS)
def test_dqn_loss_compiled_equals_torchrl(api, counter):
    """The DQN loss written with fcall, compiled, equals ``DQNLoss.forward`` in eager,
    value and gradients, through optimizer and SoftUpdate steps."""
    loss, updater = trl.dqn_loss()
    online = loss.value_network_params
    optimizer = torch.optim.SGD(list(online.values(True, True)), lr=0.1)
    cnt = counter("aot_eager")
    compiled = torch.compile(
        lambda loss, td: trl.dqn_loss_with(api, loss, td), backend=cnt, fullgraph=True
    )
    generator = torch.Generator().manual_seed(1)
    for step in range(1 + BATCHES):
        td = trl.dqn_batch(generator)
        theirs = loss(td.clone())["loss"]
        their_grads = torch.autograd.grad(theirs, list(online.values(True, True)))
        before = trl.snapshot(loss.value_network)
        with torch.compiler.set_stance("fail_on_recompile" if step else "default"):
            ours = compiled(loss, td)
        optimizer.zero_grad()
        ours.backward()
        trl.assert_restored(loss.value_network, before)
        torch.testing.assert_close(ours, theirs)
        for grad, theirs_grad in zip((p.grad for p in online.values(True, True)), their_grads):
            torch.testing.assert_close(grad, theirs_grad)
        optimizer.step()
        updater.step()
    assert cnt.frame_count == 1


@pytest.mark.parametrize(
    ("api", "backend"),
    [("swap", "eager"), ("to_module", "eager"), ("functional_call", "aot_eager")],
)
def test_sac_qvalue_loss_compiled_equals_torchrl(api, backend, counter):
    """SAC's critic loss written with fcall (the actor swap, the Q-ensembles under
    ``torch.vmap``), compiled, equals ``SACLoss.forward``'s ``loss_qvalue`` in eager,
    value and Q-ensemble gradients (aot_eager for one API only: it triples the time)."""
    loss, updater = trl.sac_loss()
    q_leaves = list(loss.qvalue_network_params.values(True, True))
    cnt = counter(backend)
    compiled = torch.compile(
        lambda loss, td: trl.sac_qvalue_loss_with(api, loss, td), backend=cnt, fullgraph=True
    )
    generator = torch.Generator().manual_seed(2)
    nets = (loss.actor_network, loss.qvalue_network)
    for step in range(1 + BATCHES):
        td = trl.sac_batch(generator)
        torch.manual_seed(step)
        theirs = loss(td.clone())["loss_qvalue"]
        their_grads = torch.autograd.grad(theirs, q_leaves)
        before = [trl.snapshot(n) for n in nets]
        torch.manual_seed(step)
        with torch.compiler.set_stance("fail_on_recompile" if step else "default"):
            ours = compiled(loss, td)
        loss.zero_grad()
        ours.backward()
        for net, snap in zip(nets, before):
            trl.assert_restored(net, snap)
        torch.testing.assert_close(ours, theirs)
        for leaf, theirs_grad in zip(q_leaves, their_grads):
            torch.testing.assert_close(leaf.grad, theirs_grad)
        _bump(loss.qvalue_network_params)
        updater.step()
    assert cnt.frame_count == 1


def test_torchrl_sac_forward_and_an_fcall_swap_compile_together(counter):
    """TorchRL's own ``SACLoss.forward`` (tensordict's to_module inside, then
    ``clear_refs_for_compile_()`` on every TensorDictParams) and fcall swaps of the same
    ``actor_network_params`` before and after it in one compiled step: one graph, and no
    recompile when the TensorDictParams gains ``_last_op`` after the first call (issue 15,
    point 13, which reports one recompile; none with torchrl 0.14.1). An
    identical twin loss runs the step in eager (eager to_module leaves a different
    ``_last_op`` behind, so the compiled loss is never called in eager)."""
    torch.manual_seed(0)
    loss, updater = trl.sac_loss()
    torch.manual_seed(0)
    twin, twin_updater = trl.sac_loss()
    actor_params = loss.actor_network_params

    def step_fn(loss, td):
        # before TorchRL's forward the swap reads the params as they come in (a guard on
        # them); after it, as TorchRL's to_module and clear_refs_for_compile_() left them
        policy = trl.sac_actor_with("swap", loss, td)["action"]
        out = loss(td)
        again = trl.sac_actor_with("swap", loss, td)["action"]
        return out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"], policy, again

    cnt = counter("eager")
    compiled = torch.compile(step_fn, backend=cnt, fullgraph=True)
    generator = torch.Generator().manual_seed(3)
    assert "_last_op" not in vars(actor_params)  # what the first trace sees
    for step in range(1 + BATCHES):
        td = trl.sac_batch(generator)
        torch.manual_seed(step)
        theirs = step_fn(twin, td.clone())
        before = trl.snapshot(loss.actor_network)
        torch.manual_seed(step)
        with torch.compiler.set_stance("fail_on_recompile" if step else "default"):
            ours = compiled(loss, td.clone())
        trl.assert_restored(loss.actor_network, before)
        assert vars(actor_params)["_last_op"] is None  # TorchRL's clear_refs_for_compile_()
        torch.testing.assert_close(ours, theirs)
        torch.testing.assert_close(ours[1], ours[2], rtol=0, atol=0)
        for lossi, updateri in ((loss, updater), (twin, twin_updater)):
            _bump(lossi.qvalue_network_params)
            updateri.step()
    assert cnt.frame_count == 1
