"""TorchRL as a client, eager (issue 14, point 4): real DQN and SAC losses, their
parameter sets swapped into their networks through fcall, equal to TorchRL's own path.

Skipped when torchrl is not installed; the torchrl stack of ``noxfile.py`` (torch
2.13.0, tensordict 0.14.3, torchrl 0.14.1) runs it. The compiled half is
``compile_tests/test_torchrl_compile.py``.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchrl", reason="torchrl is not installed (the torchrl nox stack has it)")

from tensordict.nn import TensorDictParams

from tests import torchrl_losses as trl

pytestmark = [
    *(pytest.mark.filterwarnings(w) for w in trl.FILTERWARNINGS),
]


def _grads(params: TensorDictParams) -> dict:
    return {k: v.grad.clone() for k, v in params.items(True, True) if v.grad is not None}


def _zero_grads(params: TensorDictParams) -> None:
    for v in params.values(True, True):
        v.grad = None


# --- what TorchRL keeps ------------------------------------------------------------


def test_torchrl_keeps_the_parameters_as_tensordictparams():
    """The facts docs/torchrl.md states: online params are the network's own Parameters
    in a TensorDictParams; target params are detached clones, plain tensors; SAC's
    Q-ensemble is stacked along a leading dimension."""
    loss, _ = trl.dqn_loss()
    online, target = loss.value_network_params, loss.target_value_network_params
    assert type(online) is TensorDictParams and type(target) is TensorDictParams
    own = dict(loss.value_network.named_parameters())
    flat_online = online.flatten_keys(".")
    assert sorted(flat_online.keys()) == sorted(own)
    assert all(flat_online[name] is p for name, p in own.items())
    for key, value in target.items(True, True):
        assert type(value) is torch.Tensor and not value.requires_grad
        assert value.data_ptr() != online[key].data_ptr()
        assert torch.equal(value, online[key])

    sac, _ = trl.sac_loss()
    shapes = {k: v.shape for k, v in sac.qvalue_network_params.items(True, True)}
    assert shapes[("module", "0", "weight")] == (2, trl.HIDDEN, trl.OBS + trl.ACTIONS)
    assert all(s[0] == 2 for s in shapes.values())
    assert type(sac.target_qvalue_network_params) is TensorDictParams


def test_softupdate_writes_the_target_in_place():
    """SoftUpdate's step lerps into the target's own tensors: a compiled swap of them
    sees new values, not new objects (why no recompile follows it)."""
    loss, updater = trl.dqn_loss()
    target = loss.target_value_network_params
    leaves = list(target.values(True, True))
    before = [t.clone() for t in leaves]
    with torch.no_grad():
        for p in loss.value_network_params.values(True, True):
            p.add_(1.0)
    updater.step()
    assert all(a is b for a, b in zip(target.values(True, True), leaves))
    for old, new, online in zip(before, leaves, loss.value_network_params.values(True, True)):
        torch.testing.assert_close(new, trl.EPS * old + (1 - trl.EPS) * online)


# --- DQN ---------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["value_network_params", "target_value_network_params"])
@pytest.mark.parametrize("api", trl.APIS)
def test_dqn_params_through_fcall_match_tensordict(api, which):
    loss, _ = trl.dqn_loss()
    params, net = getattr(loss, which), loss.value_network
    td = trl.dqn_batch(torch.Generator().manual_seed(0))
    before = trl.snapshot(net)
    ours = trl.call_with(api, params, net, td.clone(False))
    trl.assert_restored(net, before)
    theirs = trl.call_with_tensordict(params, net, td.clone(False))
    for key in ("action_value", "chosen_action_value", "action"):
        torch.testing.assert_close(ours[key], theirs[key], rtol=0, atol=0, msg=key)


@pytest.mark.parametrize("api", trl.APIS)
def test_dqn_loss_through_fcall_equals_torchrl(api):
    """The DQN loss written with fcall's swaps equals ``DQNLoss.forward``, value and
    gradients, over batches with optimizer and SoftUpdate steps in between."""
    loss, updater = trl.dqn_loss()
    online, net = loss.value_network_params, loss.value_network
    optimizer = torch.optim.SGD(list(online.values(True, True)), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        td = trl.dqn_batch(generator)
        theirs = loss(td.clone())["loss"]
        theirs.backward()
        their_grads = _grads(online)
        _zero_grads(online)
        before = trl.snapshot(net)
        ours = trl.dqn_loss_with(api, loss, td)
        ours.backward()
        trl.assert_restored(net, before)
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
        assert _grads(online).keys() == their_grads.keys() and their_grads
        for key, grad in _grads(online).items():
            torch.testing.assert_close(grad, their_grads[key], rtol=0, atol=0, msg=str(key))
        optimizer.step()
        _zero_grads(online)
        updater.step()


# --- SAC ---------------------------------------------------------------------------


@pytest.mark.parametrize("api", trl.APIS)
def test_sac_actor_through_fcall_matches_tensordict(api):
    loss, _ = trl.sac_loss()
    td = trl.sac_batch(torch.Generator().manual_seed(2))
    before = trl.snapshot(loss.actor_network)
    ours = trl.sac_actor_with(api, loss, td)
    trl.assert_restored(loss.actor_network, before)
    with trl.set_exploration_type(trl.ExplorationType.DETERMINISTIC):
        theirs = trl.call_with_tensordict(
            loss.actor_network_params, loss.actor_network, td.clone(False)
        )
    for key in ("loc", "scale", "action"):
        torch.testing.assert_close(ours[key], theirs[key], rtol=0, atol=0, msg=key)


@pytest.mark.parametrize("which", ["qvalue_network_params", "target_qvalue_network_params"])
@pytest.mark.parametrize("api", trl.APIS)
def test_sac_qvalue_ensemble_through_fcall_matches_tensordict(api, which):
    """Both Q-nets at once: ``torch.vmap`` of fcall's swap over the stacked params."""
    loss, _ = trl.sac_loss()
    params, net = getattr(loss, which), loss.qvalue_network
    td = trl.sac_batch(torch.Generator().manual_seed(3)).select("observation", "action")
    before = trl.snapshot(net)

    def ours_call(p, module, td):
        return trl.call_with(api, p, module, td)

    ours = trl.ensemble(ours_call, params, net, td)
    trl.assert_restored(net, before)
    theirs = trl.ensemble(trl.call_with_tensordict, params, net, td)
    assert ours.shape == (2, trl.BATCH, 1)
    assert not torch.equal(ours[0], ours[1])  # two different nets
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


@pytest.mark.parametrize("api", trl.APIS)
def test_sac_qvalue_loss_through_fcall_equals_torchrl(api):
    """SAC's critic loss written with fcall's swaps equals ``SACLoss.forward``'s
    ``loss_qvalue`` (same seed, same draws), value and Q-ensemble gradients."""
    loss, updater = trl.sac_loss()
    q_params = loss.qvalue_network_params
    generator = torch.Generator().manual_seed(4)
    nets = (loss.actor_network, loss.qvalue_network)
    before = [trl.snapshot(n) for n in nets]
    for step in range(2):
        td = trl.sac_batch(generator)
        torch.manual_seed(step)
        theirs = loss(td.clone())["loss_qvalue"]
        theirs.backward()
        their_grads = _grads(q_params)
        loss.zero_grad()
        torch.manual_seed(step)
        ours = trl.sac_qvalue_loss_with(api, loss, td)
        ours.backward()
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
        assert _grads(q_params).keys() == their_grads.keys() and their_grads
        for key, grad in _grads(q_params).items():
            torch.testing.assert_close(grad, their_grads[key], rtol=0, atol=0, msg=str(key))
        loss.zero_grad()
        updater.step()
        for net, snap in zip(nets, before):
            trl.assert_restored(net, snap)


def test_bad_key_in_torchrl_params_names_it_and_leaves_the_network():
    """A key the network lacks: fcall's KeyError names it and the nearest keys, and the
    network is left as it was. tensordict 0.14.3's ``to_module(...,
    preserve_module_state=False)``, as TorchRL calls it, raises ``KeyError('9')`` and
    leaves the network without its Parameters (plain tensors in their place)."""
    loss, _ = trl.dqn_loss()
    net = loss.value_network
    params = loss.target_value_network_params.to_tensordict()
    params["module", "0", "module", "9", "weight"] = torch.zeros(2)
    td = trl.dqn_batch(torch.Generator().manual_seed(5))
    before = trl.snapshot(net)
    message = (
        "fcall.swap: 'module.0.module.9.weight' names no parameter or buffer of QValueActor "
        "(the nearest existing keys: 'module.0.module.2.weight', 'module.0.module.0.weight', "
        "'module.0.module.2.bias'). Keys must match module.named_parameters() / "
        "named_buffers(). The module was left unchanged."
    )
    with pytest.raises(KeyError) as raised:
        trl.call_with("swap", params, net, td.clone(False))
    assert raised.value.args[0] == message
    trl.assert_restored(net, before)

    with pytest.raises(KeyError, match=r"^'9'$"):
        trl.call_with_tensordict(params, net, td.clone(False))
    assert dict(net.named_parameters()) == {}


class _Boom(Exception):
    pass


@pytest.mark.parametrize("api", trl.APIS)
def test_an_error_inside_the_swap_restores_the_network(api):
    """The network raises mid-forward with the target params swapped in: it gets its own
    Parameters back (on tensordict 0.14.3 too, whose ``__exit__`` undoes nothing on error
    by itself)."""
    loss, _ = trl.dqn_loss()
    net = loss.value_network
    td = trl.dqn_batch(torch.Generator().manual_seed(6))
    before = trl.snapshot(net)

    def boom(module, args):
        raise _Boom

    handle = net.register_forward_pre_hook(boom)
    with pytest.raises(_Boom):
        trl.call_with(api, loss.target_value_network_params, net, td.clone(False))
    handle.remove()
    trl.assert_restored(net, before)
