"""Real TorchRL losses with tiny networks, and the same losses written with fcall.

Shared by ``tests/test_torchrl.py`` and ``compile_tests/test_torchrl_compile.py``.
Importing this module skips the importing test module when torchrl is not
installed (the default stack has no torchrl; the torchrl stack of ``noxfile.py``
has torchrl 0.14.1 with tensordict 0.14.3).

TorchRL keeps each network's parameters in the loss as a
``tensordict.nn.TensorDictParams`` (``loss.value_network_params`` holds the
network's very Parameters; ``loss.target_value_network_params`` detached clones)
and swaps them into the network with ``params.to_module(net,
preserve_module_state=False)``. ``call_with`` does the same swap through one of
fcall's three APIs; ``call_with_tensordict`` is TorchRL's own way, the reference.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torchrl", reason="torchrl is not installed (the torchrl nox stack has it)")

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.data import Bounded, OneHot
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import MLP, ProbabilisticActor, QValueActor, TanhNormal, ValueOperator
from torchrl.objectives import DQNLoss, SACLoss, SoftUpdate

import fcall

OBS, ACTIONS, BATCH, HIDDEN = 4, 3, 6, 8
GAMMA, EPS = 0.9, 0.8
APIS = ["swap", "to_module", "functional_call"]

# TorchRL's and tensordict's own warnings (none of them is about fcall):
# tensordict 0.14.3 reads a deprecated Dynamo config while tracing its to_module,
# and TorchRL warns that a target network has no updater until SoftUpdate is made.
FILTERWARNINGS = [
    "ignore:torch._dynamo.config.inline_inbuilt_nn_modules is deprecated:FutureWarning",
    "ignore:No target network updater has been associated:UserWarning",
]


# --8<-- [start:apis]
def call_with(api: str, params: TensorDictBase, module: nn.Module, *args: Any) -> Any:
    """``module(*args)`` with ``params`` swapped in by fcall's ``api``."""
    if api == "functional_call":
        return fcall.functional_call(module, params, args)
    if api == "swap":
        with fcall.swap(params, module):
            return module(*args)
    with fcall.to_module(params, module, preserve_module_state=False):
        return module(*args)


def call_with_tensordict(params: TensorDictBase, module: nn.Module, *args: Any) -> Any:
    """``module(*args)`` with ``params`` swapped in as TorchRL's losses do it."""
    with params.to_module(module, preserve_module_state=False):
        return module(*args)


# --8<-- [end:apis]


# --8<-- [start:ensemble]
def ensemble(call: Any, params: TensorDictBase, module: nn.Module, td: TensorDictBase) -> Any:
    """The Q-value ensemble of SAC: ``call(p, module, td)`` mapped by ``torch.vmap`` over
    the leading dimension of ``params`` (TorchRL's ``_vmap_func`` does this with
    ``to_module``), e.g. ``ensemble(fcall_call, loss.qvalue_network_params,
    loss.qvalue_network, td)`` -> ``[num_qvalue_nets, *td.shape, 1]``."""

    def one(p: TensorDictBase, td: TensorDictBase) -> torch.Tensor:
        return call(p, module, td)["state_action_value"]

    return torch.vmap(one, (0, None), randomness="error")(params, td)


# --8<-- [end:ensemble]


def snapshot(module: nn.Module) -> list:
    """Every parameter and buffer of ``module``: name, the object, a copy of its value."""
    return [
        (name, t, type(t), t.detach().clone())
        for name, t in [*module.named_parameters(), *module.named_buffers()]
    ]


def assert_restored(module: nn.Module, before: list) -> None:
    """``module`` holds the very objects of ``before``, with the same values."""
    after = snapshot(module)
    assert [a[:3] for a in after] == [b[:3] for b in before]
    for (name, tensor, _, _), (_, _, _, value) in zip(after, before):
        assert torch.equal(tensor, value), name


# --- DQN ------------------------------------------------------------------------


def dqn_loss(double_dqn: bool = False) -> tuple[DQNLoss, SoftUpdate]:
    """``DQNLoss(delay_value=True)`` on a one-hot QValueActor, and its SoftUpdate."""
    net = MLP(in_features=OBS, out_features=ACTIONS, num_cells=[HIDDEN])
    actor = QValueActor(net, in_keys=["observation"], spec=OneHot(ACTIONS))
    loss = DQNLoss(actor, delay_value=True, double_dqn=double_dqn)
    loss.make_value_estimator(gamma=GAMMA)
    return loss, SoftUpdate(loss, eps=EPS)


def dqn_batch(generator: torch.Generator) -> TensorDict:
    obs = torch.randn(BATCH, OBS, generator=generator)
    action = torch.randint(ACTIONS, (BATCH,), generator=generator)
    nxt = {
        "observation": torch.randn(BATCH, OBS, generator=generator),
        "reward": torch.randn(BATCH, 1, generator=generator),
        "done": torch.rand(BATCH, 1, generator=generator) < 0.3,
    }
    nxt["terminated"] = nxt["done"].clone()
    one_hot = nn.functional.one_hot(action, ACTIONS)
    return TensorDict({"observation": obs, "action": one_hot, "next": nxt}, [BATCH])


def dqn_loss_with(api: str, loss: DQNLoss, td: TensorDictBase) -> torch.Tensor:
    """TorchRL's DQN loss (TD(0), l2, mean), its swaps made by fcall's ``api``."""
    net = loss.value_network
    action_value = call_with(api, loss.value_network_params, net, td.clone(False))["action_value"]
    predicted = (action_value * td["action"].float()).sum(-1)
    with torch.no_grad():
        nxt = call_with(api, loss.target_value_network_params, net, td["next"].clone(False))
        alive = (~td["next", "terminated"]).float()
        target = (td["next", "reward"] + GAMMA * alive * nxt["chosen_action_value"]).squeeze(-1)
    return ((predicted - target) ** 2).mean()


# --- SAC ------------------------------------------------------------------------


def sac_loss() -> tuple[SACLoss, SoftUpdate]:
    """``SACLoss`` (v2: no value network) with a TanhNormal actor, two Q-nets, SoftUpdate."""
    spec = Bounded(-torch.ones(ACTIONS), torch.ones(ACTIONS), (ACTIONS,))
    body = MLP(in_features=OBS, out_features=2 * ACTIONS, num_cells=[HIDDEN])
    module = TensorDictModule(
        nn.Sequential(body, NormalParamExtractor()),
        in_keys=["observation"],
        out_keys=["loc", "scale"],
    )
    actor = ProbabilisticActor(
        module, in_keys=["loc", "scale"], spec=spec, distribution_class=TanhNormal
    )
    qnet = MLP(in_features=OBS + ACTIONS, out_features=1, num_cells=[HIDDEN])
    qvalue = ValueOperator(qnet, in_keys=["observation", "action"])
    loss = SACLoss(actor, qvalue, num_qvalue_nets=2, action_spec=spec)
    loss.make_value_estimator(gamma=GAMMA)
    return loss, SoftUpdate(loss, eps=EPS)


def sac_batch(generator: torch.Generator) -> TensorDict:
    def obs() -> torch.Tensor:
        return torch.randn(BATCH, OBS, generator=generator)

    nxt = {
        "observation": obs(),
        "reward": torch.randn(BATCH, 1, generator=generator),
        "done": torch.rand(BATCH, 1, generator=generator) < 0.3,
    }
    nxt["terminated"] = nxt["done"].clone()
    action = torch.rand(BATCH, ACTIONS, generator=generator) * 2 - 1
    return TensorDict({"observation": obs(), "action": action, "next": nxt}, [BATCH])


def sac_actor_with(api: str, loss: SACLoss, td: TensorDictBase) -> TensorDictBase:
    """The actor's forward with its deterministic action (the TanhNormal's ``loc`` and
    ``scale`` and the action written into a copy of ``td``), swapped in by ``api``."""
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        return call_with(api, loss.actor_network_params, loss.actor_network, td.clone(False))


# --8<-- [start:sac_critic]
def sac_qvalue_loss_with(api: str, loss: SACLoss, td: TensorDictBase) -> torch.Tensor:
    """TorchRL's SAC v2 critic loss (``loss(td)["loss_qvalue"]``), its swaps by ``api``:
    the actor samples the next action, the target Q-ensemble scores it, the online
    Q-ensemble is regressed on the soft TD(0) target (smooth l1, summed over nets).
    Draws the same random numbers in the same order as TorchRL's forward."""

    def call(p: TensorDictBase, module: nn.Module, td: TensorDictBase) -> Any:
        return call_with(api, p, module, td)

    with torch.no_grad():
        nxt = sac_actor_with(api, loss, td["next"])
        # The TanhNormal built from (loc, scale), as the actor's get_dist builds it.
        next_action, log_prob = loss.actor_network[-1].get_dist(nxt).rsample_and_log_prob()
        nxt = nxt.select("observation").set("action", next_action)
        next_q = ensemble(call, loss.target_qvalue_network_params, loss.qvalue_network, nxt)
        next_value = (next_q - loss.log_alpha.exp() * log_prob.unsqueeze(-1)).min(0)[0]
        alive = (~td["next", "terminated"]).float()
        target = (td["next", "reward"] + GAMMA * alive * next_value).squeeze(-1)
    current = td.select("observation", "action")
    predicted = ensemble(call, loss.qvalue_network_params, loss.qvalue_network, current)
    predicted = predicted.squeeze(-1)
    errors = nn.functional.smooth_l1_loss(predicted, target.expand_as(predicted), reduction="none")
    return errors.sum(0).mean()


# --8<-- [end:sac_critic]
