"""Evaluate N DCP checkpoints of an FSDP2 model without touching its weights, using fcall.

A short FSDP2 training run writes a checkpoint every few steps with
``torch.distributed.checkpoint`` (each rank writes its shards); then every checkpoint is read
as a parameter set laid out like the model (DTensors with its mesh and placements: each rank
holds its shards only) and swapped in for the evaluation. Runs itself on 2 gloo ranks on
127.0.0.1 (CPU) and removes its checkpoints at the end:

    python examples/dcp_checkpoint_sweep.py

See docs/guides/dcp-checkpoints.md.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import fcall

WORLD, STEPS, EVERY = 2, 6, 2


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(seed))
    return x, x.sum(dim=1, keepdim=True)  # learn the sum of the inputs


def train(model: nn.Module, rank: int, root: str) -> list[str]:
    """A short FSDP2 run; every EVERY steps each rank writes its shards of a checkpoint."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    paths = []
    for step in range(1, STEPS + 1):
        x, y = batch(100 * step + rank)  # each rank its own data
        loss = (model(x) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % EVERY == 0:
            path = os.path.join(root, f"step{step}")
            dcp.save(model.state_dict(), checkpoint_id=path)  # DTensors: shard-wise
            paths.append(path)
    return paths


def sweep(model: nn.Module, paths: list[str], rank: int) -> dict[str, float]:
    """The evaluation loss of every checkpoint, the model's own weights kept."""
    x, y = batch(seed=0)  # the same evaluation batch on every rank
    losses = {}
    for path in paths:
        params = fcall.from_checkpoint(path, model)  # this rank's shards only
        with torch.no_grad(), fcall.swap(params, model):
            losses[os.path.basename(path)] = (model(x) - y).pow(2).mean().item()
    return losses


def check(model: nn.Module, paths: list[str], losses: dict[str, float]) -> None:
    """Each loss is the one of an unsharded twin loaded with the checkpoint's full state."""
    x, y = batch(seed=0)
    for path in paths:
        twin = make_model()
        state = twin.state_dict()
        dcp.load(state, checkpoint_id=path)  # full tensors on every rank
        twin.load_state_dict(state)
        expected = (twin(x) - y).pow(2).mean().item()
        got = losses[os.path.basename(path)]
        assert abs(got - expected) < 1e-5 * max(1.0, expected), (path, got, expected)


def worker(rank: int, port: int, root: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        model = make_model()
        mesh = init_device_mesh("cpu", (WORLD,))
        fully_shard(model[0], mesh=mesh)
        fully_shard(model, mesh=mesh)
        paths = train(model, rank, root)
        own = {n: p.to_local().clone() for n, p in model.named_parameters()}

        losses = sweep(model, paths, rank)

        model.reshard()
        assert all(torch.equal(p.to_local(), own[n]) for n, p in model.named_parameters())
        check(model, paths, losses)
        if rank == 0:
            for name, loss in losses.items():
                print(f"dcp_checkpoint_sweep: {name} eval loss {loss:.4f}", flush=True)
            best = min(losses, key=losses.__getitem__)
            print(f"dcp_checkpoint_sweep: best {best}; the model's own weights unchanged")
            sys.stdout.flush()
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # Done and torn down: leave without the interpreter's own teardown, during which gloo's
    # worker threads sometimes abort the process (as examples/distributed_target_network.py).
    os._exit(0)


def main() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="dcp_sweep_") as root:
        mp.spawn(worker, args=(port, root), nprocs=WORLD)  # joins; kills both if one fails


if __name__ == "__main__":
    main()
