"""The eager swap's share of four realistic steps (issue 26).

    python -m benchmarks step_share          # about a minute on a 2-core machine
    python -m benchmarks step_share --quick  # a smoke run, under 30 s

CPU, one thread, medians of interleaved rounds (``_harness.rounds_of``). Four steps
(``STEPS``), each with fcall and without a swap:

   - DQN: a TD update of a 2x256 MLP at batch 256; the target forward runs through
     ``with fcall.swap(target_params, net)`` (without: a second net holds the target);
   - MAML: one task of sinusoid regression, a 1-40-40-1 MLP, 5 inner steps of
     ``fcall.functional_call(model, fast_weights, x)`` with ``torch.autograd.grad(...,
     create_graph=True)``, the query loss, backward and Adam (without: ``F.linear`` on the
     weights);
   - vmap ensemble: 10 MLPs 32-64-64-1 at batch 64, ``torch.vmap`` over their stacked
     params through ``fcall.functional_call``, MSE, backward, Adam (without: ``F.linear``);
   - checkpoint sweep: a 2-layer ``nn.TransformerEncoder`` (d_model 128) in eval mode, 4
     param sets swapped in with ``fcall.swap``, each evaluated on 16x32 tokens under
     ``no_grad`` (without: 4 models).

   Per step, "swap alone" is the step's swaps with nothing inside them (for vmap: under
   ``vmap``, minus the same ``vmap`` without the swap), and "step - without" is the
   step's time minus the step without a swap. Their share is of the step with fcall.
The eager machinery against torch.func (this script's second section until the
benchmarks became one harness) is the matrix's eager section: ``python -m benchmarks
matrix --sections eager --only Parameter --sizes 100,1000``.

fcall has one (generic) eager path; every swapped module is warmed with a few swaps first,
so that its plan is built and cached before it is timed.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import fcall

from . import _harness as h

WARM_SWAPS = 20  # plans built and cached before anything is timed
Fn = h.Fn


def warm(fn: Fn, times: int = WARM_SWAPS) -> None:
    h.warm(fn, times)


# ---------------------------------------------------------------------------- steps


@dataclass
class Step:
    """One realistic step: with fcall, its swaps alone, and without a swap."""

    name: str
    swaps: int  # swaps per step
    with_fcall: Fn
    swap_alone: Fn
    without: Fn  # the step with no swap
    alone_base: Fn | None = None  # subtracted from swap_alone (vmap's own cost)


def mlp(*sizes: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers += [nn.Linear(a, b)] + ([nn.ReLU()] if i < len(sizes) - 2 else [])
    return nn.Sequential(*layers)


def linear_stack(p: dict[str, torch.Tensor], x: torch.Tensor, names: list[str]) -> torch.Tensor:
    """The forward of ``mlp`` on the weights ``p`` (no swap): ``F.linear`` and ReLU."""
    for i, name in enumerate(names):
        x = F.linear(x, p[f"{name}.weight"], p[f"{name}.bias"])
        if i < len(names) - 1:
            x = torch.relu(x)
    return x


def dqn() -> Step:
    obs, act, batch, gamma = 8, 4, 256, 0.99
    s, s2 = torch.randn(batch, obs), torch.randn(batch, obs)
    a = torch.randint(act, (batch, 1))
    r, done = torch.randn(batch), torch.zeros(batch)

    def update(net: nn.Module, opt: torch.optim.Optimizer, target_q: Callable) -> None:
        q = net(s).gather(1, a).squeeze(1)
        with torch.no_grad():
            y = r + gamma * (1 - done) * target_q(s2).max(1).values
        loss = F.smooth_l1_loss(q, y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    net = mlp(obs, 256, 256, act)
    target = fcall.from_module(net).detach().clone()
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)

    def target_q(x: torch.Tensor) -> torch.Tensor:
        with fcall.swap(target, net):
            return net(x)

    def alone() -> None:
        with fcall.swap(target, net):
            pass

    warm(alone)
    plain, target_net = mlp(obs, 256, 256, act), mlp(obs, 256, 256, act)
    plain_opt = torch.optim.Adam(plain.parameters(), lr=1e-4)
    return Step(
        "DQN update, 2x256 MLP, batch 256",
        swaps=1,
        with_fcall=lambda: update(net, opt, target_q),
        swap_alone=alone,
        without=lambda: update(plain, plain_opt, target_net),
    )


def maml(inner_steps: int = 5) -> Step:
    shots, alpha = 10, 0.01
    xs, xq = torch.rand(shots, 1) * 10 - 5, torch.rand(shots, 1) * 10 - 5
    ys, yq = torch.sin(xs), torch.sin(xq)
    names = ["0", "2", "4"]

    def adapt(params: dict[str, torch.Tensor], forward: Callable, opt: torch.optim.Optimizer):
        fast = params
        for _ in range(inner_steps):
            loss = F.mse_loss(forward(fast, xs), ys)
            grads = torch.autograd.grad(loss, list(fast.values()), create_graph=True)
            fast = {k: w - alpha * g for (k, w), g in zip(fast.items(), grads)}
        loss = F.mse_loss(forward(fast, xq), yq)
        opt.zero_grad()
        loss.backward()
        opt.step()

    model = mlp(1, 40, 40, 1)
    params: dict[str, torch.Tensor] = dict(model.named_parameters())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    fast = {k: v * 1.0 for k, v in params.items()}  # non-leaf tensors, as in the loop

    def alone() -> None:
        with fcall.swap(params, model):
            pass
        for _ in range(inner_steps):
            with fcall.swap(fast, model):
                pass

    warm(alone)
    plain = mlp(1, 40, 40, 1)
    plain_params: dict[str, torch.Tensor] = dict(plain.named_parameters())
    plain_opt = torch.optim.Adam(plain.parameters(), lr=1e-3)
    return Step(
        f"MAML task, 1-40-40-1 MLP, {inner_steps} inner steps",
        swaps=inner_steps + 1,
        with_fcall=lambda: adapt(params, lambda p, x: fcall.functional_call(model, p, (x,)), opt),
        swap_alone=alone,
        without=lambda: adapt(plain_params, lambda p, x: linear_stack(p, x, names), plain_opt),
    )


def ensemble(members: int = 10) -> Step:
    x, y = torch.randn(64, 32), torch.randn(members, 64, 1)
    names = ["0", "2", "4"]

    def stacked() -> tuple[nn.Module, dict[str, torch.Tensor], torch.optim.Optimizer]:
        nets = [mlp(32, 64, 64, 1) for _ in range(members)]
        params, _ = torch.func.stack_module_state(nets)
        return nets[0], params, torch.optim.Adam(params.values(), lr=1e-3)

    def train(forward: Callable, params: dict, opt: torch.optim.Optimizer) -> None:
        out = torch.vmap(forward, in_dims=(0, None))(params, x)
        loss = F.mse_loss(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    def first_bias(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return p["0.bias"].sum()

    base, params, opt = stacked()

    def swap_then_bias(p: dict[str, torch.Tensor], x: torch.Tensor) -> Any:
        with fcall.swap(p, base):
            return p["0.bias"].sum()

    def alone() -> None:
        torch.vmap(swap_then_bias, in_dims=(0, None))(params, x)

    warm(alone)
    _, plain_params, plain_opt = stacked()
    _, base_params, _ = stacked()
    return Step(
        f"vmap ensemble, {members} MLPs 32-64-64-1, batch 64",
        swaps=1,
        with_fcall=lambda: train(lambda p, x: fcall.functional_call(base, p, (x,)), params, opt),
        swap_alone=alone,
        without=lambda: train(lambda p, x: linear_stack(p, x, names), plain_params, plain_opt),
        alone_base=lambda: torch.vmap(first_bias, in_dims=(0, None))(base_params, x),
    )


def sweep(checkpoints: int = 4) -> Step:
    x = torch.randn(16, 32, 128)

    def encoder() -> nn.Module:
        layer = nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True)
        return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()

    model = encoder()
    base = fcall.from_module(model).detach()
    params = [base.apply(lambda t: t + 0.01 * torch.randn_like(t)) for _ in range(checkpoints)]

    @torch.no_grad()
    def with_fcall() -> list[float]:
        scores = []
        for p in params:
            with fcall.swap(p, model):
                scores.append(model(x).square().mean().item())
        return scores

    def alone() -> None:
        for p in params:
            with fcall.swap(p, model):
                pass

    warm(alone)
    models = [encoder() for _ in range(checkpoints)]

    @torch.no_grad()
    def without() -> list[float]:
        return [m(x).square().mean().item() for m in models]

    return Step(
        f"checkpoint sweep, 2-layer TransformerEncoder d128, {checkpoints} sets",
        swaps=checkpoints,
        with_fcall=with_fcall,
        swap_alone=alone,
        without=without,
    )


STEPS = [dqn, maml, ensemble, sweep]


def step_row(step: Step, rounds: int, budget_s: float) -> dict[str, float]:
    fns: dict[str, Fn] = {"step": step.with_fcall, "without": step.without}
    fns["alone"] = step.swap_alone
    if step.alone_base is not None:
        fns["alone base"] = step.alone_base
    numbers = {name: h.calls_in(fn, budget_s) for name, fn in fns.items()}
    times, _ = h.rounds_of(fns, rounds, numbers)
    alone = h.difference(times["alone"], times.get("alone base", [0.0] * rounds))
    diff = h.difference(times["step"], times["without"])
    with_fcall = h.median(times["step"])
    return {
        "swaps": step.swaps,
        "without, ms": h.median(times["without"]) * 1e3,
        "step, ms": with_fcall * 1e3,
        "swap alone, µs": alone * 1e6,
        "share, %": alone / with_fcall * 100,
        "step - without, µs": diff * 1e6,
        "step - without, %": diff / with_fcall * 100,
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, help="default 21 (quick: 3)")


def run(args: argparse.Namespace, record: h.Recorder) -> None:
    rounds = args.rounds or (3 if args.quick else 21)
    table = record.results.setdefault("the eager swap's share of each step", {})
    for build in STEPS:
        step = build()
        name = f"{step.name} ({step.swaps})"
        table[name] = step_row(step, rounds, 0.02 if args.quick else 0.15)
        h.print_rows(step.name, {name: table[name]}, table[name])
        record.save()
