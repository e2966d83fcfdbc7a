"""Memory per rank of parameter sets read from DCP checkpoints (issue 28), CPU, 2 gloo ranks.

An FSDP2 model (``fully_shard`` per layer and at the root) writes 3 DCP checkpoints; each rank
then holds 1 and 3 of them loaded, in three ways:

* ``fcall.from_checkpoint(path, model)``: a set of DTensors laid out like the model;
* a second, unsharded model instance per checkpoint, filled with ``load_state_dict`` from the
  full state dict (``dcp.load`` into its ``state_dict()``): the plain way to keep a model's
  weights and evaluate another checkpoint;
* a second FSDP2 model instance per checkpoint, filled the same way (its ``state_dict()`` holds
  DTensors, so DCP reads shards).

Two numbers per rank and way: ``held``, the bytes of the tensor storages the loaded
checkpoints keep (local shards for DTensors, deduplicated by storage), and ``peak``, how far the
process's resident set rose above where it stood while loading them (Linux ``VmHWM``, reset
through ``/proc/self/clear_refs`` before each measurement, after ``malloc_trim``): DCP's read
buffers included. The median over ``--repeats`` runs is recorded.

    python -m benchmarks checkpoint_memory [--layers 8] [--width 1024] [--repeats 3]
    python -m benchmarks checkpoint_memory --quick     # 2 x Linear(256, 256), once
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import socket
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import fcall

from . import _harness as h

WORLD = 2
MiB = 2**20


def make_model(layers: int, width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])


def sharded(layers: int, width: int) -> nn.Module:
    model = make_model(layers, width)
    mesh = init_device_mesh("cpu", (WORLD,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def storage_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a DTensor's: its local shard's)."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        storage = local.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(load: Callable[[], list[torch.Tensor]]) -> tuple[int, int]:
    """(held, peak) bytes of one way of loading, from a trimmed, reset starting point."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    start = _status("VmRSS")
    tensors = load()
    held = storage_bytes(tensors)
    peak = _status("VmHWM") - start
    del tensors
    return held, peak


def ways(model: nn.Module, paths: list[str], layers: int, width: int) -> dict[str, Callable]:
    def fcall_sets(n: int) -> Callable[[], list[torch.Tensor]]:
        def load() -> list[torch.Tensor]:
            sets = [fcall.from_checkpoint(path, model) for path in paths[:n]]
            return [t for s in sets for t in s.values(True, True)]

        return load

    def second_models(n: int, shard: bool) -> Callable[[], list[torch.Tensor]]:
        def load() -> list[torch.Tensor]:
            kept = []
            for path in paths[:n]:
                twin = sharded(layers, width) if shard else make_model(layers, width)
                state = twin.state_dict()
                dcp.load(state, checkpoint_id=path)
                twin.load_state_dict(state)
                del state
                kept.extend(twin.state_dict(keep_vars=True).values())
            return kept

        return load

    return {
        "fcall.from_checkpoint, 1 set": fcall_sets(1),
        "fcall.from_checkpoint, 3 sets": fcall_sets(3),
        "load_state_dict, 1 unsharded model": second_models(1, shard=False),
        "load_state_dict, 3 unsharded models": second_models(3, shard=False),
        "load_state_dict, 1 FSDP2 model": second_models(1, shard=True),
        "load_state_dict, 3 FSDP2 models": second_models(3, shard=True),
    }


def worker(rank: int, port: int, root: str, args: argparse.Namespace) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        model = sharded(args.layers, args.width)
        paths = []
        for step in range(3):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.01)
            paths.append(os.path.join(root, f"step{step}"))
            dcp.save(model.state_dict(), checkpoint_id=paths[-1])
        fcall.from_checkpoint(paths[0], model)  # warm-up: DCP's first-call imports and pools
        results: dict[str, Any] = {}
        for name, load in ways(model, paths, args.layers, args.width).items():
            runs = [measure(load) for _ in range(args.repeats)]
            results[name] = {
                "held": h.median(r[0] for r in runs),
                "peak": h.median(r[1] for r in runs),
            }
        full = sum(
            p.numel() * p.element_size() for p in make_model(args.layers, args.width).parameters()
        )
        results["_full_model_bytes"] = full
        with open(os.path.join(root, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    os._exit(0)  # as examples/distributed_target_network.py: skip gloo's teardown


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layers", type=int, help="default 8 (quick: 2)")
    parser.add_argument("--width", type=int, help="default 1024 (quick: 256)")
    parser.add_argument("--repeats", type=int, help="default 3 (quick: 1)")


def run(args: argparse.Namespace, record: h.Recorder) -> None:
    args.layers = args.layers or (2 if args.quick else 8)
    args.width = args.width or (256 if args.quick else 1024)
    args.repeats = args.repeats or (1 if args.quick else 3)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="dcp_memory_") as root:
        mp.spawn(worker, args=(port, root, args), nprocs=WORLD)
        per_rank = {}
        for rank in range(WORLD):
            with open(os.path.join(root, f"rank{rank}.json")) as f:
                per_rank[rank] = json.load(f)
    full = per_rank[0].pop("_full_model_bytes")
    per_rank[1].pop("_full_model_bytes")
    title = (
        f"{args.layers} x Linear({args.width}, {args.width}), {full / MiB:.1f} MiB of "
        f"parameters, {WORLD} gloo ranks, median of {args.repeats}: per rank"
    )
    table = record.results[title] = {}
    for name in per_rank[0]:
        for rank in range(WORLD):
            row = per_rank[rank][name]
            table[f"{name}, rank {rank}"] = {
                "held MiB": row["held"] / MiB,
                "peak MiB": row["peak"] / MiB,
                "held / full model": row["held"] / full,
            }
    h.print_rows(title, table, ("held MiB", "peak MiB", "held / full model"))
