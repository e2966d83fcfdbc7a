"""A MAML-style inner loop with fcall, compiled, with second-order gradients.

The meta-parameters are the module's own Parameters. For each task, one inner
step builds *adapted* parameters from the gradient of the support loss
(``create_graph=True``, so the adaptation stays differentiable), swaps them into
the same module for the query loss, and the query losses backpropagate through
the inner step to the meta-parameters: gradients of gradients.

The forward pass ``fcall.functional_call(model, params, (x,))`` is compiled with
``fullgraph=True``. ``torch.autograd.grad`` runs outside the compiled function
(Dynamo does not trace autograd calls), and the compiled function uses the
``"eager"`` backend because AOTAutograd, which ``"aot_eager"`` and ``"inductor"``
use, does not support double backward in torch 2.13.

What this script checks:

* the meta-gradients equal a pure-eager ``torch.func.functional_call`` reference,
  and they differ from the first-order approximation (the second-order terms are
  really there);
* the compiled forward has exactly two graphs, one for the meta-parameters
  (``nn.Parameter``) and one for the adapted values (plain tensors); no further
  recompile over all tasks and meta-steps;
* the meta-loss goes down, and the module keeps its own Parameter objects.

Run: ``python examples/maml.py`` (CPU, a few seconds).
"""

import time

import torch
from torch import nn
from torch._dynamo.testing import CompileCounter

import fcall

TASKS, SHOTS, INNER_LR, META_LR, META_STEPS = 4, 10, 0.1, 1e-2, 25


def make_net() -> nn.Module:
    return nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 1))


def sample_tasks(generator):
    """Sine regression tasks: each has its own amplitude and phase."""
    amplitude = 0.5 + 2 * torch.rand(TASKS, 1, 1, generator=generator)
    phase = 3 * torch.rand(TASKS, 1, 1, generator=generator)
    x = 10 * torch.rand(TASKS, 2 * SHOTS, 1, generator=generator) - 5
    y = amplitude * torch.sin(x + phase)
    return x[:, :SHOTS], y[:, :SHOTS], x[:, SHOTS:], y[:, SHOTS:]


def meta_loss(forward, model, tasks, first_order=False):
    """Mean query loss after one inner gradient step per task."""
    meta = dict(model.named_parameters())  # the Parameters themselves
    total = 0.0
    for xs, ys, xq, yq in zip(*tasks):
        support = nn.functional.mse_loss(forward(meta, xs), ys)
        grads = torch.autograd.grad(support, list(meta.values()), create_graph=not first_order)
        # Flat "0.weight" keys work as well as nested TensorDicts.
        adapted = {name: p - INNER_LR * g for (name, p), g in zip(meta.items(), grads)}
        total = total + nn.functional.mse_loss(forward(adapted, xq), yq)
    return total / len(tasks[0])


def main() -> None:
    start = time.perf_counter()
    torch.manual_seed(0)
    model = make_net()
    own = list(model.parameters())

    counter = CompileCounter()  # counts frames, runs the captured graph eagerly

    @torch.compile(backend=counter, fullgraph=True)
    def forward(params, x):
        return fcall.functional_call(model, params, (x,))

    def reference(params, x):
        return torch.func.functional_call(model, params, (x,))

    generator = torch.Generator().manual_seed(1)
    tasks = sample_tasks(generator)

    # 1. Second-order meta-gradients: compiled fcall == eager torch.func.
    compiled_grads = torch.autograd.grad(meta_loss(forward, model, tasks), own)
    eager_grads = torch.autograd.grad(meta_loss(reference, model, tasks), own)
    first_order = torch.autograd.grad(meta_loss(reference, model, tasks, first_order=True), own)
    for ours, theirs in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-6)
    assert any(not torch.allclose(a, b) for a, b in zip(compiled_grads, first_order)), (
        "second-order terms should change the meta-gradient"
    )
    assert counter.frame_count == 2, f"expected 2 graphs, got {counter.frame_count}"

    # 2. Meta-training: new tasks, new adapted values, no recompile.
    optimizer = torch.optim.Adam(model.parameters(), lr=META_LR)
    history = []
    with torch.compiler.set_stance("fail_on_recompile"):
        for _ in range(META_STEPS):
            loss = meta_loss(forward, model, sample_tasks(generator))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            history.append(loss.item())

    assert counter.frame_count == 2, f"recompiled: {counter.frame_count} graphs"
    assert all(a is b for a, b in zip(model.parameters(), own))
    first, last = sum(history[:5]) / 5, sum(history[-5:]) / 5
    assert last < first, f"meta-loss should decrease: {first:.4f} -> {last:.4f}"

    print(
        f"maml: second-order meta-gradients match torch.func, {counter.frame_count} graphs "
        f"(Parameters, adapted tensors), 0 recompiles over {META_STEPS} meta-steps, "
        f"meta-loss {first:.4f} -> {last:.4f} ({time.perf_counter() - start:.1f} s)"
    )


if __name__ == "__main__":
    main()
