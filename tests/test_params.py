"""Eager behaviour of fcall's TensorDictParams (issue 3, points 1-8)."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn
from torch.nn.parameter import Buffer

from fcall import TensorDictParams


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


def test_deepcopy_keeps_the_type_and_the_registration_not_the_lock():
    p = TensorDictParams(a=torch.randn(2), n={"b": torch.randn(3)}, lock=True)
    c = copy.deepcopy(p)
    # tensordict: copies are not locked (see test_locking_matches_tensordict)
    assert type(c) is TensorDictParams and not c.is_locked and not c._param_td.is_locked
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
    assert not p.is_locked and td.is_locked  # tensordict: lock=True locks the content only
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
    p.unlock_()  # tensordict: unlock_() keeps the lock=True content lock
    assert not p.is_locked and td.is_locked


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

    import fcall._params.params as mod

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


# ---------------------------------------------------------------- issue 16: tensordict's behaviour
# Each test builds the same case with tensordict's own class and compares.
from tensordict import LazyStackedTensorDict, NonTensorData  # noqa: E402
from tensordict.nn import TensorDictParams as TDParams  # noqa: E402

BOTH = pytest.mark.parametrize("cls", [TDParams, TensorDictParams], ids=["tensordict", "fcall"])


def _registration(p) -> tuple[list, list]:
    return _names(p), _names(p, "buffers")


def _same(build):
    """``build(cls)`` for both classes; the results must be equal."""
    ours, theirs = build(TensorDictParams), build(TDParams)
    assert ours == theirs
    return ours


def test_view_is_tensordicts_view_not_a_nested_read():
    # fcall's nested-view helper used to be called _view, shadowing tensordict's _view(shape).
    def build(cls):
        v = cls(TensorDict(a=torch.zeros(4, 3), batch_size=[4])).view(2, 2)
        return type(v).__name__, v.batch_size, v["a"].shape

    assert _same(build) == ("TensorDict", torch.Size([2, 2]), torch.Size([2, 2, 3]))


def test_split_keys_strict_and_pop_without_default_raise_key_error():
    def build(cls):
        p = cls(TensorDict(a=torch.zeros(3), b=torch.ones(3)))
        with pytest.raises(KeyError, match="missing"):
            p.split_keys(["a", "missing"], strict=True)
        with pytest.raises(KeyError, match="missing"):
            p.pop("missing")
        default = object()
        assert p.pop("missing", default) is default
        q = cls(TensorDict(a=torch.zeros(3), b=torch.ones(3)))
        out, rest = q.split_keys(["a", "missing"], strict=False)
        return sorted(out.keys()), sorted(rest.keys()), "missing" in p.keys()

    assert _same(build) == (["a"], ["b"], False)


def test_non_tensor_values_are_kept_unregistered():
    import numpy as np

    def build(cls):
        p = cls(TensorDict(a=torch.zeros(3), x=NonTensorData("hi"), n={"s": NonTensorData(1)}))
        p["s"] = "text"
        p["arr"] = np.zeros(3)  # becomes a tensor: tensordict registers it as a buffer
        p["f"] = 1.5
        reads = (p["x"], p["s"], p["n", "s"], p["arr"].dtype, float(p["f"]))
        kinds = [type(p._param_td.get(k)).__name__ for k in ("x", "s", "arr", "f")]
        q = cls({"a": torch.zeros(3), "arr": np.zeros(3), "s": "txt"})  # a dict: converted first
        return reads, kinds, _registration(p), _registration(q), q["s"]

    reads, kinds, regs, dict_regs, s = _same(build)
    assert reads == ("hi", "text", 1, torch.float64, 1.5)
    assert kinds == ["NonTensorData", "NonTensorData", "Tensor", "Tensor"]
    assert regs == (["a"], ["arr", "f"]) and dict_regs == (["a", "arr"], []) and s == "txt"


def test_non_tensor_value_read_runs_the_hooks_as_tensordict_does():
    def build(cls):
        p = cls(TensorDict(a=torch.zeros(3), x=NonTensorData("hi")))
        seen = []
        p.register_get_post_hook(lambda tdp, v: seen.append(type(v).__name__))
        p["x"], p.get("x")
        return seen

    assert _same(build) == ["str"]


def test_no_convert_keeps_the_gradient_of_a_non_leaf():
    def build(cls):
        w = nn.Parameter(torch.ones(3))
        p = cls(TensorDict(w=w.expand(2, 3), i=torch.ones(3)), no_convert=True)
        p["v"] = w * 3
        (p["w"].sum() + p["v"].sum()).backward()
        return w.grad.tolist(), _registration(p), p["i"].requires_grad

    grad, regs, i_grad = _same(build)
    assert grad == [5.0, 5.0, 5.0] and regs == ([], ["w", "i", "v"]) and not i_grad


@pytest.mark.parametrize("nested", [False, True], ids=["root", "nested"])
def test_lazy_stack_raises_tensordicts_runtime_error(nested):
    def build(cls):
        lazy = LazyStackedTensorDict(TensorDict(a=torch.zeros(3)), TensorDict(a=torch.ones(3)))
        with pytest.raises(RuntimeError) as info:
            cls(TensorDict(n=lazy) if nested else lazy)
        return str(info.value)

    assert "LazyStackedTensorDict within a TensorDictParams" in _same(build)


# tensordict's lock_() warns when is_compiling() (export too); fcall's lock does not warn
@pytest.mark.filterwarnings("ignore:Using lock_.. inside a compiled graph")
def test_export_non_strict_builds_it_as_tensordict_does():
    # torch.compiler.is_compiling() is True under export(strict=False), where nothing is
    # traced: the constructor used to defer to itself until RecursionError.
    def build(cls):
        class M(nn.Module):
            def forward(self, x):
                p = cls(TensorDict(a=x, i=x.long()), lock=True)
                return p["a"] * 2 + p["i"]

        x = torch.arange(3.0)
        ep = torch.export.export(M(), (x,), strict=False)
        return ep.module()(x).tolist()

    assert _same(build) == [0.0, 3.0, 6.0]


def test_no_convert_skip_converts_nothing_and_registers_by_type():
    def build(cls):
        td = TensorDict(a=torch.zeros(3), i=torch.arange(3), w=nn.Parameter(torch.ones(2)))
        p = cls(td, no_convert="skip")
        stored = [isinstance(v, nn.Parameter) for v in td.values()]
        p["later"] = torch.zeros(2)  # later writes: tensordict reads "skip" as truthy
        return p.no_convert, stored, _registration(p), isinstance(p["later"], nn.Parameter)

    assert _same(build) == ("skip", [False, False, True], (["w"], ["a", "i", "later"]), False)


def test_a_tensordictparams_given_keeps_its_registration():
    def build(cls):
        src = cls(TensorDict(a=torch.zeros(3), b=torch.zeros(3)), no_convert="skip")
        p = cls(src)
        p["c"] = torch.zeros(3)  # the copy is locked, writes through the object still work
        with pytest.raises(RuntimeError, match="locked"):
            p._param_td["d"] = torch.zeros(3)
        return _registration(p), p.no_convert, p.is_locked, sorted(src.keys())

    assert _same(build) == (([], ["a", "b", "c"]), "skip", False, ["a", "b"])


def test_locking_matches_tensordict():
    import gc
    import weakref

    def build(cls):
        out = []
        td = TensorDict(a=torch.zeros(2), n={"b": torch.zeros(2)})
        p = cls(td, lock=True)
        # 1. is_locked is the object's own flag: lock=True locks the content only
        out.append((p.is_locked, td.is_locked))
        p["x"] = torch.zeros(2)  # writes through the object work
        out.append("x" in p.keys())
        # 2. clones are not locked
        out.append([(c.is_locked, c._param_td.is_locked) for c in (p.clone(), copy.deepcopy(p))])
        # 3. lock_() locks the object: writes through it raise, in place too
        q = cls(TensorDict(a=torch.zeros(2), n={"b": torch.zeros(2)}))
        q.lock_()
        out.append((q.is_locked, q._param_td.is_locked))
        for write in (
            lambda: q.__setitem__("y", torch.zeros(2)),
            lambda: q.set("a", torch.ones(2), inplace=True),
            lambda: q.__delitem__("a"),
            lambda: q.pop("a"),
            lambda: q["n"].__setitem__("y", torch.zeros(2)),
        ):
            with pytest.raises(RuntimeError, match="Cannot modify locked TensorDict"):
                write()
        out.append(sorted(map(str, q.keys(True, True))))
        q.set_("a", torch.ones(2))  # in-place writes into existing leaves work
        out.append(q["a"].tolist())
        q.unlock_()
        out.append((q.is_locked, q._param_td.is_locked))
        p.lock_()
        p.unlock_()  # the lock=True content lock stays
        out.append((p.is_locked, p._param_td.is_locked))
        # 4. a nested read does not keep its locked root alive
        r = cls(TensorDict(a=torch.zeros(2), n={"b": torch.zeros(2)}), lock=True)
        sub, ref = r["n"], weakref.ref(r)
        del r
        gc.collect()
        out.append((ref() is None, sub.is_locked))
        sub.unlock_()  # the locked root is gone: the nested one may be unlocked
        out.append(sub.is_locked)
        return out

    out = _same(build)
    assert out[0] == (False, True) and out[2] == [(False, False), (False, False)]
    assert out[3] == (True, True) and out[-2] == (True, True) and out[-1] is False


# ---------------------------------------------------------------- from_module(as_module=True)
def _bn_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))


def test_from_module_as_module_registers_as_tensordicts_does():
    import fcall

    net = _bn_net()
    ours, theirs = (
        fcall.from_module(net, as_module=True),
        TensorDict.from_module(net, as_module=True),
    )
    assert type(ours) is TensorDictParams
    assert _registration(ours) == _registration(theirs)
    assert _names(ours, "buffers") == ["1.running_mean", "1.running_var", "1.num_batches_tracked"]
    assert ours.no_convert == theirs.no_convert is True
    assert ours["0", "weight"] is theirs["0", "weight"] is net[0].weight
    # buffers: marked as tensordict marks them (Buffer), over the module's own storage
    for name in ("running_mean", "running_var"):
        assert type(ours["1", name]) is type(theirs["1", name])
        assert isinstance(ours["1", name], Buffer) == isinstance(theirs["1", name], Buffer)
        assert (ours["1", name] is net[1]._buffers[name]) == (
            theirs["1", name] is net[1]._buffers[name]
        )
        assert ours["1", name].data_ptr() == net[1]._buffers[name].data_ptr()
    ours["later"] = torch.zeros(2)  # no_convert=True, as tensordict's: a buffer
    assert "later" in _names(ours, "buffers")


def test_wrapping_a_plain_from_module_makes_running_stats_parameters_as_in_tensordict():
    # Why the recipes use as_module=True: a TensorDict does not say which leaf is a buffer.
    import fcall

    net = _bn_net()
    ours = TensorDictParams(fcall.from_module(net).detach().clone())
    theirs = TDParams(TensorDict.from_module(net).detach().clone())
    assert len(_names(ours)) == len(_names(theirs)) == 8  # the net has 6


@pytest.mark.parametrize(
    "copy_of",
    [
        lambda p: p.detach_registered(),
        lambda p: p.clone(),
        lambda p: p.detach_registered().clone(),
        lambda p: p.copy(),
        lambda p: copy.deepcopy(p),
        lambda p: TensorDictParams(p.data),
        lambda p: TensorDictParams(p),
    ],
    ids=[
        "detach_registered",
        "clone",
        "detach_registered-clone",
        "copy",
        "deepcopy",
        "wrap-data",
        "wrap",
    ],
)
def test_copies_keep_each_entrys_registration(copy_of):
    import fcall

    net = _bn_net()
    p = fcall.from_module(net, as_module=True)
    c = copy_of(p)
    assert type(c) is TensorDictParams and _registration(c) == _registration(p)
    assert all(isinstance(v, nn.Parameter) for v in c.parameters())
    assert not any(isinstance(v, nn.Parameter) for v in c.buffers())


def test_detach_is_tensordicts_a_tensordict_of_plain_tensors():
    """The rule of the peers: tensordict's TensorDictParams.detach() returns a TensorDict
    (TorchRL's SAC calls it inside a compiled forward); fcall's own detach_registered()
    keeps the registrations."""
    import fcall

    net = _bn_net()
    ours = fcall.from_module(net, as_module=True).detach()
    theirs = TDParams(TensorDict.from_module(net), no_convert=True).detach()
    assert type(ours) is type(theirs) is TensorDict
    flat_ours, flat_theirs = ours.flatten_keys("."), theirs.flatten_keys(".")
    assert sorted(flat_ours.keys()) == sorted(flat_theirs.keys())
    for key in flat_theirs.keys():
        assert type(flat_ours[key]) is type(flat_theirs[key]) is torch.Tensor
        assert flat_ours[key].data_ptr() == flat_theirs[key].data_ptr()


def test_detach_and_data_share_storage_and_drop_requires_grad():
    import fcall

    p = fcall.from_module(_bn_net(), as_module=True)
    d = p.detach()
    assert d["0", "weight"].data_ptr() == p["0", "weight"].data_ptr()
    assert not d["0", "weight"].requires_grad and p["0", "weight"].requires_grad
    assert type(p.data) is TensorDict
    assert p.data["1", "running_mean"].data_ptr() == p["1", "running_mean"].data_ptr()
    with torch.no_grad():
        p.zero_()  # tensordict's in-place methods write through .data
    assert (p["0", "weight"] == 0).all() and (p["1", "running_var"] == 0).all()


def test_train_mode_swap_under_autograd_with_batchnorm():
    import fcall

    net = _bn_net().train()
    own = [t.clone() for t in net.buffers()]
    p = fcall.from_module(net, as_module=True).clone()
    x = torch.randn(8, 3)
    with fcall.swap(p, net):
        net(x).sum().backward()
    assert all(v.grad is not None for v in p.parameters())
    assert all(t.grad is None for t in net.parameters())
    assert not torch.equal(p["1", "running_mean"], own[0])  # the copy's stats were updated
    assert all(torch.equal(a, b) for a, b in zip(net.buffers(), own))  # the net's were not
    assert int(p["1", "num_batches_tracked"]) == 1
