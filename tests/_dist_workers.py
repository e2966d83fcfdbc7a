"""Worker side of the multi-process tests: 2 gloo ranks on 127.0.0.1.

``launch(job)`` spawns two processes running ``job(rank)``, each writing what it
found (a dict, or the traceback) to a JSON file; the parent reads them back. A
hung job is killed after ``timeout`` seconds. Checks that need both ranks run
inside the job; the parent only asserts on the returned results.
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch._dynamo
import torch.multiprocessing as mp
from torch import nn

WORLD = 2


RENDEZVOUS_TIMEOUT = datetime.timedelta(seconds=120)


def _rendezvous(rank: int, out_dir: str) -> Any:
    """A TCPStore on 127.0.0.1: rank 0 binds port 0 (the system picks a free one, so
    no other process can take it between choosing and binding) and writes the port
    for the other ranks to read."""
    import torch.distributed as dist

    path = os.path.join(out_dir, "port")
    if rank == 0:
        store = dist.TCPStore(
            "127.0.0.1", 0, WORLD, True, timeout=RENDEZVOUS_TIMEOUT, wait_for_workers=False
        )
        with open(path + ".tmp", "w") as f:
            f.write(str(store.port))
        os.replace(path + ".tmp", path)  # readers never see a partly written port
        return store
    deadline = time.monotonic() + RENDEZVOUS_TIMEOUT.total_seconds()
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError("rank 0 never opened the rendezvous store")
        time.sleep(0.02)
    with open(path) as f:
        port = int(f.read())
    return dist.TCPStore("127.0.0.1", port, WORLD, False, timeout=RENDEZVOUS_TIMEOUT)


def _entry(rank: int, job: Callable, out_dir: str) -> None:
    import torch.distributed as dist

    result: dict[str, Any]
    try:
        store = _rendezvous(rank, out_dir)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD)
        try:
            result = {"ok": True, "checks": job(rank)}
        finally:
            dist.destroy_process_group()
    except BaseException:
        result = {"ok": False, "error": traceback.format_exc()}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def launch(job: Callable, timeout: float = 150.0) -> list[dict]:
    """Run ``job`` on 2 ranks; return each rank's result dict. Kills hung ranks."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as out_dir:
        procs = [ctx.Process(target=_entry, args=(r, job, out_dir)) for r in range(WORLD)]
        for proc in procs:
            proc.start()
        try:
            for proc in procs:
                proc.join(timeout)
        finally:
            hung = [proc for proc in procs if proc.is_alive()]
            for proc in hung:
                proc.kill()
                proc.join(5)
        if hung:
            raise TimeoutError(f"distributed job {job.__name__} hung for {timeout} s")
        results = []
        for rank in range(WORLD):
            path = os.path.join(out_dir, f"rank{rank}.json")
            if not os.path.exists(path):
                raise RuntimeError(f"rank {rank} died (exit code {procs[rank].exitcode})")
            with open(path) as f:
                results.append(json.load(f))
    return results


# ---------------------------------------------------------------- helpers


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


def full_params(module: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """The same random param set on every rank (full tensors)."""
    gen = torch.Generator().manual_seed(seed)
    return {name: torch.randn(p.shape, generator=gen) for name, p in module.named_parameters()}


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.allclose(a, b, atol=1e-6))


def compiled_graphs(step: Callable, *args: Any) -> dict[str, Any]:
    """Graphs and graph breaks of ``step(*args)`` compiled, and whether fullgraph=True traces."""
    from torch._dynamo.testing import CompileCounter
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    counter = CompileCounter()
    result: dict[str, Any] = {"run": outcome(lambda: torch.compile(step, backend=counter)(*args))}
    result["graphs"] = counter.frame_count
    result["breaks"] = sum(counters["graph_break"].values())
    torch._dynamo.reset()
    whole = torch.compile(step, backend="eager", fullgraph=True)
    result["fullgraph"] = outcome(lambda: whole(*args))
    torch._dynamo.reset()
    return result


def outcome(fn: Callable) -> str:
    """``"ok"`` or ``"TypeName: message"`` (first 300 characters)."""
    try:
        fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:300]
    return "ok"


# ---------------------------------------------------------------- FSDP2


def fsdp_job(rank: int) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, distribute_tensor

    import fcall

    checks: dict[str, Any] = {}
    ref = mlp()
    model = mlp()
    mesh = init_device_mesh("cpu", (WORLD,))
    fully_shard(model[0], mesh=mesh)  # nested
    fully_shard(model[2], mesh=mesh)
    fully_shard(model, mesh=mesh)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    y_ref = ref(x).detach()
    params_before = dict(model.named_parameters())
    shards_before = {n: p.to_local().clone() for n, p in params_before.items()}

    def unchanged() -> bool:
        now = dict(model.named_parameters())
        return (
            list(now) == list(params_before)
            and all(now[n] is params_before[n] for n in now)
            and all(torch.equal(now[n].to_local(), shards_before[n]) for n in now)
        )

    zeros = fcall.from_module(model).detach().clone().zero_()
    full = full_params(ref, seed=2)
    y_full = torch.func.functional_call(ref, full, (x,)).detach()
    as_dtensor = {
        n: distribute_tensor(v, p.device_mesh, p.placements, src_data_rank=None)
        for (n, v), p in zip(full.items(), model.parameters())
    }

    # before the first forward, then after one (the root stays unsharded after forward)
    with fcall.swap(zeros, model):
        checks["swap_zeros_first"] = bool((model(x) == 0).all())
    checks["unchanged_1"] = unchanged()
    checks["forward_matches_ref"] = close(model(x), y_ref)
    with fcall.swap(zeros, model):
        checks["swap_zeros_after_forward"] = bool((model(x) == 0).all())
    checks["unchanged_2"] = unchanged() and close(model(x), y_ref)
    with fcall.swap(full, model):
        checks["swap_full_tensors"] = close(model(x), y_full)
    with fcall.swap(as_dtensor, model):
        checks["swap_dtensors"] = close(model(x), y_full)
    checks["functional_call"] = close(fcall.functional_call(model, full, (x,)), y_full)
    checks["functional_call_prefixless_nested"] = close(
        fcall.functional_call(model, fcall.from_module(model).detach().clone(), (x,)), y_ref
    )
    with fcall.to_module(full, model):
        checks["to_module"] = close(model(x), y_full)
    with fcall.to_module(as_dtensor, model, inplace=True):
        checks["to_module_inplace"] = close(model(x), y_full)
    old = fcall.to_module(zeros, model)
    checks["to_module_zeros"] = bool((model(x) == 0).all())
    fcall.to_module(old, model)
    checks["unchanged_3"] = unchanged() and close(model(x), y_ref)
    # an exception inside the block restores too
    try:
        with fcall.swap(zeros, model):
            model(x)
            raise KeyError("boom")
    except KeyError:
        pass
    checks["unchanged_after_exception"] = unchanged()

    # refusals: clear errors, module untouched
    grad_set = {n: v.clone().requires_grad_() for n, v in full.items()}
    checks["refuse_requires_grad"] = outcome(lambda: fcall.functional_call(model, grad_set, (x,)))
    local = {n: p.to_local().detach().clone() for n, p in model.named_parameters()}
    checks["refuse_local_shards"] = outcome(lambda: fcall.swap(local, model).__enter__())
    checks["unchanged_after_refusals"] = unchanged()

    # training is unaffected: same grads as the unsharded reference
    model(x).sum().backward()
    ref(x).sum().backward()
    checks["grads_after_swaps"] = all(
        close(p.grad.full_tensor(), q.grad) for p, q in zip(model.parameters(), ref.parameters())
    )
    # torch's own functional_call is silently wrong here (the report)
    model.reshard()
    tf = torch.func.functional_call(model, dict(zeros.flatten_keys(".").items()), (x,))
    checks["torch_functional_call_ignored_swap"] = outcome(lambda: tf)  # computed: ran
    checks["torch_functional_call_is_zero"] = bool((tf == 0).all())
    checks["is_dtensor"] = isinstance(model[0].weight, DTensor)

    # compile
    torch._dynamo.reset()

    def step(params, inp):
        return fcall.functional_call(model, params, (inp,))

    compiled = torch.compile(step, backend="eager")
    res: dict[str, Any] = {}
    checks["compile_fsdp"] = outcome(lambda: res.setdefault("y", compiled(full, x)))
    if "y" in res:
        checks["compile_fsdp_correct"] = close(res["y"], y_full)
    checks["unchanged_after_compile"] = unchanged()
    checks["compile_fsdp_graphs"] = compiled_graphs(step, full, x)
    checks["unchanged_after_graph_count"] = unchanged()
    dist.barrier()
    return checks


# ---------------------------------------------------------------- DDP


def ddp_job(rank: int) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import fcall

    checks: dict[str, Any] = {}
    ref = mlp()
    ddp = DDP(mlp())
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(10 + rank))  # per-rank data
    full = full_params(ref, seed=3)
    y_full = torch.func.functional_call(ref, full, (x,)).detach()
    before = dict(ddp.named_parameters())

    with fcall.swap(full, ddp):
        checks["swap_no_prefix"] = close(ddp(x), y_full)
    prefixed = {f"module.{n}": v for n, v in full.items()}
    with fcall.swap(prefixed, ddp):
        checks["swap_prefix"] = close(ddp(x), y_full)
    checks["functional_call"] = close(fcall.functional_call(ddp, prefixed, (x,)), y_full)
    with fcall.to_module(full, ddp):
        checks["to_module"] = close(ddp(x), y_full)
    with fcall.to_module(full, ddp, inplace=True):
        checks["to_module_inplace"] = close(ddp(x), y_full)
    checks["unchanged"] = all(p is before[n] for n, p in ddp.named_parameters()) and close(
        ddp(x), ref(x)
    )

    # leaves that require grad through the DDP wrapper: refused (not all-reduced)
    leaves = {n: v.clone().requires_grad_() for n, v in full.items()}
    checks["refuse_grad_through_ddp"] = outcome(lambda: fcall.functional_call(ddp, leaves, (x,)))
    checks["refuse_grad_swap"] = outcome(lambda: fcall.swap(leaves, ddp).__enter__())

    # the documented pattern: swap into ddp.module, all-reduce the gradients yourself
    fcall.functional_call(ddp.module, leaves, (x,)).sum().backward()
    for v in leaves.values():
        dist.all_reduce(v.grad)
        v.grad /= WORLD
    gathered = [torch.zeros(2, 4) for _ in range(WORLD)]
    # the reference: mean over the ranks' data of the per-rank gradient
    xs = [torch.zeros(3, 4) for _ in range(WORLD)]
    dist.all_gather(xs, x)
    refl = {n: v.clone().requires_grad_() for n, v in full.items()}
    for xi in xs:
        torch.func.functional_call(ref, refl, (xi,)).sum().backward()
    checks["manual_allreduce_grads"] = all(
        close(leaves[n].grad, refl[n].grad / WORLD) for n in leaves
    )
    del gathered

    # DDP's own training is unaffected by the swaps: grads equal on both ranks
    ddp(x).sum().backward()
    g = torch.cat([p.grad.flatten() for p in ddp.parameters()])
    other = [torch.zeros_like(g) for _ in range(WORLD)]
    dist.all_gather(other, g)
    checks["ddp_grads_synced"] = close(other[0], other[1])

    torch._dynamo.reset()

    def step(params, inp):
        return fcall.functional_call(ddp, params, (inp,))

    compiled = torch.compile(step, backend="eager")
    res: dict[str, Any] = {}
    with torch.no_grad():
        checks["compile_ddp"] = outcome(lambda: res.setdefault("y", compiled(full, x)))
    if "y" in res:
        checks["compile_ddp_correct"] = close(res["y"], y_full)
    with torch.no_grad():
        checks["compile_ddp_graphs"] = compiled_graphs(step, full, x)
    return checks


# ---------------------------------------------------------------- tensor parallel


def tp_job(rank: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    import fcall

    checks: dict[str, Any] = {}
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
    mesh = init_device_mesh("cpu", (WORLD,))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    y_ref = ref(x).detach()
    before = dict(model.named_parameters())
    full = full_params(ref, seed=4)
    y_full = torch.func.functional_call(ref, full, (x,)).detach()
    dparams = {
        n: distribute_tensor(v, p.device_mesh, p.placements, src_data_rank=None)
        for (n, v), p in zip(full.items(), model.parameters())
    }
    zeros = fcall.from_module(model).detach().clone().zero_()
    with fcall.swap(zeros, model):
        checks["swap_zeros"] = bool((model(x) == 0).all())
    with fcall.swap(dparams, model):
        checks["swap_dtensors"] = close(model(x), y_full)
    checks["functional_call"] = close(fcall.functional_call(model, dparams, (x,)), y_full)
    with fcall.to_module(dparams, model, inplace=True):
        checks["to_module_inplace"] = close(model(x), y_full)
    checks["unchanged"] = all(p is before[n] for n, p in model.named_parameters()) and close(
        model(x), y_ref
    )

    torch._dynamo.reset()

    def step(params, inp):
        return fcall.functional_call(model, params, (inp,))

    compiled = torch.compile(step, backend="eager")
    res: dict[str, Any] = {}
    checks["compile_tp"] = outcome(lambda: res.setdefault("y", compiled(dparams, x)))
    if "y" in res:
        checks["compile_tp_correct"] = close(res["y"], y_full)
    checks["compile_tp_graphs"] = compiled_graphs(step, dparams, x)
    checks["unchanged_after_compile"] = all(
        p is before[n] for n, p in model.named_parameters()
    ) and close(model(x), y_ref)
    return checks


def all_jobs(rank: int) -> dict[str, Any]:
    """One spawn for everything: each process pays torch's import once."""
    out: dict[str, Any] = {}
    for name, job in (("fsdp", fsdp_job), ("ddp", ddp_job), ("tp", tp_job)):
        try:
            out[name] = job(rank)
        except Exception:
            out[name] = {"crashed": traceback.format_exc()}
    return out
