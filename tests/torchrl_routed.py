"""TorchRL's own losses built and run with fcall behind tensordict (``fcall.behind_tensordict``)
or on stock tensordict: DQN, DoubleDQN, SAC, DDPG and TD3 with tiny networks.

Shared by ``tests/test_torchrl_routed.py``, ``compile_tests/test_torchrl_routed_compile.py``
and ``benchmarks/torchrl_losses.py``. Importing it skips the importing test module when
torchrl is not installed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("torchrl", reason="torchrl is not installed (the torchrl nox stack has it)")

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.data import Bounded, OneHot
from torchrl.modules import MLP, Actor, ProbabilisticActor, QValueActor, TanhNormal, ValueOperator
from torchrl.objectives import DDPGLoss, DQNLoss, LossModule, SACLoss, TD3Loss

import fcall

OBS, ACTIONS, BATCH, HIDDEN = 4, 3, 6, 8
LOSSES = ["dqn", "double_dqn", "sac", "ddpg", "td3"]
FILTERWARNINGS = [
    "ignore:torch._dynamo.config.inline_inbuilt_nn_modules is deprecated:FutureWarning",
    "ignore:No target network updater has been associated:UserWarning",
]


@contextlib.contextmanager
def backed_by(library: str) -> Iterator[None]:
    """``"fcall"``: fcall behind tensordict for the block; ``"tensordict"``: stock."""
    if library == "fcall":
        with fcall.behind_tensordict():
            yield
    else:
        yield


def _spec() -> Bounded:
    return Bounded(-torch.ones(ACTIONS), torch.ones(ACTIONS), (ACTIONS,))


def _critic() -> ValueOperator:
    net = MLP(in_features=OBS + ACTIONS, out_features=1, num_cells=[HIDDEN])
    return ValueOperator(net, in_keys=["observation", "action"])


def make_loss(name: str, seed: int = 0) -> LossModule:
    """TorchRL's loss ``name`` on tiny networks (the same weights for the same seed)."""
    torch.manual_seed(seed)
    loss: LossModule
    if name in ("dqn", "double_dqn"):
        net = MLP(in_features=OBS, out_features=ACTIONS, num_cells=[HIDDEN])
        actor = QValueActor(net, in_keys=["observation"], spec=OneHot(ACTIONS))
        loss = DQNLoss(actor, delay_value=True, double_dqn=name == "double_dqn")
    elif name == "sac":
        body = MLP(in_features=OBS, out_features=2 * ACTIONS, num_cells=[HIDDEN])
        module = TensorDictModule(
            nn.Sequential(body, NormalParamExtractor()),
            in_keys=["observation"],
            out_keys=["loc", "scale"],
        )
        actor = ProbabilisticActor(
            module, in_keys=["loc", "scale"], spec=_spec(), distribution_class=TanhNormal
        )
        loss = SACLoss(actor, _critic(), num_qvalue_nets=2, action_spec=_spec())
    elif name in ("ddpg", "td3"):
        net = MLP(in_features=OBS, out_features=ACTIONS, num_cells=[HIDDEN])
        actor = Actor(net, in_keys=["observation"], spec=_spec())
        if name == "ddpg":
            loss = DDPGLoss(actor, _critic())
        else:
            loss = TD3Loss(actor, _critic(), action_spec=_spec())
    else:
        raise ValueError(f"unknown loss {name!r}; one of {LOSSES}")
    loss.make_value_estimator(gamma=0.9)
    return loss


def make_batch(name: str, seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    nxt = {
        "observation": torch.randn(BATCH, OBS, generator=g),
        "reward": torch.randn(BATCH, 1, generator=g),
        "done": torch.rand(BATCH, 1, generator=g) < 0.3,
    }
    nxt["terminated"] = nxt["done"].clone()
    if name in ("dqn", "double_dqn"):
        action = nn.functional.one_hot(torch.randint(ACTIONS, (BATCH,), generator=g), ACTIONS)
    else:
        action = torch.rand(BATCH, ACTIONS, generator=g) * 2 - 1
    obs = torch.randn(BATCH, OBS, generator=g)
    return TensorDict({"observation": obs, "action": action, "next": nxt}, [BATCH])


def total(out: TensorDictBase) -> torch.Tensor:
    """The sum of a loss's ``loss*`` entries (what a training step backpropagates)."""
    return sum(v for k, v in out.items() if k.startswith("loss"))  # type: ignore[return-value]


def run(loss: LossModule, forward: Callable[[TensorDictBase], Any], td: TensorDict, seed: int):
    """``forward(td)`` with the random state at ``seed``; the loss entries and the gradients
    of the loss's parameters after backpropagating their sum."""
    loss.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = forward(td.clone())
    total(out).backward()
    losses = {k: v.detach() for k, v in out.items() if k.startswith("loss")}
    grads = {n: p.grad.clone() for n, p in loss.named_parameters() if p.grad is not None}
    return losses, grads
