"""Evaluate many checkpoints and averaged weights (EMA, SWA) with one compiled model.

Training keeps cheap snapshots of the parameters *and buffers* (BatchNorm
statistics) as TensorDicts, an exponential moving average (EMA) of them, and at
the end a stochastic weight average (SWA) of the last snapshots. Evaluation
compiles the model once, ``torch.compile(model)``, and swaps every parameter set
into it with ``with fcall.to_module(params, compiled):``.

``to_module`` keeps the module's state: a plain tensor that replaces a Parameter
goes in as a Parameter with the old ``requires_grad``, a buffer stays a buffer.
So every parameter set looks to Dynamo exactly like the model's own weights, and
the sweep runs with zero recompiles (``fail_on_recompile`` would raise).

What this script checks:

* one compiled frame serves the model's own weights, every checkpoint, the EMA
  and the SWA weights; no recompile;
* each compiled evaluation equals eager ``torch.func.functional_call`` with the
  same values;
* after the sweep the module holds its own Parameter and buffer objects again.

Run: ``python examples/checkpoint_sweep.py`` (CPU, a few seconds).
"""

import time

import torch
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

import fcall

FEATURES, HIDDEN, BATCH, STEPS, EVERY, EMA_DECAY, SWA_LAST = 6, 32, 64, 60, 10, 0.9, 3


def make_net() -> nn.Module:
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.BatchNorm1d(HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1)
    )


def ema_update(ema, online, decay):
    """``ema <- decay * ema + (1 - decay) * online`` for floats; integer buffers are copied."""
    with torch.no_grad():
        ema.apply_(
            lambda e, o: e.lerp_(o, 1 - decay) if e.is_floating_point() else e.copy_(o), online
        )


def swa_average(snapshots):
    """The mean of the snapshots (integer buffers: the last one's)."""
    stacked = torch.stack(snapshots)
    return stacked.apply(
        lambda t: t.mean(0) if t.is_floating_point() else t[-1], batch_size=torch.Size(())
    )


def main() -> None:
    start = time.perf_counter()
    torch.manual_seed(0)
    model = make_net()
    weights = torch.randn(FEATURES, 1)
    x_val = torch.randn(256, FEATURES)
    y_val = x_val @ weights

    # --- training, eager, keeping snapshots and an EMA -------------------------
    online = fcall.from_module(model)  # the live Parameters and buffers
    ema = online.detach().clone()
    snapshots = []
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(1, STEPS + 1):
        x = torch.randn(BATCH, FEATURES)
        loss = nn.functional.mse_loss(model(x), x @ weights)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ema_update(ema, online, EMA_DECAY)
        if step % EVERY == 0:
            snapshots.append(online.detach().clone())
    swa = swa_average(snapshots[-SWA_LAST:])
    candidates = {f"step {EVERY * (i + 1)}": s for i, s in enumerate(snapshots)}
    candidates.update(ema=ema, swa=swa)

    # --- evaluation: one compiled model, every parameter set swapped in -------
    model.eval()
    own = list(model.parameters()) + list(model.buffers())
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)

    results = {}
    with torch.no_grad():
        results["own weights"] = nn.functional.mse_loss(compiled(x_val), y_val).item()
        with torch.compiler.set_stance("fail_on_recompile"):
            for name, params in candidates.items():
                with fcall.to_module(params, compiled):
                    prediction = compiled(x_val)
                flat = dict(params.flatten_keys(".").items())
                torch.testing.assert_close(
                    prediction, torch.func.functional_call(model, flat, (x_val,))
                )
                results[name] = nn.functional.mse_loss(prediction, y_val).item()

    assert counter.frame_count == 1, f"expected one compiled frame, got {counter.frame_count}"
    now = list(model.parameters()) + list(model.buffers())
    assert len(now) == len(own) and all(a is b for a, b in zip(now, own))
    torch.testing.assert_close(
        swa["0", "weight"], sum(s["0", "weight"] for s in snapshots[-SWA_LAST:]) / SWA_LAST
    )
    assert results["step 10"] > results[f"step {STEPS}"], "later checkpoints should be better"

    best = min(results, key=results.get)
    table = ", ".join(f"{name}: {value:.4f}" for name, value in results.items())
    print(
        f"checkpoint_sweep: {len(results)} parameter sets, {counter.frame_count} frame, "
        f"0 recompiles; validation MSE {table}; best: {best} "
        f"({time.perf_counter() - start:.1f} s)"
    )


if __name__ == "__main__":
    main()
