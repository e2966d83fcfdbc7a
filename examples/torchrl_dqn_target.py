"""TorchRL's DQNLoss trained by a compiled TD loss that swaps its parameter sets with fcall.

TorchRL's ``DQNLoss(delay_value=True)`` keeps the Q-network's weights as two
``TensorDictParams``: ``loss.value_network_params`` (the network's own Parameters,
trained) and ``loss.target_value_network_params`` (detached copies that
``SoftUpdate`` moves towards them in place). Here a hand-written TD(0) loss swaps
each set into ``loss.value_network`` with ``fcall.swap``, inside one
``torch.compile(fullgraph=True)`` graph.

What this script checks:

* the compiled loss is traced once (one frame, no graph break) and never
  recompiles, although an optimizer step and a SoftUpdate step change the
  parameters after every batch;
* at every step it equals TorchRL's own ``DQNLoss.forward`` (tensordict's
  ``to_module`` swaps, eager) on the same batch;
* the network keeps its own Parameter objects, so the optimizer keeps training them,
  and the loss falls.

Needs torchrl (``pip install torchrl==0.14.1``, which brings tensordict 0.14.3);
without it the script prints one line and exits 0.

Run: ``python examples/torchrl_dqn_target.py`` (CPU, a few seconds).
"""

import importlib.util
import time

import torch
from torch._dynamo.testing import CompileCounterWithBackend

import fcall

HAVE_TORCHRL = importlib.util.find_spec("torchrl") is not None
if HAVE_TORCHRL:
    from tensordict import TensorDict
    from torchrl.data import OneHot
    from torchrl.modules import MLP, QValueActor
    from torchrl.objectives import DQNLoss, SoftUpdate

OBS, ACTIONS, BATCH, STEPS = 4, 3, 64, 30
GAMMA, EPS, LR = 0.9, 0.9, 1e-2


def make_loss() -> tuple["DQNLoss", "SoftUpdate"]:
    # --8<-- [start:make]
    net = MLP(in_features=OBS, out_features=ACTIONS, num_cells=[32])
    actor = QValueActor(net, in_keys=["observation"], spec=OneHot(ACTIONS))
    loss = DQNLoss(actor, delay_value=True)
    loss.make_value_estimator(gamma=GAMMA)
    updater = SoftUpdate(loss, eps=EPS)  # target <- eps * target + (1 - eps) * online
    # --8<-- [end:make]
    return loss, updater


# --8<-- [start:loss]
def td_loss(loss: "DQNLoss", batch: "TensorDict") -> torch.Tensor:
    """DQNLoss's TD(0) loss (l2, mean), its two swaps made by fcall."""
    net = loss.value_network
    with fcall.swap(loss.value_network_params, net):
        action_value = net(batch.clone(False))["action_value"]
    predicted = (action_value * batch["action"]).sum(-1)
    with torch.no_grad(), fcall.swap(loss.target_value_network_params, net):
        next_value = net(batch["next"].clone(False))["chosen_action_value"]
    alive = (~batch["next", "terminated"]).float()
    target = (batch["next", "reward"] + GAMMA * alive * next_value).squeeze(-1)
    return ((predicted - target) ** 2).mean()


# --8<-- [end:loss]


def batch(generator: torch.Generator) -> "TensorDict":
    """Synthetic transitions: the reward is a fixed function of (observation, action)."""
    obs = torch.randn(BATCH, OBS, generator=generator)
    action = torch.randint(ACTIONS, (BATCH,), generator=generator)
    reward = obs[:, 0] * (action == 0) - obs[:, 1] * (action == 1) + 0.1 * (action == 2)
    done = torch.rand(BATCH, 1, generator=generator) < 0.1
    nxt = {
        "observation": torch.randn(BATCH, OBS, generator=generator),
        "reward": reward[:, None],
        "done": done,
        "terminated": done.clone(),
    }
    one_hot = torch.nn.functional.one_hot(action, ACTIONS).float()
    return TensorDict({"observation": obs, "action": one_hot, "next": nxt}, [BATCH])


def main() -> None:
    if not HAVE_TORCHRL:
        print("torchrl_dqn_target: skipped, torchrl is not installed (pip install torchrl==0.14.1)")
        return
    start = time.perf_counter()
    torch.manual_seed(0)
    loss, updater = make_loss()
    own_parameters = list(loss.value_network.parameters())

    # --8<-- [start:train]
    counter = CompileCounterWithBackend("aot_eager")
    loss_fn = torch.compile(td_loss, backend=counter, fullgraph=True)
    optimizer = torch.optim.Adam(loss.parameters(), lr=LR)  # the value_network_params

    generator = torch.Generator().manual_seed(1)
    losses = []
    for step in range(STEPS):
        data = batch(generator)
        # TorchRL's own forward first: an eager tensordict call that sees a new class
        # after compiling recompiles (tensordict 0.14.3 guards its class memo).
        reference = loss(data.clone())["loss"]
        value = loss_fn(loss, data)
        torch.testing.assert_close(value, reference)
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
        updater.step()  # the target params change in place: no recompile
        losses.append(value.item())
        if step == 0:
            torch.compiler.set_stance("fail_on_recompile")  # a recompile now raises
    torch.compiler.set_stance("default")
    # --8<-- [end:train]

    assert counter.frame_count == 1, f"expected one compiled frame, got {counter.frame_count}"
    assert all(a is b for a, b in zip(loss.value_network.parameters(), own_parameters))
    online = loss.value_network_params
    target = loss.target_value_network_params
    gap = max((target[k] - online[k]).abs().max().item() for k in online.keys(True, True))
    assert gap > 0, "the target trails the online network"
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first, f"loss should decrease: {first:.4f} -> {last:.4f}"

    print(
        f"torchrl_dqn_target: {STEPS} compiled steps, {counter.frame_count} frame, "
        f"0 recompiles, loss {first:.4f} -> {last:.4f}, equals DQNLoss.forward "
        f"({time.perf_counter() - start:.1f} s)"
    )


if __name__ == "__main__":
    main()
