"""A DQN-style target network inside a compiled training step.

The target network is not a second module: it is a second *parameter set*
(``fcall.TensorDictParams``) that the compiled loss swaps into the online
Q-network for the bootstrap term. After each optimizer step a soft (Polyak)
update ``target <- target + tau * (online - target)`` runs, also compiled.

What this script checks:

* the compiled loss is traced once (one frame, no graph break) and never
  recompiles, although the target values change after every step;
* compiled training follows an eager twin (``torch.func.functional_call`` with a
  deep-copied network) step for step;
* the online network keeps its own Parameter objects, so the optimizer keeps
  training them;
* the target trails the online network by exactly the Polyak rule.

Run: ``python examples/target_network.py`` (CPU, a few seconds).
"""

import copy
import time

import torch
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

import fcall

OBS, ACTIONS, BATCH, STEPS = 4, 3, 64, 40
GAMMA, TAU, LR = 0.9, 0.1, 1e-2


def make_q_net() -> nn.Module:
    return nn.Sequential(nn.Linear(OBS, 32), nn.ReLU(), nn.Linear(32, ACTIONS))


def td_loss(q_net, target, obs, action, reward, next_obs, done):
    """Squared TD error; the bootstrap term runs the Q-network with the target params."""
    q = q_net(obs).gather(1, action[:, None]).squeeze(1)
    with torch.no_grad(), fcall.swap(target, q_net):
        next_q = q_net(next_obs).max(dim=1).values
    bootstrap = reward + GAMMA * (1.0 - done) * next_q
    return nn.functional.mse_loss(q, bootstrap)


def soft_update(target, online, tau):
    with torch.no_grad():
        target.lerp_(online, tau)


def eager_twin_loss(q_net, target_net, obs, action, reward, next_obs, done):
    """The same loss, the classic way: a deep-copied target module."""
    q = q_net(obs).gather(1, action[:, None]).squeeze(1)
    with torch.no_grad():
        next_q = target_net(next_obs).max(dim=1).values
    bootstrap = reward + GAMMA * (1.0 - done) * next_q
    return nn.functional.mse_loss(q, bootstrap)


def batch(generator):
    """A synthetic transition batch: reward is a fixed function of (obs, action)."""
    obs = torch.randn(BATCH, OBS, generator=generator)
    action = torch.randint(ACTIONS, (BATCH,), generator=generator)
    reward = obs[:, 0] * (action == 0) - obs[:, 1] * (action == 1) + 0.1 * (action == 2)
    next_obs = torch.randn(BATCH, OBS, generator=generator)
    done = (torch.rand(BATCH, generator=generator) < 0.1).float()
    return obs, action, reward, next_obs, done


def main() -> None:
    start = time.perf_counter()
    torch.manual_seed(0)
    q_net = make_q_net()
    twin, twin_target = copy.deepcopy(q_net), copy.deepcopy(q_net)

    # The target: a detached copy of the online parameters, registered as a module
    # so that it moves with .to() and is saved by state_dict(). as_module=True keeps
    # each entry's registration (a net with BatchNorm keeps its running stats buffers).
    target = fcall.from_module(q_net, as_module=True).detach_registered().clone()
    online = fcall.from_module(q_net)  # the online Parameters themselves, no copy
    own_parameters = list(q_net.parameters())

    counter = CompileCounterWithBackend("aot_eager")
    loss_fn = torch.compile(td_loss, backend=counter, fullgraph=True)
    update = torch.compile(soft_update, backend="eager", fullgraph=True)
    optimizer = torch.optim.Adam(q_net.parameters(), lr=LR)
    twin_optimizer = torch.optim.Adam(twin.parameters(), lr=LR)

    generator = torch.Generator().manual_seed(1)
    losses = []
    for step in range(STEPS):
        data = batch(generator)
        loss = loss_fn(q_net, target, *data)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        update(target, online, TAU)

        twin_loss = eager_twin_loss(twin, twin_target, *data)
        twin_optimizer.zero_grad()
        twin_loss.backward()
        twin_optimizer.step()
        with torch.no_grad():
            for t, o in zip(twin_target.parameters(), twin.parameters()):
                t.lerp_(o, TAU)

        torch.testing.assert_close(loss, twin_loss, rtol=1e-4, atol=1e-5)
        losses.append(loss.item())
        if step == 0:
            # Every later call must reuse the first graph: a recompile raises.
            torch.compiler.set_stance("fail_on_recompile")
    torch.compiler.set_stance("default")

    assert counter.frame_count == 1, f"expected one compiled frame, got {counter.frame_count}"
    # The swap put back the very Parameter objects that the optimizer holds.
    assert all(a is b for a, b in zip(q_net.parameters(), own_parameters))
    for ours, theirs in zip(q_net.parameters(), twin.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
    for (key, ours), theirs in zip(
        target.flatten_keys(".").items(), fcall.from_module(twin_target).flatten_keys(".").values()
    ):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5, msg=key)
    gap = max((target[k] - online[k]).abs().max().item() for k in online.keys(True, True))
    assert gap > 0, "the target trails the online network"
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first, f"loss should decrease: {first:.4f} -> {last:.4f}"

    print(
        f"target_network: {STEPS} compiled steps, {counter.frame_count} frame, 0 recompiles, "
        f"loss {first:.4f} -> {last:.4f}, matches eager twin "
        f"({time.perf_counter() - start:.1f} s)"
    )


if __name__ == "__main__":
    main()
