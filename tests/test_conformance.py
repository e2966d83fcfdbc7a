"""What torch.func's and tensordict's users bring to fcall, eager (issue 15, points 1-9).

Each test builds the case with the peer (``torch.func.functional_call`` or tensordict's
``to_module``) where one defines the behaviour, and checks the module exactly
(``support.state``) after every error path.
"""

from __future__ import annotations

import re

import pytest
import tensordict
import torch
from tensordict import TensorDict
from torch import nn
from torch.nn.utils import parametrize

import fcall
from tests.support import Tied, Untied, assert_same_state, state

UNCHANGED = "The module was left unchanged."


def params_and_buffers(m: nn.Module) -> tuple[dict, dict]:
    params = {k: torch.randn_like(v) for k, v in m.named_parameters()}
    buffers = {k: v.detach().clone() for k, v in m.named_buffers()}
    return params, buffers


def bn_model() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).train()


# --- 1. functional_call(m, (params, buffers), args) -------------------------------------


@pytest.mark.parametrize("container", [tuple, list])
def test_the_tuple_of_dicts_form_matches_torch_func(container):
    m, peer = bn_model(), bn_model()
    peer.load_state_dict(m.state_dict())
    params, buffers = params_and_buffers(m)
    ours_buffers = {k: v.clone() for k, v in buffers.items()}
    x = torch.randn(5, 3)
    before = state(m)
    for _ in range(3):
        y = fcall.functional_call(m, container((params, ours_buffers)), (x,))
        expected = torch.func.functional_call(peer, container((params, buffers)), (x,))
        torch.testing.assert_close(y, expected)
        # BatchNorm's running stats land in the buffers given, in place, as torch.func's
        torch.testing.assert_close(ours_buffers, buffers)
    assert_same_state(m, before)


def test_the_tuple_form_takes_nested_dicts_and_tensordicts():
    m = bn_model()
    params, buffers = params_and_buffers(m)
    nested = TensorDict(params).unflatten_keys(".")
    x = torch.randn(5, 3)
    expected = torch.func.functional_call(m, (params, dict(buffers)), (x,))
    torch.testing.assert_close(fcall.functional_call(m, (nested, dict(buffers)), (x,)), expected)


@pytest.mark.parametrize(
    "twice, listed",
    [
        (lambda p: (p, {"0.weight": p["0.weight"]}), "'0.weight'"),
        (lambda p: (p, dict(p)), "'0.weight', '0.bias'"),
        # the same key in a flat and in a nested form
        (lambda p: ({"0.weight": p["0.weight"]}, {"0": {"weight": p["0.weight"]}}), "'0.weight'"),
    ],
)
def test_a_key_in_two_dicts_raises_like_torch_func(twice, listed):
    m = nn.Sequential(nn.Linear(2, 2))
    params = {k: torch.zeros_like(v) for k, v in m.named_parameters()}
    before = state(m)
    msg = (
        f"fcall.functional_call: {listed} appeared in more than one of the params dicts, so "
        f"which value to use is ambiguous. Give each key in one dict only. {UNCHANGED}"
    )
    with pytest.raises(ValueError, match=re.escape(msg)):
        fcall.functional_call(m, twice(params), (torch.ones(2),))
    assert_same_state(m, before)
    flat_twice = twice(params)
    if all(isinstance(v, torch.Tensor) for d in flat_twice for v in d.values()):
        with pytest.raises(ValueError, match="appeared in multiple dictionaries"):
            torch.func.functional_call(m, flat_twice, (torch.ones(2),))  # the peer raises too


def test_a_tuple_element_that_is_not_a_dict_raises_like_torch_func():
    m = nn.Linear(2, 2)
    before = state(m)
    msg = (
        "fcall.functional_call: params is a tuple or list, so each of its elements must be "
        "a dict of tensors (as torch.func.functional_call's (params, buffers) form), but "
        f"element 1 is of type int. Pass dicts, or one dict. {UNCHANGED}"
    )
    with pytest.raises(ValueError, match=re.escape(msg)):
        fcall.functional_call(m, ({}, 3), (torch.ones(2),))
    with pytest.raises(ValueError, match="Expected all elements"):
        torch.func.functional_call(m, ({}, 3), (torch.ones(2),))
    assert_same_state(m, before)


# --- 3. a TorchScript target ---------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda s, p: fcall.functional_call(s, p, (torch.ones(2),)),
        lambda s, p: fcall.swap(p, s).__enter__(),
        lambda s, p: fcall.to_module(p, s),
    ],
    ids=["functional_call", "swap", "to_module"],
)
def test_a_scripted_module_is_refused_clearly(call):
    scripted = torch.jit.script(nn.Linear(2, 2))
    weight = scripted.weight
    with pytest.raises(RuntimeError) as error:
        call(scripted, {"weight": torch.zeros(2, 2)})
    assert str(error.value).endswith(
        ": RecursiveScriptModule is a TorchScript module (torch.jit.script or torch.jit.trace), "
        "and its parameters cannot be swapped; torch.func's stateless API refuses it too. "
        f"Swap into the nn.Module before scripting it. {UNCHANGED}"
    )
    # torch.func's own words first (its tests match them), then fcall's detail
    peer = "The stateless API can't be used with Jitted modules.\n"
    assert str(error.value).startswith(peer + "fcall.")
    assert scripted.weight is weight
    with pytest.raises(RuntimeError, match="can't be used with Jitted modules"):
        torch.func.functional_call(scripted, {"weight": torch.zeros(2, 2)}, (torch.ones(2),))


# --- 4. weights tied after a first swap ------------------------------------------------------


@pytest.mark.parametrize("api", ["swap", "functional_call"])
def test_weights_tied_after_a_first_swap_take_the_tied_result(api):
    m = Untied()
    idx = torch.tensor([0, 4])
    w = torch.randn(5, 3)

    def run(module):
        if api == "functional_call":
            return fcall.functional_call(module, {"emb.weight": w}, (idx,))
        swap = fcall.swap if api == "swap" else fcall.to_module
        with swap(TensorDict({"emb": {"weight": w}}), module):
            return module(idx)

    for _ in range(3):  # the plan is cached
        torch.testing.assert_close(run(m), torch.func.functional_call(m, {"emb.weight": w}, idx))
    m.head.weight = m.emb.weight  # tied now
    before = state(m)
    expected = torch.func.functional_call(m, {"emb.weight": w}, idx)
    torch.testing.assert_close(run(m), expected)
    torch.testing.assert_close(expected, w[idx] @ w.T)  # head used w too
    assert_same_state(m, before)
    m.head.weight = nn.Parameter(torch.randn(5, 3))  # and untied again
    torch.testing.assert_close(run(m), torch.func.functional_call(m, {"emb.weight": w}, idx))


def test_a_submodule_shared_after_a_first_swap_takes_the_value():
    m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    x = torch.ones(2)
    w = {"0.weight": torch.eye(2), "0.bias": torch.zeros(2)}
    for _ in range(3):
        fcall.functional_call(m, w, (x,))
    m[1] = m[0]  # one Linear at two paths: its tensors are tied under both names
    expected = torch.func.functional_call(m, w, (x,))
    torch.testing.assert_close(fcall.functional_call(m, w, (x,)), expected)


# --- 5. a slot deleted inside the block -----------------------------------------------------


def with_buffer() -> nn.Module:
    m = nn.Linear(2, 2)
    m.register_buffer("rb", torch.ones(2))
    return m


def swapped_in(m: nn.Module) -> TensorDict:
    return TensorDict({k: torch.zeros_like(v) for k, v in fcall.from_module(m).items()})


@pytest.mark.parametrize("api", ["swap", "functional_call", "to_module"])
@pytest.mark.parametrize("name", ["weight", "bias", "rb"])
def test_a_slot_deleted_in_the_block_is_restored(api, name):
    m = with_buffer()
    values = {k: v for k, v in fcall.from_module(m).items()}
    params = swapped_in(m)
    for _ in range(3):  # warm the plan
        fcall.functional_call(m, params, (torch.ones(2),))

    def forward_deleting(x):
        delattr(m, name)
        return x

    m.forward = forward_deleting
    if api == "functional_call":
        fcall.functional_call(m, params, (torch.ones(2),))
    else:
        swap = fcall.swap if api == "swap" else fcall.to_module
        with swap(params, m):
            m(torch.ones(2))
    del m.forward
    # every slot holds its very object again, in its own dict (a deleted one at the end
    # of it, as torch.func registers it again)
    for key, value in values.items():
        where = m._buffers if key == "rb" else m._parameters
        assert where[key] is value
    assert sorted(m._parameters) == ["bias", "weight"] and list(m._buffers) == ["rb"]
    assert not any(k in m.__dict__ for k in values)


def test_torch_func_restores_a_deleted_parameter_the_same_way():
    ours, peer = with_buffer(), with_buffer()
    for m, call in ((ours, fcall.functional_call), (peer, torch.func.functional_call)):
        weight, bias = m.weight, m.bias

        def forward_deleting(x, m=m):
            del m.weight
            return x

        m.forward = forward_deleting
        call(m, {"weight": torch.zeros(2, 2), "bias": torch.zeros(2)}, (torch.ones(2),))
        del m.forward
        assert m.weight is weight and m.bias is bias
    assert list(ours._parameters) == list(peer._parameters) == ["bias", "weight"]


class Identity(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_a_name_the_block_gave_to_a_parametrization_raises_after_restoring_the_rest():
    m = with_buffer()
    bias, rb = m.bias, m.rb
    msg = (
        "fcall: inside the block, 'weight' left its slot and the name now holds something "
        "else (a parametrization, a plain attribute, another parameter, buffer or submodule): "
        "every other slot was restored, and 'weight' kept what the block made of it. Register "
        "parametrizations, pruning or deletions outside the swap."
    )
    params = swapped_in(m)
    with pytest.raises(RuntimeError, match=re.escape(msg)):
        with fcall.swap(params, m):
            parametrize.register_parametrization(m, "weight", Identity())
    assert m.bias is bias and m.rb is rb  # never half-swapped
    assert list(m._parameters) == ["bias"]  # not registered twice
    assert m.parametrizations.weight.original is params["weight"]  # what the block made
    # torch.func raises too, and leaves the module half-swapped
    peer = with_buffer()
    peer_bias = peer.bias

    def forward(x):
        parametrize.register_parametrization(peer, "weight", Identity())
        return x

    peer.forward = forward
    with pytest.raises(KeyError, match="already exists"):
        torch.func.functional_call(peer, dict(swapped_in(peer)), (torch.ones(2),))
    assert peer.bias is not peer_bias


# --- 6. one swap object entered twice ----------------------------------------------------------


def test_entering_one_swap_twice_nests_the_restores():
    m = nn.Linear(2, 2)
    weight, bias = m.weight, m.bias
    params = {"weight": torch.zeros(2, 2), "bias": torch.ones(2)}
    s = fcall.swap(params, m)
    with s as outer_old:
        assert outer_old["weight"] is weight
        with s as inner_old:
            assert m.weight is params["weight"]
            assert inner_old["weight"] is params["weight"]  # what the module held then
        assert m.weight is params["weight"] and m.bias is params["bias"]
    assert m.weight is weight and m.bias is bias
    with s:  # and it can be entered again after
        assert m.weight is params["weight"]
    assert m.weight is weight


def test_a_swap_object_entered_twice_restores_when_the_inner_block_raises():
    m = nn.Linear(2, 2)
    before = state(m)
    s = fcall.swap({"weight": torch.zeros(2, 2)}, m)
    with pytest.raises(ZeroDivisionError):
        with s:
            with s:
                raise ZeroDivisionError
    assert_same_state(m, before)


# --- 7. a submodule at two paths -----------------------------------------------------------


def shared() -> tuple[nn.Module, nn.Module]:
    l0 = nn.Linear(2, 2)
    return nn.Sequential(l0, nn.Sequential(l0)), l0


@pytest.mark.parametrize("preserve", [False, True])
def test_to_module_into_a_submodule_at_two_paths_works_like_tensordict(preserve):
    ours, l0 = shared()
    peer, p0 = shared()
    p0.load_state_dict(l0.state_dict())
    before = state(ours)
    zeros = fcall.from_module(ours).detach().clone().zero_()
    zeros["1", "0", "weight"] = torch.ones(2, 2)  # the later path is the one that stays
    peer_zeros = TensorDict.from_module(peer).detach().clone().zero_()
    peer_zeros["1", "0", "weight"] = torch.ones(2, 2)
    x = torch.randn(3, 2)
    for _ in range(3):
        with fcall.to_module(zeros, ours, preserve_module_state=preserve) as old:
            y = ours(x)
            where = "_parameters" if preserve else "__dict__"
            held = getattr(l0, where) if where != "__dict__" else l0.__dict__
            assert "weight" in held
        with peer_zeros.to_module(peer, preserve_module_state=preserve):
            expected = peer(x)
        torch.testing.assert_close(y, expected)
        assert_same_state(ours, before)
        assert old["0", "weight"] is old["1", "0", "weight"] is l0.weight  # the originals


def test_undoing_a_swap_into_a_submodule_at_two_paths_and_back_works_like_tensordict():
    # `with to_module(old, m):` undoes the swap and, on exit, puts it back; the restore must
    # report what the shared slot held once per path (it reported the original for the
    # second path, so the swap came back with the original weight)
    ours, l0 = shared()
    peer, p0 = shared()
    before = state(ours)
    values = fcall.from_module(ours).detach().clone().apply(lambda t: t.zero_() + 1)
    peer_values = TensorDict.from_module(peer).detach().clone().apply(lambda t: t.zero_() + 1)
    old, peer_old = fcall.to_module(values, ours), peer_values.to_module(peer)
    inside, peer_inside = l0.weight, p0.weight
    with fcall.to_module(old, ours), peer_old.to_module(peer):
        assert l0.weight is old["0", "weight"] and p0.weight is peer_old["0", "weight"]
    assert (l0.weight is inside) == (p0.weight is peer_inside) is True
    assert type(l0.weight) is type(p0.weight) is nn.Parameter
    fcall.to_module(old, ours)
    assert_same_state(ours, before, in_any_order=True)


def test_swap_into_a_submodule_at_two_paths_restores_it():
    m, l0 = shared()
    before = state(m)
    w = torch.zeros(2, 2)
    for _ in range(3):
        with fcall.swap({"0.weight": w}, m):  # the second path follows: one tensor
            assert l0.weight is w
        assert_same_state(m, before)
    x = torch.randn(3, 2)
    peer, p0 = shared()
    p0.load_state_dict(l0.state_dict())
    expected = torch.func.functional_call(peer, {"0.weight": w}, (x,))
    torch.testing.assert_close(fcall.functional_call(m, {"0.weight": w}, (x,)), expected)
    assert_same_state(m, before)
    # torch.func swaps the shared slot twice and restores it to w: fcall does not
    assert p0.weight is w


# --- 8. to_module into a TensorDictParams ---------------------------------------------------


@pytest.mark.parametrize("params_cls", [fcall.TensorDictParams, tensordict.nn.TensorDictParams])
def test_to_module_into_a_tensordict_params_replaces_its_tensordict_like_tensordict(params_cls):
    target = params_cls(fcall.from_module(nn.Sequential(nn.Linear(2, 2))))
    weight, inner = target["0", "weight"], target._param_td
    zeros = target.data.clone().zero_()
    peer = tensordict.nn.TensorDictParams(TensorDict.from_module(nn.Sequential(nn.Linear(2, 2))))
    peer_inner = peer._param_td
    peer_zeros = peer.data.clone().zero_()
    with fcall.to_module(zeros, target) as old, peer_zeros.to_module(peer) as peer_old:
        assert target._param_td is zeros and peer._param_td is peer_zeros
        assert type(old) is type(target) and type(peer_old) is type(peer)
        assert old["0", "weight"] is weight
        torch.testing.assert_close(target["0", "weight"], peer["0", "weight"])
    # fcall puts back the very TensorDict, tensordict a shallow copy: the same leaves
    assert target._param_td is inner and peer._param_td is not peer_inner
    assert target["0", "weight"] is weight and target["0", "bias"] is inner["0", "bias"]
    assert peer["0", "weight"] is peer_inner["0", "weight"]


def test_to_module_into_a_tensordict_params_without_return_swap_updates_it():
    target = fcall.TensorDictParams(fcall.from_module(nn.Sequential(nn.Linear(2, 2))))
    assert fcall.to_module({"0.weight": torch.zeros(2, 2)}, target, return_swap=False) is None
    assert (target["0", "weight"] == 0).all()


# --- 9. a Parameter for a buffer slot, preserve_module_state=True -----------------------------


def test_a_parameter_for_a_buffer_is_registered_as_a_buffer_like_tensordict():
    ours, peer = nn.BatchNorm1d(2), nn.BatchNorm1d(2)
    before = state(ours)
    value = nn.Parameter(torch.ones(2))
    params = fcall.from_module(ours).detach().clone()
    params["running_mean"] = value
    peer_params = TensorDict.from_module(peer).detach().clone()
    peer_params["running_mean"] = value
    for _ in range(3):
        with fcall.to_module(params, ours), peer_params.to_module(peer):
            got, want = ours._buffers["running_mean"], peer._buffers["running_mean"]
            assert type(got) is type(want) is torch.Tensor  # nn.Buffer(p): a plain tensor
            assert got.requires_grad == want.requires_grad == value.requires_grad
            assert got.data_ptr() == want.data_ptr() == value.data_ptr()  # shares storage
            assert "running_mean" not in ours._parameters
        assert_same_state(ours, before)


@pytest.mark.parametrize("frozen", ["module", "values"])
def test_parameters_whose_requires_grad_is_not_the_slots_get_the_slots_like_tensordict(frozen):
    # tensordict's rule (_maybe_preserve_module_state): a Parameter value whose
    # requires_grad differs from the slot's goes in as a new Parameter with the slot's.
    # All values Parameters that require grad, into a frozen module, took a shortcut
    # that put them in as they were (the eager path only).
    ours, peer = nn.Linear(2, 2), nn.Linear(2, 2)
    if frozen == "module":
        ours.requires_grad_(False), peer.requires_grad_(False)
    values = {
        "weight": nn.Parameter(torch.ones(2, 2), requires_grad=frozen == "module"),
        "bias": nn.Parameter(torch.ones(2), requires_grad=frozen == "module"),
    }
    before = state(ours)
    for _ in range(2):  # the second through the cached plan
        with fcall.to_module(values, ours), TensorDict(values).to_module(peer):
            for name in ("weight", "bias"):
                got, want = ours._parameters[name], peer._parameters[name]
                assert type(got) is type(want) is nn.Parameter
                assert got.requires_grad == want.requires_grad == (frozen == "values")
                assert (got is values[name]) == (want is values[name]) is False
                assert got.data_ptr() == want.data_ptr() == values[name].data_ptr()
        assert_same_state(ours, before, in_any_order=True)


def test_swap_keeps_a_parameter_for_a_buffer_as_it_is_like_torch_func():
    m = nn.BatchNorm1d(2)
    value = nn.Parameter(torch.ones(2))
    with fcall.swap({"running_mean": value}, m):
        assert m._buffers["running_mean"] is value


# --- 2. ties seen with no hook and no mark (fcall/_core/plan.py, TieWatch) ------------------------


def _tie_seen(m: nn.Module) -> bool:
    w = torch.randn(5, 3)
    with fcall.swap({"emb.weight": w}, m):
        return m.head.weight is w


def test_a_tie_made_after_a_first_swap_is_seen_and_so_is_an_untie_and_a_shared_submodule():
    m = Untied()
    assert not _tie_seen(m)
    m.head.weight = m.emb.weight
    assert _tie_seen(m)
    m.head.weight = nn.Parameter(torch.randn(5, 3))
    assert not _tie_seen(m)
    seq = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    with fcall.swap({"0.weight": torch.zeros(2, 2)}, seq):
        assert (seq[1].weight != 0).any()
    seq[1] = seq[0]  # one submodule at two paths
    with fcall.swap({"0.weight": torch.zeros(2, 2)}, seq):
        assert (seq[1].weight == 0).all()


def test_a_tie_made_in_a_deep_copy_after_a_first_swap_is_seen():
    import copy

    twin = copy.deepcopy(Untied())
    assert not _tie_seen(twin)
    twin.head.weight = twin.emb.weight
    assert _tie_seen(twin)
    idx = torch.tensor([0, 4])
    w = torch.randn(5, 3)
    expected = torch.func.functional_call(twin, {"emb.weight": w}, idx)
    torch.testing.assert_close(fcall.functional_call(twin, {"emb.weight": w}, (idx,)), expected)


def test_swaps_write_nothing_into_the_modules():
    m = Untied()
    attributes = {name: set(mod.__dict__) for name, mod in m.named_modules()}
    p = fcall.from_module(m).detach().clone()
    with fcall.swap(p, m):
        pass
    with fcall.to_module(p, m):
        pass
    fcall.functional_call(m, dict(p.flatten_keys(".")), (torch.tensor([0]),))
    assert {name: set(mod.__dict__) for name, mod in m.named_modules()} == attributes


def test_a_plain_tensor_under_both_tied_names_gets_one_parameter_per_name_as_tensordict():
    w = torch.randn(5, 3)
    seen, orders = {}, {}
    for name, swap in (("fcall", fcall.to_module), ("tensordict", TensorDict.to_module)):
        m = Tied()
        before = state(m)
        params = TensorDict({"emb": {"weight": w}, "head": {"weight": w}})
        with swap(params, m):
            seen[name] = (
                m.emb.weight is m.head.weight,
                type(m.emb.weight),
                type(m.head.weight),
                m.emb.weight.data_ptr() == m.head.weight.data_ptr() == w.data_ptr(),
            )
        assert_same_state(m, before, in_any_order=True)
        orders[name] = [row[:3] for row in state(m)]  # restores move head.weight last
        assert m.emb.weight is m.head.weight  # tied again after the block, both
    assert seen["fcall"] == seen["tensordict"] == (False, nn.Parameter, nn.Parameter, True)
    assert orders["fcall"] == orders["tensordict"]
