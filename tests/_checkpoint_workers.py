"""Worker side of tests/test_checkpoint.py: ``fcall.from_checkpoint`` on 2 gloo ranks.

One job (``checkpoint_job``) runs every multi-process check, so each rank imports torch
once; ``_dist_workers.launch`` spawns it, bounds it in time and collects the results. The
checkpoints live in ``$FCALL_CHECKPOINT_TMP`` (the test's temporary directory): the parent
process reads the one written at world size 2 again without a process group (2 -> 1).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tests._dist_workers import WORLD, close, outcome


def net() -> nn.Module:
    """Uneven shards (5 rows at world size 2) and buffers (BatchNorm, eval mode)."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 5), nn.BatchNorm1d(5), nn.Linear(5, 3)
    ).eval()


def full_state(seed: int) -> dict[str, torch.Tensor]:
    """A full state dict for ``net()``, the same on every rank for one seed."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, value in net().state_dict().items():
        if value.dtype == torch.int64:
            out[name] = torch.tensor(seed, dtype=torch.int64)
        else:
            out[name] = torch.rand(value.shape, generator=gen) + 0.5  # running_var > 0
    return out


def twin_output(seed: int, x: torch.Tensor) -> torch.Tensor:
    """The unsharded twin: a plain ``net()`` loaded with the full state dict."""
    twin = net()
    twin.load_state_dict(full_state(seed))
    return twin(x).detach()


def inputs() -> torch.Tensor:
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(1))


def snapshot(model: nn.Module) -> Callable[[], bool]:
    """A check that ``model`` still has the same Parameter objects with the same values."""

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    before = dict(model.named_parameters())
    values = {n: local(p).detach().clone() for n, p in before.items()}
    buffers = {n: b.clone() for n, b in model.named_buffers()}

    def unchanged() -> bool:
        now = dict(model.named_parameters())
        return (
            list(now) == list(before)
            and all(now[n] is before[n] for n in now)
            and all(torch.equal(local(now[n]), values[n]) for n in now)
            and all(torch.equal(b, buffers[n]) for n, b in model.named_buffers())
        )

    return unchanged


def compiled(model: nn.Module, params: Any, x: torch.Tensor) -> torch.Tensor:
    """``fcall.functional_call`` under ``torch.compile`` (eager backend, as
    tests/test_distributed.py: FSDP2 and DDP break the graph in torch, TP traces whole)."""
    import fcall

    torch._dynamo.reset()

    def step(p: Any, inp: torch.Tensor) -> torch.Tensor:
        return fcall.functional_call(model, p, (inp,))

    with torch.no_grad():
        out = torch.compile(step, backend="eager")(params, x)
    torch._dynamo.reset()
    return out


def swap_checks(
    model: nn.Module, params: Any, y: torch.Tensor, x: torch.Tensor, compile: bool = True
) -> dict:
    """The set swapped in with swap, to_module (and compiled functional_call) gives ``y``."""
    import fcall

    checks: dict[str, Any] = {}
    with torch.no_grad():
        with fcall.swap(params, model):
            checks["swap"] = close(model(x), y)
        with fcall.to_module(params, model):
            checks["to_module"] = close(model(x), y)
    if compile:  # once per kind of module: FSDP2's compile alone takes seconds
        res: dict[str, torch.Tensor] = {}
        checks["compile_run"] = outcome(lambda: res.setdefault("y", compiled(model, params, x)))
        checks["compile"] = "y" in res and close(res["y"], y)
    return checks


def laid_out_like(params: Any, model: nn.Module) -> bool:
    """Every leaf is a new tensor with the module's type, shape, mesh, placements and local
    shard shape, and needs no grad."""
    from torch.distributed.tensor import DTensor

    for name, own in model.state_dict(keep_vars=True).items():
        leaf = params[tuple(name.split("."))]
        if leaf is own or leaf.requires_grad or leaf.shape != own.shape:
            return False
        if isinstance(own, DTensor) != isinstance(leaf, DTensor):
            return False
        if isinstance(own, DTensor) and (
            own.device_mesh != leaf.device_mesh
            or tuple(own.placements) != tuple(leaf.placements)
            or own.to_local().shape != leaf.to_local().shape
        ):
            return False
    return True


def fsdp_checks(rank: int, tmp: str) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import fcall

    x = inputs()
    model = net()
    mesh = init_device_mesh("cpu", (WORLD,))
    fully_shard(model[0], mesh=mesh)
    fully_shard(model[2], mesh=mesh)
    fully_shard(model, mesh=mesh)
    unchanged = snapshot(model)  # the sharded parameters, FSDP2's own
    y_own = model(x).detach()  # the root stays unsharded after forward: read resharded
    checks: dict[str, Any] = {}

    # 1 -> 2: a checkpoint written by one process, read sharded
    params = fcall.from_checkpoint(os.path.join(tmp, "single"), model)
    checks["laid_out_like_the_module"] = laid_out_like(params, model)
    local = sum(
        v.to_local().numel() if hasattr(v, "to_local") else v.numel()
        for v in params.values(True, True)
    )
    full = sum(v.numel() for v in full_state(1).values())
    checks["holds_shards_only"] = local < full
    checks.update(
        {f"single_{k}": v for k, v in swap_checks(model, params, twin_output(1, x), x).items()}
    )
    checks["unchanged_after_single"] = unchanged() and close(model(x), y_own)

    # a checkpoint written at world size 2 from FSDP2's sharded state dict (DTensors)
    writer = net()
    writer.load_state_dict(full_state(2))
    fully_shard(writer, mesh=mesh)
    dcp.save(writer.state_dict(), checkpoint_id=os.path.join(tmp, "fsdp"))
    params2 = fcall.from_checkpoint(os.path.join(tmp, "fsdp"), model)
    checks.update(
        {
            f"sharded_{k}": v
            for k, v in swap_checks(model, params2, twin_output(2, x), x, False).items()
        }
    )

    # keys=: a subset (layer 0 only); the swap keeps the module's own values elsewhere
    part = fcall.from_checkpoint(os.path.join(tmp, "fsdp"), model, keys=["0"])
    checks["subset_keys"] = sorted(part.keys(True, True)) == [("0", "bias"), ("0", "weight")]
    twin = net()
    twin.load_state_dict(
        {**twin.state_dict(), **{k: v for k, v in full_state(2).items() if k.startswith("0.")}}
    )
    with torch.no_grad(), fcall.swap(part, model):
        checks["subset_swap"] = close(model(x), twin(x))

    # a mismatch: the same error on every rank, before any collective (no hang)
    try:
        fcall.from_checkpoint(os.path.join(tmp, "other"), model)
        checks["mismatch"] = "no error"
    except Exception as exc:
        checks["mismatch"] = f"{type(exc).__name__}: {exc}"
    checks["unchanged"] = unchanged() and close(model(x), y_own)
    return checks


def ddp_checks(rank: int, tmp: str) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp
    from torch.nn.parallel import DistributedDataParallel as DDP

    import fcall

    x = inputs()
    ddp = DDP(net())
    y_own = ddp(x).detach()
    unchanged = snapshot(ddp)
    checks: dict[str, Any] = {}
    # keys without "module." (written from the plain module) and with it (ddp.state_dict())
    params = fcall.from_checkpoint(os.path.join(tmp, "single"), ddp)
    checks["keys_under_module"] = all(k[0] == "module" for k in params.keys(True, True))
    checks.update(
        {f"plain_{k}": v for k, v in swap_checks(ddp, params, twin_output(1, x), x).items()}
    )
    writer = DDP(net())
    writer.module.load_state_dict(full_state(3))
    dcp.save(writer.state_dict(), checkpoint_id=os.path.join(tmp, "ddp"))
    prefixed = fcall.from_checkpoint(os.path.join(tmp, "ddp"), ddp)
    checks.update(
        {
            f"prefixed_{k}": v
            for k, v in swap_checks(ddp, prefixed, twin_output(3, x), x, False).items()
        }
    )
    checks["unchanged"] = unchanged() and close(ddp(x), y_own)
    return checks


def tp_checks(rank: int, tmp: str) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    import fcall

    x = inputs()
    model = net()
    mesh = init_device_mesh("cpu", (WORLD,))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    y_own = model(x).detach()
    unchanged = snapshot(model)
    checks: dict[str, Any] = {}
    params = fcall.from_checkpoint(os.path.join(tmp, "single"), model)
    checks["laid_out_like_the_module"] = laid_out_like(params, model)
    checks.update(swap_checks(model, params, twin_output(1, x), x))
    checks["unchanged"] = unchanged() and close(model(x), y_own)
    return checks


def plain_checks(rank: int, tmp: str) -> dict[str, Any]:
    """A module with no wrapper under a process group: full tensors on every rank."""
    import fcall

    x = inputs()
    model = net()
    unchanged = snapshot(model)
    params = fcall.from_checkpoint(os.path.join(tmp, "fsdp"), model)  # 2 -> full on each rank
    checks = swap_checks(model, params, twin_output(2, x), x)
    checks["laid_out_like_the_module"] = laid_out_like(params, model)
    checks["unchanged"] = unchanged()
    return checks


def checkpoint_job(rank: int) -> dict[str, Any]:
    import traceback

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    tmp = os.environ["FCALL_CHECKPOINT_TMP"]
    if rank == 0:  # written by one process alone: the 1 -> 2 case
        dcp.save(full_state(1), checkpoint_id=os.path.join(tmp, "single"), no_dist=True)
        other = nn.Sequential(nn.Linear(4, 7), nn.ReLU(), nn.Linear(7, 5))
        dcp.save(other.state_dict(), checkpoint_id=os.path.join(tmp, "other"), no_dist=True)
    dist.barrier()
    out: dict[str, Any] = {}
    for name, job in (
        ("fsdp", fsdp_checks),
        ("ddp", ddp_checks),
        ("tp", tp_checks),
        ("plain", plain_checks),
    ):
        try:
            out[name] = job(rank, tmp)
        except Exception:
            out[name] = {"crashed": traceback.format_exc()}
        dist.barrier()
    return out
