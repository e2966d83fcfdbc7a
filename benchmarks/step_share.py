"""The eager swap's share of realistic steps, eager machinery vs torch.func (issue 26).

Run from the repository root:

    python benchmarks/step_share.py          # about a minute on a 2-core machine
    python benchmarks/step_share.py --quick  # a smoke run, under 30 s

CPU, one thread, median of interleaved rounds (each round runs every function once, in
reversed order every other round). Two sections:

1. Four steps, each with fcall and without a swap:

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
2. Eager machinery at 100 and 1,000 leaves (``Linear(4, 4)`` layers, a ``forward`` that
   reads no parameter, Parameter values): ``fcall.swap`` / ``fcall.functional_call`` with a
   nested TensorDict and a flat dict, ``fcall.to_module`` with a TensorDict, against
   ``torch.nn.utils.stateless._reparametrize_module`` (torch.func's machinery) and
   ``torch.func.functional_call`` with a flat dict; the ratio is the median over rounds of
   each round's cell / peer.

fcall has one (generic) eager path; every swapped module is warmed with a few swaps first,
so that its plan is built and cached before it is timed.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.stateless import _reparametrize_module

import fcall

WARM_SWAPS = 20  # plans built and cached before anything is timed

Fn = Callable[[], Any]


def warm(fn: Fn, times: int = WARM_SWAPS) -> None:
    """``fn`` run ``times`` times (its module's plan built and cached)."""
    for _ in range(times):
        fn()


def _batch(fn: Fn, number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def rounds(fns: dict[str, Fn], count: int, budget_s: float) -> dict[str, list[float]]:
    """Seconds per call of each function, one batch of about ``budget_s`` per round, in
    reversed order every other round (load that comes and goes hits all alike)."""
    numbers = {}
    times: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns)
    for name, fn in fns.items():
        fn()
        numbers[name] = max(1, min(2000, round(budget_s / max(_batch(fn, 1), 1e-7))))
    for round_ in range(count):
        for name in order[::-1] if round_ % 2 else order:
            times[name].append(_batch(fns[name], numbers[name]))
    return times


def median(samples: list[float]) -> float:
    return statistics.median(samples)


def difference(samples: list[float], base: list[float]) -> float:
    """The median over rounds of each round's ``samples - base``."""
    return statistics.median(a - b for a, b in zip(samples, base))


def paired(samples: list[float], base: list[float]) -> float:
    return statistics.median(a / b for a, b in zip(samples, base))


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


def step_rows(steps: list[Step], count: int, budget_s: float) -> list[dict[str, Any]]:
    rows = []
    for step in steps:
        fns: dict[str, Fn] = {"step": step.with_fcall, "without": step.without}
        fns["alone"] = step.swap_alone
        if step.alone_base is not None:
            fns["alone base"] = step.alone_base
        times = rounds(fns, count, budget_s)
        row: dict[str, Any] = {
            "step": step.name,
            "swaps": step.swaps,
            "without": median(times["without"]),
            "with": median(times["step"]),
            "alone": difference(times["alone"], times.get("alone base", [0.0] * count)),
            "diff": difference(times["step"], times["without"]),
        }
        rows.append(row)
        print_step(row)
    return rows


def print_step(row: dict[str, Any]) -> None:
    print(f"\n{row['step']} ({row['swaps']} swap(s) a step)")
    print(
        f"  {'without ms':>10}{'step ms':>10}{'swap alone us':>15}{'share':>8}"
        f"{'step-without us':>17}{'share':>8}"
    )
    print(
        f"  {row['without'] * 1e3:>10.3f}{row['with'] * 1e3:>10.3f}"
        f"{row['alone'] * 1e6:>15.1f}{row['alone'] / row['with'] * 100:>7.2f}%"
        f"{row['diff'] * 1e6:>17.1f}{row['diff'] / row['with'] * 100:>7.2f}%"
    )


# ---------------------------------------------------------------------------- machinery


class ParamsUnread(nn.Sequential):
    """``Linear(4, 4)`` layers, two leaves each; ``forward`` reads none of them."""

    def __init__(self, leaves: int) -> None:
        super().__init__(*[nn.Linear(4, 4) for _ in range(leaves // 2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


CELLS = [
    ("swap", "TensorDict"),
    ("swap", "flat dict"),
    ("functional_call", "TensorDict"),
    ("functional_call", "flat dict"),
    ("to_module", "TensorDict"),
]
PEERS = {"swap": "torch.func machinery", "to_module": "torch.func machinery"}
PEERS["functional_call"] = "torch.func.functional_call"


def parameters(model: nn.Module, container: str) -> Any:
    td = fcall.from_module(model).detach().clone().apply(nn.Parameter)
    return td if container == "TensorDict" else {".".join(k): v for k, v in td.items(True, True)}


def machinery_fn(api: str, model: nn.Module, params: Any, x: torch.Tensor) -> Fn:
    if api == "swap":

        def run() -> Any:
            with fcall.swap(params, model):
                pass

    elif api == "to_module":

        def run() -> Any:
            with fcall.to_module(params, model):
                pass

    elif api == "functional_call":

        def run() -> Any:
            return fcall.functional_call(model, params, (x,))

    elif api == "torch.func machinery":

        def run() -> Any:
            with _reparametrize_module(model, params):
                pass

    elif api == "torch.func.functional_call":

        def run() -> Any:
            return torch.func.functional_call(model, params, (x,))

    else:
        raise ValueError(api)
    return run


def machinery_rows(sizes: list[int], count: int, budget_s: float) -> list[dict[str, Any]]:
    x = torch.randn(8, 4)
    rows = []
    for leaves in sizes:
        fns: dict[str, Fn] = {}
        for peer in sorted(set(PEERS.values())):
            model = ParamsUnread(leaves)
            fns[peer] = machinery_fn(peer, model, parameters(model, "flat dict"), x)
        for api, container in CELLS:
            model = ParamsUnread(leaves)
            cell = f"{api} | {container}"
            fns[cell] = machinery_fn(api, model, parameters(model, container), x)
            warm(fns[cell])
        times = rounds(fns, count, budget_s)
        row: dict[str, Any] = {"leaves": leaves}
        for peer in set(PEERS.values()):
            row[peer] = median(times[peer])
        for api, container in CELLS:
            cell = f"{api} | {container}"
            row[cell] = {
                "us": median(times[cell]) * 1e6,
                "ratio": paired(times[cell], times[PEERS[api]]),
            }
        rows.append(row)
        print_machinery(row)
    return rows


def print_machinery(row: dict[str, Any]) -> None:
    print(f"\neager, {row['leaves']} leaves, Parameter values (median per swap + restore)")
    for peer in sorted(set(PEERS.values())):
        print(f"  {peer + ' | flat dict':<40}{row[peer] * 1e6:>10.1f} us")
    print(f"  {'':<34}{'us':>10}{'ratio':>9}")
    for api, container in CELLS:
        cell = row[f"{api} | {container}"]
        print(
            f"  {api + ' | ' + container:<34}{cell['us']:>10.1f}{cell['ratio']:>8.3f}x"
            f"  (peer: {PEERS[api]})"
        )


# ---------------------------------------------------------------------------- main


def describe() -> str:
    def git(*args: str) -> str:
        found = subprocess.run(["git", *args], capture_output=True, text=True, check=False)
        return found.stdout.strip()

    dirty = " (+ uncommitted changes in fcall/)" if git("status", "--porcelain", "fcall") else ""
    return (
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, commit "
        f"{git('rev-parse', '--short', 'HEAD')}{dirty}, torch {torch.__version__}, "
        f"Python {platform.python_version()}, {torch.get_num_threads()} thread"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run, under 30 s")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    count = 3 if args.quick else 21
    started = time.perf_counter()
    print(describe())
    print("\n1. The eager swap's share of realistic steps (CPU, median of interleaved rounds)")
    builders = [dqn, maml, ensemble, sweep]
    step_rows([build() for build in builders], count, 0.02 if args.quick else 0.15)
    print("\n2. Eager machinery: fcall / torch.func (target <= 0.25x)")
    machinery_rows([100, 1000], count, 0.003 if args.quick else 0.03)
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
