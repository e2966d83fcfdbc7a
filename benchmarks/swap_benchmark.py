"""Side-by-side cost of swapping parameter sets: fcall, tensordict, torch.func, the floor.

Run from the repository root:

    python benchmarks/swap_benchmark.py            # the full table, JSON and plot
    python benchmarks/swap_benchmark.py --quick    # eager table only, small sizes

Everything is measured in one process, one thread, as medians of repeated runs,
and reported as ratios to the peers; absolute times on shared machines are noise.

1. Eager swap + restore, no forward, on ``nn.Sequential`` of ``Linear(4, 4)``
   (2 leaves per layer), per leaf:
   - ``fcall.swap``:        ``with fcall.swap(td, m): pass``
   - ``fcall.to_module``:   ``with fcall.to_module(td, m): pass``
   - ``tensordict``:        ``with td.to_module(m): pass``
   - ``torch.func``:        ``with torch.nn.utils.stateless._reparametrize_module(m, flat): pass``
   - ``floor``:             a loop of precomputed ``owner._parameters[name] = tensor`` writes
2. Compiled call ``f(x, params)`` that swaps and calls (inductor): per-call time and
   first-compile time, fcall with a nested TensorDict against ``torch.func.functional_call``
   with a flat dict (and tensordict's ``to_module``).
3. ``torch.compile(model)`` with ``fcall.swap`` outside the compiled call: recompiles.
4. Peak memory of a swap with a parameter set of at least 1 GB.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.nn.utils.stateless import _reparametrize_module

import fcall

ROOT = Path(__file__).resolve().parent.parent
EAGER_PEERS = ["fcall.swap", "fcall.to_module", "tensordict", "torch.func", "floor"]
FCALL_APIS = ["fcall.swap", "fcall.to_module"]


def chain(leaves: int) -> nn.Sequential:
    return nn.Sequential(*[nn.Linear(4, 4) for _ in range(leaves // 2)])


def batch_seconds(fn: Callable[[], object], number: int, repeat: int) -> list[float]:
    """Seconds per call of ``repeat`` batches of ``number`` calls, after one warm call."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - start) / number)
    return times


def median_seconds(fn: Callable[[], object], number: int, repeat: int = 9) -> float:
    return statistics.median(batch_seconds(fn, number, repeat))


def eager_swaps(model: nn.Module) -> dict[str, Callable[[], None]]:
    td = fcall.from_module(model).detach().clone().requires_grad_()
    td = td.apply(nn.Parameter)  # leaves that need no conversion in any peer
    flat = {".".join(key): value for key, value in td.items(True, True)}
    slots = []
    for name, _ in model.named_parameters():
        owner_name, _, leaf = name.rpartition(".")
        slots.append((model.get_submodule(owner_name)._parameters, leaf, flat[name]))

    def fcall_swap() -> None:
        with fcall.swap(td, model):
            pass

    def fcall_to_module() -> None:
        with fcall.to_module(td, model):
            pass

    def tensordict_to_module() -> None:
        with td.to_module(model):
            pass

    def torch_func() -> None:
        with _reparametrize_module(model, flat):
            pass

    def floor() -> None:
        old = []
        for slot, name, value in slots:
            old.append(slot[name])
            slot[name] = value
        for (slot, name, _), value in zip(slots, old):
            slot[name] = value

    return dict(
        zip(EAGER_PEERS, [fcall_swap, fcall_to_module, tensordict_to_module, torch_func, floor])
    )


def in_turn(peers: dict[str, Callable], round_: int) -> list[tuple[str, Callable]]:
    """The peers in the order of ``round_``: reversed every other round, so that no peer
    always runs right after the same one (caches, clock ramps)."""
    order = list(peers.items())
    return order[::-1] if round_ % 2 else order


RATIOS = [(api, peer) for peer in ("torch.func", "floor") for api in FCALL_APIS]


def eager_table(
    sizes: list[int], rounds: int = 15
) -> tuple[dict[int, dict[str, float]], dict[int, dict[str, float]]]:
    """Per leaf, the median over ``rounds`` of each peer, the peers taking turns in each
    round (``in_turn``): load that comes and goes on a shared machine hits every peer
    alike. The ratios are, like the compiled ones, the median over rounds of each
    round's ratio."""
    results, ratios = {}, {}
    for leaves in sizes:
        model = chain(leaves)
        swaps = eager_swaps(model)
        number = max(3, 20_000 // leaves)
        times: dict[str, list[float]] = {peer: [] for peer in swaps}
        for peer, fn in swaps.items():
            for _ in range(2 if peer in FCALL_APIS else 1):  # warm: fcall's cached plan
                fn()
        for round_ in range(rounds):
            for peer, fn in in_turn(swaps, round_):
                start = time.perf_counter()
                for _ in range(number):
                    fn()
                times[peer].append((time.perf_counter() - start) / number)
        results[leaves] = {
            peer: statistics.median(samples) / leaves * 1e6 for peer, samples in times.items()
        }
        ratios[leaves] = {
            f"{api} / {peer}": statistics.median(a / b for a, b in zip(times[api], times[peer]))
            for api, peer in RATIOS
        }
        print_eager_row(leaves, results[leaves], ratios[leaves])
    return results, ratios


def print_eager_row(leaves: int, row: dict[str, float], ratios: dict[str, float]) -> None:
    cells = "".join(f"{row[peer]:>17.3f}" for peer in EAGER_PEERS)
    print(f"{leaves:>7}{cells}" + "".join(f"{ratio:>9.2f}x" for ratio in ratios.values()))


BASE_PEER = "torch.func (flat dict)"
FCALL_PEER = "fcall.swap (nested TD)"


def _swap_and_call_peers(model: nn.Module) -> dict[str, Callable]:
    def with_functional_call(x, p):
        return torch.func.functional_call(model, p, (x,))

    def with_fcall_swap(x, p):
        with fcall.swap(p, model):
            return model(x)

    def with_tensordict(x, p):
        with p.to_module(model):
            return model(x)

    return {
        "torch.func (flat dict)": with_functional_call,
        "fcall.swap (nested TD)": with_fcall_swap,
        "tensordict (nested TD)": with_tensordict,
    }


def compiled_calls(
    sizes: list[int], backend: str, rounds: int = 31, compile_rounds: int = 3
) -> dict[int, dict[str, dict[str, float]]]:
    """First-compile time of each peer, then per-call times with the peers taking turns.

    The call ratio is the median over rounds of each round's ratio to
    ``functional_call``: the peers of one round run back to back, so load that
    comes and goes on a shared machine cancels out of the ratio. The compile ratio
    is taken the same way over ``compile_rounds`` compiles of fcall and
    ``functional_call`` (tensordict, whose compile takes minutes, is compiled once).

    Inductor's on-disk caches are off (a peer must not reuse another's graph), and a
    small model is compiled first with every peer so that no peer pays the imports.
    """
    torch._inductor.config.fx_graph_cache = False
    torch._inductor.config.autotune_local_cache = False
    torch._functorch.config.enable_autograd_cache = False
    _compile_all(chain(4), backend)  # warm-up: lazy imports, first-use initialisation
    results = {}
    for leaves in sizes:
        compile_s: dict[str, list[float]] = {}
        for round_ in range(compile_rounds):
            peers = None if round_ == compile_rounds - 1 else [BASE_PEER, FCALL_PEER]
            compiled, params, first = _compile_all(chain(leaves), backend, peers)
            for peer, seconds in first.items():
                compile_s.setdefault(peer, []).append(seconds)
        x = torch.randn(8, 4)
        times: dict[str, list[float]] = {peer: [] for peer in compiled}
        least: dict[str, list[float]] = {peer: [] for peer in compiled}
        with torch.no_grad():
            for round_ in range(rounds):
                for peer, fn in in_turn(compiled, round_):
                    batches = batch_seconds(lambda: fn(x, params[peer]), 10, repeat=3)
                    times[peer].append(statistics.median(batches))
                    least[peer].append(min(batches))
        base, base_least = times[BASE_PEER], least[BASE_PEER]
        results[leaves] = {
            peer: {
                "call_us": statistics.median(times[peer]) * 1e6,
                "call_ratio": statistics.median(t / b for t, b in zip(times[peer], base)),
                # load on the other core only ever adds time: the least-disturbed batch
                # of each round, paired the same way, shows how much of the ratio is that
                "call_ratio_of_minimums": statistics.median(
                    t / b for t, b in zip(least[peer], base_least)
                ),
                "first_compile_s": statistics.median(compile_s[peer]),
                "compile_ratio": statistics.median(
                    t / b for t, b in zip(compile_s[peer][::-1], compile_s[BASE_PEER][::-1])
                ),  # reversed: tensordict's one compile pairs with the last round's
            }
            for peer in compiled
        }
        print_compiled_rows(leaves, results[leaves])
    torch._dynamo.reset()
    return results


def _compile_all(
    model: nn.Module, backend: str, only: list[str] | None = None
) -> tuple[dict, dict, dict]:
    td = fcall.from_module(model).detach().clone()
    flat = {".".join(key): value for key, value in td.items(True, True)}
    x = torch.randn(8, 4)
    torch._dynamo.reset()
    compiled, params, first = {}, {}, {}
    for peer, fn in _swap_and_call_peers(model).items():
        if only is not None and peer not in only:
            continue
        params[peer] = flat if peer.startswith("torch.func") else td
        compiled[peer] = torch.compile(fn, backend=backend, fullgraph=peer.startswith("fcall"))
        start = time.perf_counter()
        with torch.no_grad():
            compiled[peer](x, params[peer])
        first[peer] = time.perf_counter() - start
    return compiled, params, first


def print_compiled_rows(leaves: int, rows: dict[str, dict[str, float]]) -> None:
    for peer, row in rows.items():
        print(
            f"{leaves:>7}  {peer:<24}{row['call_us']:>11.1f}{row['call_ratio']:>9.2f}x"
            f"{row['call_ratio_of_minimums']:>11.2f}x"
            f"{row['first_compile_s']:>11.2f}{row['compile_ratio']:>9.2f}x"
        )


def compiled_model_recompiles(leaves: int = 100, sets: int = 5) -> dict[str, float]:
    """``torch.compile(model)``, swaps outside: graphs made, and the eager swap cost.

    ``fcall.swap`` puts values in as they are, so its sets are Parameters (a plain
    tensor where the model has a Parameter is a new guard: one recompile).
    ``fcall.to_module`` keeps the registration, so plain tensors are fine there.
    """
    from torch._dynamo.testing import CompileCounterWithBackend

    results: dict[str, float] = {}
    x = torch.randn(8, 4)
    for name, swap, as_parameters in [
        ("fcall.swap, Parameter sets", fcall.swap, True),
        ("fcall.to_module, plain tensor sets", fcall.to_module, False),
    ]:
        torch._dynamo.reset()
        model = chain(leaves)
        counter = CompileCounterWithBackend("eager")
        compiled = torch.compile(model, backend=counter, fullgraph=True)
        sets_ = []
        for _ in range(sets):
            params = fcall.from_module(model).detach().clone().apply(lambda t: t.normal_())
            sets_.append(params.apply(nn.Parameter) if as_parameters else params)
        for params in sets_:
            with swap(params, compiled):
                compiled(x)

        def swap_only() -> None:
            with swap(sets_[0], compiled):
                pass

        per_leaf = median_seconds(swap_only, 200) / leaves * 1e6
        results[name] = {"recompiles": counter.frame_count - 1, "swap_us_per_leaf": per_leaf}
        print(
            f"  {name:<36} graphs over {sets} sets: {counter.frame_count} "
            f"(recompiles: {counter.frame_count - 1}); eager swap {per_leaf:.3f} µs per leaf"
        )
    torch._dynamo.reset()
    return results


def _rss_peak_kib() -> tuple[int, int]:
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def peak_memory(gib: float = 1.0) -> dict[str, float]:
    """Peak RSS growth during a swap with a parameter set of ``gib`` GiB (Linux)."""
    side = 8192
    layers = max(1, round(gib * 2**30 / (side * side * 4)))
    model = nn.Sequential(*[nn.Linear(side, side, bias=False) for _ in range(layers)])
    params = fcall.from_module(model).detach().clone()
    size_mib = sum(t.numel() * t.element_size() for t in params.values(True, True)) / 2**20
    results = {"param_set_mib": size_mib}
    for name, fn in {
        "fcall.swap": lambda: fcall.swap(params, model),
        "fcall.to_module": lambda: fcall.to_module(params, model),
        "fcall.to_module(inplace=True)": lambda: fcall.to_module(params, model, inplace=True),
    }.items():
        gc.collect()
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak to the current RSS
        before, _ = _rss_peak_kib()
        with fn():
            pass
        _, peak = _rss_peak_kib()
        results[name] = (peak - before) / 1024
        print(f"  {name:<32} peak growth {results[name]:>8.1f} MiB for a {size_mib:.0f} MiB set")
    return results


def plot(eager: dict[int, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(eager)
    fig, ax = plt.subplots(figsize=(6, 4))
    for peer in EAGER_PEERS:
        ax.plot(sizes, [eager[n][peer] * n for n in sizes], marker="o", label=peer)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("leaves swapped")
    ax.set_ylabel("swap + restore, µs (median)")
    ax.set_title("Eager cost of one swap and restore")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="eager table only, small sizes")
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--out", help="JSON path (default: results/latest.json, quick.json)")
    args = parser.parse_args()
    results_dir = ROOT / "benchmarks" / "results"
    # --quick must not overwrite the full run that the docs quote
    default_out = results_dir / ("quick.json" if args.quick else "latest.json")
    torch.set_num_threads(1)
    torch.manual_seed(0)

    sizes = [10, 100, 1000] if args.quick else [10, 100, 1000, 10_000]
    print("Eager swap + restore, µs per leaf (median), and fcall / torch.func, fcall / floor")
    print("(median over rounds of each round's ratio):")
    ratio_names = ("swap/func", "tm/func", "swap/fl", "tm/fl")
    peer_cells = "".join(f"{peer:>17}" for peer in EAGER_PEERS)
    print(f"{'leaves':>7}{peer_cells}" + "".join(f"{name:>10}" for name in ratio_names))
    results: dict[str, object] = {
        "torch": torch.__version__,
    }
    results["eager_us_per_leaf"], results["eager_ratios"] = eager_table(sizes)
    if not args.quick:
        print(f"\nCompiled f(x, params) that swaps and calls ({args.backend}); call ratio:")
        print("median over rounds of each round's ratio to functional_call; min ratio: the same")
        print("with each round's fastest batch of 10 calls instead of its median")
        print(
            f"{'leaves':>7}  {'peer':<24}{'µs/call':>11}{'ratio':>10}{'min ratio':>12}"
            f"{'compile s':>11}{'ratio':>10}"
        )
        results["compiled"] = compiled_calls([100, 1000], args.backend)
        print("\ntorch.compile(model), fcall.swap outside the compiled call:")
        results["compiled_model"] = compiled_model_recompiles()
        print("\nPeak memory of one swap:")
        results["memory_mib"] = peak_memory()
    out = Path(args.out) if args.out else default_out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {out}")
    if not args.quick:  # after the JSON: a missing matplotlib loses no measurement
        plot(results["eager_us_per_leaf"], ROOT / "docs" / "perf_swap.png")
        print(f"drew {ROOT / 'docs' / 'perf_swap.png'}")


if __name__ == "__main__":
    main()
