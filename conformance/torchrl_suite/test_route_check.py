"""Sanity check that ``--against`` really routes TorchRL's losses (not vendored: fcall's own)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictParams
from torch import nn
from torchrl.data import Bounded
from torchrl.modules.tensordict_module.actors import Actor, ValueOperator
from torchrl.objectives import DDPGLoss


def _ddpg_loss() -> DDPGLoss:
    actor = Actor(spec=Bounded(-1.0, 1.0, (2,)), module=nn.Linear(3, 2))

    class Value(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(5, 1)

        def forward(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
            return self.linear(torch.cat([obs, act], -1))

    value = ValueOperator(module=Value(), in_keys=["observation", "action"])
    return DDPGLoss(actor, value, delay_actor=True, delay_value=True)


def test_losses_are_routed(request: pytest.FixtureRequest) -> None:
    import fcall

    loss = _ddpg_loss()
    params = loss.actor_network_params
    assert isinstance(params, TensorDictParams)  # tensordict's class, in both modes
    td = TensorDict(
        {
            "observation": torch.randn(4, 3),
            "action": torch.rand(4, 2),
            ("next", "observation"): torch.randn(4, 3),
            ("next", "reward"): torch.randn(4, 1),
            ("next", "done"): torch.zeros(4, 1, dtype=torch.bool),
            ("next", "terminated"): torch.zeros(4, 1, dtype=torch.bool),
        },
        [4],
    )
    out = loss(td)
    assert torch.isfinite(out["loss_actor"]) and torch.isfinite(out["loss_value"])
    routed = request.config.getoption("--against") == "fcall"
    for name in ("actor_network_params", "target_actor_network_params", "value_network_params"):
        assert isinstance(getattr(loss, name), fcall.TensorDictParams) is routed, name
