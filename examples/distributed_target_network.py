"""A target network (EMA of the online weights) with FSDP2 and with DDP, using fcall.

Runs itself on 2 gloo ranks on 127.0.0.1 (CPU):

    python examples/distributed_target_network.py

See docs/distributed.md.
"""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

import fcall

WORLD, STEPS, TAU = 2, 3, 0.5


def make_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))


def td_step(model: nn.Module, target, opt, x: torch.Tensor) -> None:
    """One TD-style step: the target network gives the regression target."""
    with torch.no_grad():
        # values without gradients: under FSDP2 fcall copies them into the sharded
        # parameters for the call and restores the module exactly afterwards
        y_target = fcall.functional_call(model, target, (x,))
    loss = (model(x) - y_target - 1).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    with torch.no_grad():  # EMA of the online weights, shard by shard (no communication)
        online = model.module if isinstance(model, DDP) else model  # keys without "module."
        target.lerp_(fcall.from_module(online).detach(), TAU)


def fsdp_example(rank: int) -> None:
    model = make_mlp()
    mesh = init_device_mesh("cpu", (WORLD,))
    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)
    # DTensors with the module's own placements: each rank holds its shards only
    target = fcall.from_module(model).detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(100 * step + rank))
        td_step(model, target, opt, x)
    # check: the swapped call equals an unsharded module holding the target's values
    x = torch.ones(3, 4)
    full = {k: v.full_tensor() for k, v in target.flatten_keys(".").items()}
    expected = torch.func.functional_call(make_mlp(), full, (x,))
    with torch.no_grad():
        got = fcall.functional_call(model, target, (x,))
    assert torch.allclose(got, expected, atol=1e-6), (got, expected)


def ddp_example(rank: int) -> None:
    ddp = DDP(make_mlp())
    target = fcall.from_module(ddp.module).detach().clone()  # full tensors, same on all ranks
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(STEPS):
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(100 * step + rank))
        td_step(ddp, target, opt, x)
    # DDP keeps the online weights equal on every rank, so the target is too
    flat = torch.cat([v.flatten() for v in target.values(True, True)])
    both = [torch.zeros_like(flat) for _ in range(WORLD)]
    dist.all_gather(both, flat)
    assert torch.equal(both[0], both[1])


def worker(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        fsdp_example(rank)
        ddp_example(rank)
        if rank == 0:
            print("target network OK (FSDP2 and DDP)", flush=True)
    finally:
        dist.destroy_process_group()
    # Done and torn down: leave without the interpreter's own teardown, during which
    # gloo's worker threads sometimes abort the process ("terminate called without an
    # active exception", SIGABRT; torch 2.13, about one run in five here).
    os._exit(0)


def main() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(worker, args=(port,), nprocs=WORLD)


if __name__ == "__main__":
    main()
