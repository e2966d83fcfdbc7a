"""``torch.compile(model)`` in a plain training loop, with swapped parameter sets.

One compiled module with a BatchNorm layer, two independent parameter sets
(``fcall.from_module(net, as_module=True).clone()``: a ``fcall.TensorDictParams``
whose running stats stay buffers; each set has its own optimizer), trained in
alternation: every step swaps one set into the compiled module with
``with fcall.swap(params, compiled):``, runs the forward pass in train mode (the set's
running stats are updated), and calls ``backward()`` after the block. The gradients
land on the swapped-in Parameters, because ``swap`` puts the values in as they are.

What this script checks:

* both parameter sets train (their losses go down) and follow an eager twin
  (``torch.func.functional_call`` on plain tensors) step for step, running stats too;
* each set registers 6 parameters and 3 buffers, as the net does (wrapping a plain
  TensorDict would make the running stats Parameters);
* the compiled module is traced once: one frame for both parameter sets and for
  the module's own weights, no recompile;
* the module's own weights and running stats are neither trained nor replaced.

Run: ``python examples/compiled_training_loop.py`` (CPU, a few seconds).
"""

import time

import torch
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

import fcall

FEATURES, HIDDEN, BATCH, STEPS, LR = 4, 32, 64, 30, 1e-2


def make_net() -> nn.Module:
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.BatchNorm1d(HIDDEN), nn.GELU(), nn.Linear(HIDDEN, 1)
    )


def main() -> None:
    start = time.perf_counter()
    torch.manual_seed(0)
    model = make_net()
    own_objects = list(model.parameters())

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)

    # Two parameter sets for the same architecture, e.g. two seeds or two tasks.
    # as_module=True: the running stats stay buffers (the optimizer must not see them).
    sets = {name: fcall.from_module(make_net(), as_module=True).clone() for name in ("a", "b")}
    for params in sets.values():
        assert (len(list(params.parameters())), len(list(params.buffers()))) == (6, 3)
    optimizers = {name: torch.optim.Adam(p.parameters(), lr=LR) for name, p in sets.items()}
    targets = {"a": lambda x: x.sum(-1, keepdim=True), "b": lambda x: x[:, :1] * x[:, 1:2]}

    # The eager twin: the same values as plain leaf tensors, with torch.func.
    twins = {
        name: {
            k: v.detach().clone().requires_grad_(isinstance(v, nn.Parameter))
            for k, v in p.flatten_keys(".").items()
        }
        for name, p in sets.items()
    }
    twin_optimizers = {
        name: torch.optim.Adam([v for v in t.values() if v.requires_grad], lr=LR)
        for name, t in twins.items()
    }

    # The module's own weights make the first graph. (Grad mode is guarded too: a call
    # under torch.no_grad() would be a second graph.)
    compiled(torch.randn(BATCH, FEATURES))
    own = {name: t.detach().clone() for name, t in model.state_dict().items()}

    history = {"a": [], "b": []}
    with torch.compiler.set_stance("fail_on_recompile"):
        for _ in range(STEPS):
            for name, params in sets.items():
                x = torch.randn(BATCH, FEATURES)
                y = targets[name](x)
                with fcall.swap(params, compiled):
                    loss = nn.functional.mse_loss(compiled(x), y)
                optimizers[name].zero_grad()
                loss.backward()
                optimizers[name].step()
                history[name].append(loss.item())

                twin_loss = nn.functional.mse_loss(
                    torch.func.functional_call(model, twins[name], (x,)), y
                )
                twin_optimizers[name].zero_grad()
                twin_loss.backward()
                twin_optimizers[name].step()
                torch.testing.assert_close(loss, twin_loss, rtol=1e-4, atol=1e-5)

    assert counter.frame_count == 1, f"expected one compiled frame, got {counter.frame_count}"
    for name, params in sets.items():
        first, last = history[name][0], sum(history[name][-5:]) / 5
        assert last < first / 2, f"set {name} should train: {first:.4f} -> {last:.4f}"
        for key, value in params.flatten_keys(".").items():
            torch.testing.assert_close(value, twins[name][key], rtol=1e-4, atol=1e-5)
    assert all(a is b for a, b in zip(model.parameters(), own_objects))
    for name, t in model.state_dict().items():
        assert torch.equal(t, own[name]), f"the model's own {name} must not change"

    summary = ", ".join(f"set {n}: {h[0]:.4f} -> {sum(h[-5:]) / 5:.4f}" for n, h in history.items())
    print(
        f"compiled_training_loop: 2 parameter sets x {STEPS} steps, "
        f"{counter.frame_count} frame, 0 recompiles, {summary} "
        f"({time.perf_counter() - start:.1f} s)"
    )


if __name__ == "__main__":
    main()
