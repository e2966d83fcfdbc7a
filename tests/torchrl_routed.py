"""TorchRL's own losses built and run with fcall behind tensordict (``fcall.behind_tensordict``)
or on stock tensordict: DQN, DoubleDQN, SAC, DDPG and TD3 with tiny networks.

Shared by ``compile_tests/test_torchrl_routed_compile.py`` and
``benchmarks/torchrl.py``; the DQN and SAC losses and the batches are
``tests/torchrl_losses.py``'s. Importing it skips the importing test module when
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
from torchrl.data import Bounded
from torchrl.modules import MLP, Actor, ValueOperator
from torchrl.objectives import DDPGLoss, LossModule, TD3Loss

import fcall
from tests import torchrl_losses as _losses

ACTIONS, FILTERWARNINGS, GAMMA, HIDDEN, OBS = (
    _losses.ACTIONS,
    _losses.FILTERWARNINGS,
    _losses.GAMMA,
    _losses.HIDDEN,
    _losses.OBS,
)
dqn_batch, dqn_loss, sac_batch, sac_loss = (
    _losses.dqn_batch,
    _losses.dqn_loss,
    _losses.sac_batch,
    _losses.sac_loss,
)

LOSSES = ["dqn", "double_dqn", "sac", "ddpg", "td3"]
__all__ = ["FILTERWARNINGS", "LOSSES", "backed_by", "make_batch", "make_loss", "run", "total"]


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


def make_loss(name: str, seed: int = 0) -> LossModule:
    """TorchRL's loss ``name`` on tiny networks (the same weights for the same seed): DQN and
    SAC as ``tests/torchrl_losses.py`` builds them, DDPG and TD3 with the same critic."""
    torch.manual_seed(seed)
    loss: LossModule
    if name in ("dqn", "double_dqn"):
        loss = dqn_loss(double_dqn=name == "double_dqn")[0]
    elif name == "sac":
        loss = sac_loss()[0]
    elif name in ("ddpg", "td3"):
        net = MLP(in_features=OBS, out_features=ACTIONS, num_cells=[HIDDEN])
        actor = Actor(net, in_keys=["observation"], spec=_spec())
        qnet = MLP(in_features=OBS + ACTIONS, out_features=1, num_cells=[HIDDEN])
        critic = ValueOperator(qnet, in_keys=["observation", "action"])
        if name == "ddpg":
            loss = DDPGLoss(actor, critic)
        else:
            loss = TD3Loss(actor, critic, action_spec=_spec())
        loss.make_value_estimator(gamma=GAMMA)
    else:
        raise ValueError(f"unknown loss {name!r}; one of {LOSSES}")
    return loss


def make_batch(name: str, seed: int = 0) -> TensorDict:
    """``tests/torchrl_losses.py``'s batches: one-hot actions for DQN, continuous ones else."""
    generator = torch.Generator().manual_seed(seed)
    return (dqn_batch if name in ("dqn", "double_dqn") else sac_batch)(generator)


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
