"""Eager behaviour of fcall's TensorDictParams (issue 3, points 1-8)."""

from __future__ import annotations

import copy

import pytest
import torch
from support import swap_lane  # noqa: F401  (a fixture, used by pytestmark)
from tensordict import TensorDict, TensorDictBase
from torch import nn

from fcall import TensorDictParams

# every test also runs with the express lane on (support.swap_lane)
pytestmark = pytest.mark.usefixtures("swap_lane")


def _names(m, kind="parameters"):
    return [n for n, _ in getattr(m, f"named_{kind}")()]


# 1. constructor forms
def test_constructor_forms():
    td = TensorDict(a=torch.zeros(2))
    assert _names(TensorDictParams(td)) == ["a"]
    assert _names(TensorDictParams({"a": torch.zeros(2), "n": {"b": torch.zeros(2)}})) == [
        "a",
        "n.b",
    ]
    assert _names(TensorDictParams(a=torch.zeros(2))) == ["a"]
    assert len(TensorDictParams().keys()) == 0


def test_parameters_and_kwargs_together_is_an_error():
    with pytest.raises(TypeError, match=r"either as `parameters` or as keyword.*\['b'\]"):
        TensorDictParams({"a": torch.zeros(1)}, b=torch.zeros(1))


def test_bad_parameters_type():
    with pytest.raises(TypeError, match="must be a TensorDict, a dict or None, got list"):
        TensorDictParams([torch.zeros(1)])


# 2. registration rule
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_float_dtypes_become_parameters(dtype):
    p = TensorDictParams(a=torch.zeros(2, dtype=dtype))
    assert isinstance(p["a"], nn.Parameter)


@pytest.mark.parametrize(
    "dtype", [torch.bfloat16, torch.complex64, torch.bool, torch.int64, torch.uint8]
)
def test_other_dtypes_become_buffers(dtype):
    p = TensorDictParams(a=torch.zeros(2, dtype=dtype))
    assert _names(p, "buffers") == ["a"] and _names(p) == []
    p["b"] = torch.zeros(2, dtype=dtype)
    assert _names(p, "buffers") == ["a", "b"]


def test_existing_parameters_and_buffers_stay():
    w = nn.Parameter(torch.zeros(2), requires_grad=False)
    b = nn.Buffer(torch.zeros(2))
    p = TensorDictParams(w=w, b=b)
    assert p["w"] is w and _names(p) == ["w"] and _names(p, "buffers") == ["b"]


def test_no_convert_makes_buffers():
    p = TensorDictParams(a=torch.zeros(2), no_convert=True)
    p["b"] = torch.zeros(2)
    assert _names(p) == [] and _names(p, "buffers") == ["a", "b"]


def test_set_registers_nested_and_replaces():
    p = TensorDictParams(a=torch.zeros(2))
    p["n", "x"] = torch.zeros(2)
    p.set(("n", "y"), torch.zeros(2, dtype=torch.long))
    p["n"]["z"] = torch.zeros(2)  # chained write registers too
    assert _names(p) == ["a", "n.x", "n.z"] and _names(p, "buffers") == ["n.y"]
    p["a"] = torch.zeros(2, dtype=torch.long)
    assert "a" not in _names(p) and "a" in _names(p, "buffers")
    del p["n", "x"]
    assert "n.x" not in _names(p)
    assert isinstance(p.pop("a"), torch.Tensor) and "a" not in _names(p, "buffers")


def test_cannot_set_self():
    p = TensorDictParams(a=torch.zeros(2))
    with pytest.raises(ValueError, match="cannot set \\('x',\\) to the TensorDictParams itself"):
        p["x"] = p


def test_missing_key_message():
    p = TensorDictParams(a=torch.zeros(2))
    with pytest.raises(KeyError, match=r"no entry 'zz'; the keys are \['a'\]"):
        p["zz"]


# 3. naming
def test_names_in_a_parent_module():
    net = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    parent = nn.Module()
    parent.params = TensorDictParams(TensorDict.from_module(net))
    expected = ["params.0.weight", "params.0.bias", "params.1.weight", "params.1.bias"]
    assert _names(parent) == expected
    assert list(parent.state_dict()) == expected


# 4. module behaviour
def test_state_dict_round_trip_and_to():
    p = TensorDictParams(a=torch.randn(2), n={"b": torch.randn(3)}, i=torch.arange(2))
    q = TensorDictParams(a=torch.zeros(2), n={"b": torch.zeros(3)}, i=torch.zeros(2).long())
    q.load_state_dict(p.state_dict())
    assert (q["a"] == p["a"]).all() and (q["n", "b"] == p["n", "b"]).all()
    parent = nn.Module()
    parent.p = q
    parent.to(torch.float64)
    assert q["a"].dtype == torch.float64 and isinstance(q["a"], nn.Parameter)
    assert q["i"].dtype == torch.long
    r = p.to(torch.float64)
    assert isinstance(r, TensorDictParams) and r["n", "b"].dtype == torch.float64
    assert p.to("cpu")["a"].device.type == "cpu"


def test_deepcopy_keeps_the_type_the_registration_and_the_lock():
    p = TensorDictParams(a=torch.randn(2), n={"b": torch.randn(3)}, lock=True)
    c = copy.deepcopy(p)
    assert type(c) is TensorDictParams and c.is_locked
    assert _names(c) == _names(p) and c["a"] is not p["a"]
    assert dict(c.named_parameters())["a"] is c["a"]


def test_optimizer_trains_the_entries():
    torch.manual_seed(0)
    p = TensorDictParams(w=torch.randn(3))
    before = p._param_td["w"].detach().clone()
    opt = torch.optim.SGD(p.parameters(), lr=0.1)
    x, y = torch.randn(8, 3), torch.randn(8)
    losses = []
    for _ in range(5):
        loss = ((x @ p["w"] - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert not torch.equal(p._param_td["w"], before)


# 5. the spec's warning
def test_wraps_without_copy_and_later_direct_adds_are_not_registered():
    td = TensorDict(a=torch.zeros(2))
    p = TensorDictParams(td)
    assert p._param_td is td and isinstance(td["a"], nn.Parameter)
    td["late"] = torch.zeros(2)
    assert "late" in p.keys() and "late" not in _names(p)
    p["through"] = torch.zeros(2)
    assert "through" in _names(p)


# 6. lock
def test_lock():
    td = TensorDict(a=torch.zeros(2), n={"b": torch.zeros(2)})
    p = TensorDictParams(td, lock=True)
    assert p.is_locked and td.is_locked
    with pytest.raises(RuntimeError, match="locked"):
        td["x"] = torch.zeros(2)
    with pytest.raises(RuntimeError, match="locked"):
        del td["a"]
    p["x"] = torch.zeros(2)
    p["n", "y"] = torch.zeros(2)
    p["m", "z"] = torch.zeros(2)
    assert {"x", "n.y", "m.z"} <= set(_names(p))
    assert td.is_locked and td["m"].is_locked and "x" in td.keys()
    with pytest.raises(RuntimeError, match="locked"):
        td["m"]["w"] = torch.zeros(2)
    p.unlock_()
    assert not p.is_locked and not td.is_locked


# 7. hooks
def test_get_post_hook_on_every_read():
    p = TensorDictParams(a=torch.ones(2), n={"b": torch.ones(2)})
    seen = []

    def hook(tdp, value):
        seen.append(tdp)
        return value * 10

    p.register_get_post_hook(hook)
    for read in (p["a"], p["n", "b"], p.get("a"), p.get(("n", "b")), p["n"]["b"]):
        assert (read == 10).all()
    assert all((v == 10).all() for v in p.values(True, True))
    assert all((v == 10).all() for _, v in p.items(True, True))
    assert all(t is p for t in seen)
    p.register_get_post_hook(lambda tdp, v: None)  # None keeps the value
    assert (p["a"] == 10).all()
    with pytest.raises(TypeError, match="expected a callable, got int"):
        p.register_get_post_hook(3)


# 8. types and fcall integration
def test_is_a_tensordict_and_a_module():
    p = TensorDictParams(a=torch.zeros(2))
    assert isinstance(p, TensorDictBase) and isinstance(p, nn.Module)
    assert isinstance(p._param_td, TensorDict)


def test_doctest_example_against_fcall_export():
    import doctest

    import fcall._params as mod

    failures, _ = doctest.testmod(mod, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert failures == 0


def test_swap_and_functional_call_with_fcall():
    import fcall

    net = nn.Linear(3, 2)
    p = TensorDictParams(TensorDict.from_module(net).detach().clone().zero_())
    x = torch.randn(3)
    with fcall.swap(p, net):
        assert (net(x) == 0).all()
    assert not (net(x) == 0).all()
    assert (fcall.functional_call(net, p, (x,)) == 0).all()
