"""Issue 28: ``fcall.from_checkpoint``, parameter sets read from DCP checkpoints.

Without a process group (this process) and on 2 gloo ranks (one spawned job,
tests/_checkpoint_workers.py): FSDP2, DDP, tensor-parallel and plain modules, checkpoints
written at world size 1 read at 2 and the other way round, swapped in eager and compiled.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn

import fcall
from tests._checkpoint_workers import full_state, inputs, net, snapshot, twin_output

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def save(state: dict, path: Path) -> str:
    dcp.save(state, checkpoint_id=str(path), no_dist=True)
    return str(path)


# ---------------------------------------------------------------- one process, no group


def test_loads_a_plain_module_and_leaves_it_untouched(tmp_path):
    path = save(full_state(1), tmp_path / "ckpt")
    model = net()
    unchanged = snapshot(model)
    x = inputs()
    y_own = model(x).detach()
    params = fcall.from_checkpoint(path, model)
    assert list(params.keys(True, True)) == [tuple(k.split(".")) for k in model.state_dict()]
    assert all(not v.requires_grad for v in params.values(True, True))
    for name, value in full_state(1).items():
        assert torch.equal(params[tuple(name.split("."))], value), name
    with fcall.swap(params, model):
        assert torch.allclose(model(x), twin_output(1, x), atol=1e-6)
    with fcall.to_module(params, model):
        assert torch.allclose(model(x), twin_output(1, x), atol=1e-6)
    assert unchanged() and torch.equal(model(x), y_own)


def test_compiled_fullgraph_on_a_plain_module(tmp_path):
    path = save(full_state(1), tmp_path / "ckpt")
    model, x = net(), inputs()
    params = fcall.from_checkpoint(path, model)
    step = torch.compile(
        lambda p, inp: fcall.functional_call(model, p, (inp,)), backend="eager", fullgraph=True
    )
    try:
        assert torch.allclose(step(params, x), twin_output(1, x), atol=1e-6)
    finally:
        torch._dynamo.reset()


def test_keys_subset_dotted_tuple_and_submodule(tmp_path):
    path = save(full_state(1), tmp_path / "ckpt")
    model = net()
    part = fcall.from_checkpoint(path, model, keys=["0.weight", ("2", "bias"), "3"])
    assert sorted(part.keys(True, True)) == [
        ("0", "weight"),
        ("2", "bias"),
        ("3", "bias"),
        ("3", "num_batches_tracked"),
        ("3", "running_mean"),
        ("3", "running_var"),
        ("3", "weight"),
    ]
    assert torch.equal(part["2", "bias"], full_state(1)["2.bias"])


def test_keys_subset_ignores_the_checkpoints_other_tensors(tmp_path):
    state = {**full_state(1), "head.weight": torch.ones(2)}
    path = save(state, tmp_path / "ckpt")
    assert set(fcall.from_checkpoint(path, net(), keys=["4"]).keys()) == {"4"}


def test_prefix_and_nested_checkpoint(tmp_path):
    path = save({"model": full_state(1), "step": 3}, tmp_path / "ckpt")
    params = fcall.from_checkpoint(path, net(), prefix="model")
    assert torch.equal(params["4", "weight"], full_state(1)["4.weight"])
    with pytest.raises(KeyError) as info:
        fcall.from_checkpoint(path, net())
    assert "They are under 'model': pass prefix='model'." in str(info.value)


def test_tied_weights_stay_tied(tmp_path):
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(3, 3)
            self.b = nn.Linear(3, 3)
            self.b.weight = self.a.weight

    path = save({k: v + 1 for k, v in Tied().state_dict().items()}, tmp_path / "ckpt")
    model = Tied()
    params = fcall.from_checkpoint(path, model)
    assert params["a", "weight"] is params["b", "weight"]
    with fcall.swap(params, model):  # tie_weights=True accepts one tensor for both names
        assert model.b.weight is model.a.weight
        assert torch.equal(model.a.weight, params["a", "weight"])


def test_a_checkpoint_of_another_dtype_is_read_in_the_modules(tmp_path):
    model = nn.Linear(2, 2)
    path = save({k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}, tmp_path / "c")
    params = fcall.from_checkpoint(path, model)
    assert params["weight"].dtype == torch.float32
    assert torch.equal(params["weight"], model.weight.detach().to(torch.bfloat16).float())


def test_non_persistent_buffers_are_not_expected(tmp_path):
    model = nn.Linear(2, 2)
    model.register_buffer("cache", torch.ones(2), persistent=False)
    path = save(model.state_dict(), tmp_path / "ckpt")
    assert sorted(fcall.from_checkpoint(path, model).keys()) == ["bias", "weight"]


def test_a_compiled_module_reads_a_checkpoint_without_the_orig_mod_prefix(tmp_path):
    # a compiled module's keys start with "_orig_mod.": the plain module's checkpoint loads
    # (DDP's "module." prefix, with and without, is checked on 2 ranks)
    path = save(full_state(1), tmp_path / "ckpt")
    compiled = torch.compile(net(), backend="eager")
    params = fcall.from_checkpoint(path, compiled)
    assert torch.equal(params["_orig_mod", "4", "bias"], full_state(1)["4.bias"])


# ---------------------------------------------------------------- errors (pinned)


def test_missing_unexpected_and_shape_in_one_error(tmp_path):
    state = full_state(1)
    del state["2.weight"]
    state["0.bias"] = torch.zeros(7)
    state["head.weight"] = torch.zeros(2)
    path = save(state, tmp_path / "ckpt")
    model = net()
    unchanged = snapshot(model)
    with pytest.raises(fcall.CheckpointMismatch) as info:
        fcall.from_checkpoint(path, model)
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    assert str(info.value) == (
        f"fcall.from_checkpoint: the checkpoint at {path!r} does not fit Sequential:\n"
        "  - missing from the checkpoint: '2.weight'\n"
        "  - unexpected in the checkpoint: 'head.weight'\n"
        "  - shape mismatch: '0.bias': the module's is (6,), the checkpoint's (7,)\n"
        "The checkpoint's tensors: '0.bias', '0.weight', '2.bias', '3.bias', "
        "'3.num_batches_tracked', '3.running_mean', '3.running_var', '3.weight' and 3 more; "
        "the module's keys: '0.weight', '0.bias', '2.weight', '2.bias', '3.weight', '3.bias', "
        "'3.running_mean', '3.running_var' and 3 more.\n"
        "Checkpoint keys are the module's state_dict() keys. Pass keys=[...] to load only the "
        "keys both have with the same shape (a swap keeps the module's own values for the "
        "others). Nothing was loaded."
    )
    assert unchanged()
    # the fix the message gives: keys= naming what both have
    ok = [k for k in model.state_dict() if k not in ("2.weight", "0.bias")]
    assert len(list(fcall.from_checkpoint(path, model, keys=ok).keys(True, True))) == len(ok)


def test_keys_naming_nothing(tmp_path):
    path = save(full_state(1), tmp_path / "ckpt")
    with pytest.raises(KeyError, match=r"  - keys= names no tensor of the module: '9', '0.w'\n"):
        fcall.from_checkpoint(path, net(), keys=["9", "0.w", "0.weight"])


def test_not_a_module(tmp_path):
    with pytest.raises(TypeError, match=r"fcall\.from_checkpoint: expected the nn\.Module"):
        fcall.from_checkpoint(str(tmp_path), {"weight": torch.ones(1)})  # type: ignore[arg-type]


# ---------------------------------------------------------------- 2 gloo ranks

distributed = pytest.mark.distributed


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    import torch.distributed as dist

    if not dist.is_available():
        pytest.fail("torch built without distributed")
    from tests import _checkpoint_workers, _dist_workers

    tmp = tmp_path_factory.mktemp("dcp")
    os.environ["FCALL_CHECKPOINT_TMP"] = str(tmp)
    try:
        per_rank = _dist_workers.launch(_checkpoint_workers.checkpoint_job, timeout=180)
    finally:
        del os.environ["FCALL_CHECKPOINT_TMP"]
    for rank, result in enumerate(per_rank):
        assert result["ok"], f"rank {rank}:\n{result.get('error')}"
    return tmp, [result["checks"] for result in per_rank]


@distributed
@pytest.mark.parametrize("section", ["fsdp", "ddp", "tp", "plain"])
def test_every_check_on_every_rank(ranks, section):
    for rank, checks in enumerate(ranks[1]):
        found = checks[section]
        assert "crashed" not in found, f"rank {rank}:\n{found['crashed']}"
        flags = {k: v for k, v in found.items() if isinstance(v, bool)}
        assert flags and all(flags.values()), f"rank {rank} {section}: {flags}"
        runs = {k: v for k, v in found.items() if k.endswith("compile_run") or k == "compile_run"}
        assert runs and set(runs.values()) == {"ok"}, runs


@distributed
def test_fsdp_mismatch_is_one_error_on_every_rank(ranks):
    messages = [checks["fsdp"]["mismatch"] for checks in ranks[1]]
    assert messages[0] == messages[1]
    assert messages[0].startswith("CheckpointMismatch: fcall.from_checkpoint: the checkpoint at")
    assert (
        "- shape mismatch: '0.weight': the module's is (6, 4), the checkpoint's (7, 4)"
        in (messages[0])
    )


@distributed
def test_written_at_two_ranks_read_without_a_process_group(ranks):
    # 2 -> 1: FSDP2 wrote its shards (DTensors) at world size 2; this process has no group
    tmp = ranks[0]
    model, x = net(), inputs()
    params = fcall.from_checkpoint(str(tmp / "fsdp"), model)
    for name, value in full_state(2).items():
        assert torch.equal(params[tuple(name.split("."))], value), name
    with fcall.swap(params, model):
        assert torch.allclose(model(x), twin_output(2, x), atol=1e-6)
