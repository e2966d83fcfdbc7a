"""A model ensemble: stacked parameter sets, ``torch.vmap`` over them, compiled.

One module holds the architecture; the ensemble is a TensorDict whose leaves carry
a leading ensemble dimension (``torch.stack`` of the members' parameters).
``torch.vmap`` maps ``fcall.functional_call`` over that dimension, and
``torch.compile(fullgraph=True)`` traces the whole thing once.

What this script checks:

* the compiled, vmapped ensemble equals running each member on its own, eagerly,
  with ``torch.func.functional_call`` (outputs and gradients);
* training the stacked parameters for a few steps is one compiled frame with no
  recompile, and every member's loss goes down;
* the module gets its own Parameter objects back after every vmapped swap.

Run: ``python examples/ensemble_vmap.py`` (CPU, a few seconds).
"""

import time

import torch
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

import fcall

MEMBERS, FEATURES, HIDDEN, BATCH, STEPS, LR = 5, 3, 16, 32, 30, 5e-2


def make_net() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))


def ensemble_loss(model, stacked, x, y):
    """Per-member mean squared error, shape ``[MEMBERS]``."""

    def member_loss(params, x, y):
        prediction = fcall.functional_call(model, params, (x,))
        return ((prediction.squeeze(-1) - y) ** 2).mean()

    return torch.vmap(member_loss, in_dims=(0, None, None))(stacked, x, y)


def main() -> None:
    start = time.perf_counter()
    torch.manual_seed(0)
    model = make_net()
    own = list(model.parameters())

    # Stack independent initialisations along a new leading dimension.
    members = [fcall.from_module(make_net()).detach() for _ in range(MEMBERS)]
    stacked = torch.stack(members).clone()
    stacked.apply_(lambda t: t.requires_grad_())
    assert stacked.batch_size == (MEMBERS,)
    assert stacked["0", "weight"].shape == (MEMBERS, HIDDEN, FEATURES)

    x = torch.randn(BATCH, FEATURES)
    y = torch.sin(x.sum(-1))

    counter = CompileCounterWithBackend("aot_eager")
    compiled_loss = torch.compile(ensemble_loss, backend=counter, fullgraph=True)

    # 1. Parity with running each member by itself.
    losses = compiled_loss(model, stacked, x, y)
    leaves = list(stacked.values(include_nested=True, leaves_only=True))
    grads = torch.autograd.grad(losses.sum(), leaves)
    for i in range(MEMBERS):
        member = {k: v[i].detach().requires_grad_() for k, v in stacked.flatten_keys(".").items()}
        eager = torch.func.functional_call(model, member, (x,))
        eager_loss = ((eager.squeeze(-1) - y) ** 2).mean()
        torch.testing.assert_close(losses[i], eager_loss, rtol=1e-5, atol=1e-6)
        eager_grads = torch.autograd.grad(eager_loss, list(member.values()))
        for grad, eager_grad in zip(grads, eager_grads):
            torch.testing.assert_close(grad[i], eager_grad, rtol=1e-5, atol=1e-6)
    assert all(a is b for a, b in zip(model.parameters(), own))

    # 2. Train all members at once; no recompile is allowed after the first call.
    optimizer = torch.optim.SGD(leaves, lr=LR)
    first = losses.detach()
    with torch.compiler.set_stance("fail_on_recompile"):
        for _ in range(STEPS):
            losses = compiled_loss(model, stacked, x, y)
            optimizer.zero_grad()
            losses.sum().backward()
            optimizer.step()
    last = losses.detach()

    assert counter.frame_count == 1, f"expected one compiled frame, got {counter.frame_count}"
    assert bool((last < first).all()), f"every member should improve: {first} -> {last}"
    assert all(a is b for a, b in zip(model.parameters(), own))

    print(
        f"ensemble_vmap: {MEMBERS} members under vmap, {counter.frame_count} frame, "
        f"0 recompiles over {STEPS} steps, mean loss {first.mean():.4f} -> {last.mean():.4f} "
        f"({time.perf_counter() - start:.1f} s)"
    )


if __name__ == "__main__":
    main()
