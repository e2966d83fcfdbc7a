"""``python -m fcall demo``: fcall beside tensordict and torch.func on two example models.

For each model and each way of swapping a parameter set in, a function
``f(x, params)`` that swaps and calls is compiled with a counting backend, then
called with 5 new parameter sets of the same structure. The table shows how
many graphs Dynamo made on the first call, the graph breaks, the recompiles
over the 5 new sets, the largest difference from eager, and the eager cost of
the swap per call (the median time of a swapped call minus that of a plain call).
"""

from __future__ import annotations

import logging
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

import fcall

SwapCall = Callable[[nn.Module, Any, torch.Tensor], torch.Tensor]


def mlp_with_batchnorm() -> tuple[nn.Module, torch.Tensor]:
    model = nn.Sequential(
        nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
        nn.Linear(32, 4),
    )  # fmt: skip
    return model, torch.randn(8, 16)


def transformer_encoder() -> tuple[nn.Module, torch.Tensor]:
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    return model, torch.randn(2, 5, 16)


MODELS = {"MLP + BatchNorm": mlp_with_batchnorm, "TransformerEncoder": transformer_encoder}


def _tensordict_to_module(model: nn.Module, params: TensorDict, x: torch.Tensor) -> torch.Tensor:
    with params.to_module(model):
        return model(x)


def _torch_func(model: nn.Module, params: dict, x: torch.Tensor) -> torch.Tensor:
    return torch.func.functional_call(model, params, (x,))


def _fcall_swap(model: nn.Module, params: TensorDict, x: torch.Tensor) -> torch.Tensor:
    with fcall.swap(params, model):
        return model(x)


def _fcall_to_module(model: nn.Module, params: TensorDict, x: torch.Tensor) -> torch.Tensor:
    with fcall.to_module(params, model):
        return model(x)


def _tensordict_persistent(model: nn.Module, params: TensorDict, x: torch.Tensor) -> torch.Tensor:
    old = params.to_module(model)
    y = model(x)
    old.to_module(model)
    return y


def _fcall_persistent(model: nn.Module, params: TensorDict, x: torch.Tensor) -> torch.Tensor:
    old = fcall.to_module(params, model)
    y = model(x)
    fcall.to_module(old, model)
    return y


def _tensordict_nested(model: nn.Module, params: TensorDict, x: torch.Tensor) -> torch.Tensor:
    with params.exclude("other").to_module(model):
        y = model(x)
        with params["other"].to_module(model):
            return y + model(x)


def _fcall_nested(model: nn.Module, params: TensorDict, x: torch.Tensor) -> torch.Tensor:
    with fcall.to_module(params.exclude("other"), model):
        y = model(x)
        with fcall.to_module(params["other"], model):
            return y + model(x)


def _tensordict_inplace(model: nn.Module, params: TensorDict, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad(), params.to_module(model, inplace=True):
        return model(x)


def _fcall_inplace(model: nn.Module, params: TensorDict, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad(), fcall.to_module(params, model, inplace=True):
        return model(x)


PEERS: dict[str, tuple[SwapCall, bool]] = {
    # name: (call, whether it takes a flat dict)
    "tensordict to_module": (_tensordict_to_module, False),
    "torch.func.functional_call": (_torch_func, True),
    "fcall.swap": (_fcall_swap, False),
    "fcall.to_module": (_fcall_to_module, False),
}

# The patterns torch.func has no answer for, on the MLP: tensordict vs fcall.
SCENARIOS: dict[str, dict[str, SwapCall]] = {
    "old = to_module(); restore": {
        "tensordict to_module": _tensordict_persistent,
        "fcall.to_module": _fcall_persistent,
    },
    "nested with blocks": {
        "tensordict to_module": _tensordict_nested,
        "fcall.to_module": _fcall_nested,
    },
    "inplace=True": {
        "tensordict to_module": _tensordict_inplace,
        "fcall.to_module": _fcall_inplace,
    },
}


def new_params(model: nn.Module, seed: int, flat: bool, nested: bool = False) -> Any:
    generator = torch.Generator().manual_seed(seed)
    params = fcall.from_module(model).detach().clone()
    for key, value in params.items(include_nested=True, leaves_only=True):
        if value.is_floating_point():
            params[key] = torch.randn(value.shape, generator=generator) * 0.3
    if nested:
        params["other"] = new_params(model, seed + 1000, flat=False)
    if flat:
        return {".".join(key): v for key, v in params.items(True, True)}
    return params


def _copy(params: Any) -> Any:
    if isinstance(params, dict):
        return {key: value.clone() for key, value in params.items()}
    return params.clone()


def measure(
    model_name: str, peer: str, call: SwapCall, flat: bool, sets: int = 5, nested: bool = False
) -> dict[str, Any]:
    model, x = MODELS[model_name]()
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("eager")
    compiled = torch.compile(lambda x, p: call(model, p, x), backend=counter)
    row: dict[str, Any] = {"model": model_name, "peer": peer}
    try:
        first = new_params(model, 0, flat, nested)
        expected = call(model, _copy(first), x)
        got = compiled(x, _copy(first))
        row["graphs"] = counter.frame_count
        diff = (got - expected).abs().max().item()
        for seed in range(1, sets + 1):
            params = new_params(model, seed, flat, nested)
            expected = call(model, _copy(params), x)
            diff = max(diff, (compiled(x, _copy(params)) - expected).abs().max().item())
        row["recompiles"] = counter.frame_count - row["graphs"]
        row["breaks"] = max(row["graphs"] - 1, 0)
        row["max_diff"] = diff
        row["swap_us"] = swap_cost_us(model, call, new_params(model, 99, flat, nested))
    except Exception as error:  # a peer that crashes Dynamo is a result, not a demo failure
        row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:60]}"
    torch._dynamo.reset()
    return row


def swap_cost_us(model: nn.Module, call: SwapCall, params: Any) -> float:
    """Median eager time of a swap and restore around a forward that does nothing, in µs."""
    forward = model.forward
    model.forward = lambda x: x  # the swap alone: no forward cost to subtract
    try:
        times = []
        for _ in range(9):
            start = time.perf_counter()
            for _ in range(50):
                call(model, params, torch.zeros(()))
            times.append((time.perf_counter() - start) / 50)
    finally:
        del model.forward
        assert model.forward == forward
    return statistics.median(times) * 1e6


def table(rows: list[dict[str, Any]]) -> str:
    head = f"{'model':<28}{'peer':<28}{'graphs':>7}{'breaks':>7}{'recompiles':>11}"
    head += f"{'max|c-e|':>11}{'swap µs':>9}"
    lines = [head, "-" * len(head)]
    for row in rows:
        if "error" in row:
            middle = f"  crash: {row['error']}"
        else:
            middle = (
                f"{row['graphs']:>7}{row['breaks']:>7}{row['recompiles']:>11}"
                f"{row['max_diff']:>11.1e}"
            )
            middle += f"{row['swap_us']:>9.1f}"
        lines.append(f"{row['model']:<28}{row['peer']:<28}{middle}")
    return "\n".join(lines)


def main() -> list[dict[str, Any]]:
    # The peers' crashes are results in the table; Dynamo's own logs of them
    # (tracebacks, recompile-limit warnings) would bury it.
    torch._logging.set_logs(all=logging.CRITICAL)
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    print("fcall demo: swapping parameter sets under torch.compile, fcall beside its peers")
    print(f"torch {torch.__version__}; Dynamo with a graph counter; 5 new param sets per row\n")
    rows = [
        measure(model, peer, call, flat) for model in MODELS for peer, (call, flat) in PEERS.items()
    ]
    print(table(rows))
    print("\nPatterns beyond torch.func (MLP + BatchNorm):\n")
    patterns = [
        {
            **measure("MLP + BatchNorm", peer, call, False, nested=name.startswith("nested")),
            "model": name,
        }
        for name, peers in SCENARIOS.items()
        for peer, call in peers.items()
    ]
    print(table(patterns).replace("model  ", "pattern", 1))
    print("\ngraphs: graphs Dynamo made on the first call; breaks: graph breaks in it;")
    print("recompiles: graphs made for the 5 new sets; swap µs: eager swap + restore.")
    return rows + patterns
