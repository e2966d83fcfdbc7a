"""fcall.swap, fcall.functional_call and fcall.from_module, eager (issue 2: b, c, d, e, f, g)."""

from __future__ import annotations

import re

import pytest
import torch
from tensordict import TensorDict
from torch import nn

import fcall
from tests.support import (
    Counter,
    Net,
    Tied,
    assert_same_state,
    flat,
    key,
    state,
)

# --- from_module ---------------------------------------------------------------------------


def test_from_module_has_nested_keys_and_the_module_objects():
    m = Net()
    params = fcall.from_module(m)
    assert isinstance(params, TensorDict)
    keys = {key(k) for k in params.keys(True, True)}
    expected = {tuple(n.split(".")) for n, _ in m.named_parameters()}
    expected |= {tuple(n.split(".")) for n, _ in m.named_buffers()}
    assert keys == expected
    assert ("offset",) in keys  # non-persistent buffer
    assert params["lin", "weight"] is m.lin.weight
    assert params["bn", "running_mean"] is m.bn.running_mean


def test_from_module_lists_tied_names_once_each():
    m = Tied()
    params = fcall.from_module(m)
    assert params["emb", "weight"] is params["head", "weight"] is m.emb.weight


# --- swap ------------------------------------------------------------------------------------


def test_swap_binds_old_values_and_restores():
    m = Net()
    before = state(m)
    weight = m.lin.weight
    new = fcall.from_module(m).detach().clone().zero_()
    with fcall.swap(new, m) as old:
        assert isinstance(old, TensorDict)
        assert old["lin", "weight"] is weight
        assert m.lin.weight is new["lin", "weight"]  # as it is, like functional_call
        assert m(torch.randn(2, 3)).abs().sum() == 0
    assert_same_state(m, before)


def test_swap_restores_on_exception():
    m = Net()
    before = state(m)
    with pytest.raises(ZeroDivisionError):
        with fcall.swap({"lin.weight": torch.zeros(4, 3)}, m):
            1 / 0  # noqa: B018
    assert_same_state(m, before)


def test_swap_nested_blocks():
    m = nn.Linear(2, 2)
    before = state(m)
    a, b = {"weight": torch.zeros(2, 2)}, {"weight": torch.ones(2, 2)}
    with fcall.swap(a, m):
        with fcall.swap(b, m) as old:
            assert old["weight"] is a["weight"]
            assert m.weight is b["weight"]
        assert m.weight is a["weight"]
    assert_same_state(m, before)


def test_swap_partial_by_default():
    m = nn.Linear(2, 2)
    bias = m.bias
    with fcall.swap({"weight": torch.zeros(2, 2)}, m):
        assert m.bias is bias


def test_swap_strict_lists_the_missing_keys():
    m = Net()
    before = state(m)
    msg = (
        "fcall.swap(strict=True): params has no value for 2 key(s) of Net: "
        "'bn.num_batches_tracked', 'lin.bias'."
    )
    params = fcall.from_module(m).detach().clone()
    del params["lin", "bias"]
    del params["bn", "num_batches_tracked"]
    with pytest.raises(RuntimeError, match=re.escape(msg)):
        with fcall.swap(params, m, strict=True):
            pass
    assert_same_state(m, before)


def test_swap_strict_accepts_a_complete_set_and_one_name_of_a_tie():
    m = Tied()
    with fcall.swap({"emb.weight": torch.zeros(5, 3)}, m, strict=True):
        assert m.head.weight is m.emb.weight


def test_swap_batchnorm_stats_land_in_params_and_reassigned_buffer_is_written_back():
    m = Net().train()
    params = fcall.from_module(m).detach().clone()
    with fcall.swap(params, m):
        m(torch.randn(8, 3) + 3)
    assert (params["bn", "running_mean"] != 0).all()
    assert (m.bn.running_mean == 0).all()
    c = Counter()
    before = state(c)
    cp = {"count": torch.zeros(())}
    with fcall.swap(cp, c):
        c(torch.ones(2))
    assert cp["count"] == 1
    assert_same_state(c, before)


def test_swap_gradients_reach_plain_leaves_and_parameters():
    m = nn.Linear(2, 2)
    w = torch.randn(2, 2, requires_grad=True)
    b = nn.Parameter(torch.randn(2))
    with fcall.swap({"weight": w, "bias": b}, m):
        m(torch.ones(1, 2)).sum().backward()
    torch.testing.assert_close(w.grad, torch.ones(2, 2))
    torch.testing.assert_close(b.grad, torch.ones(2))
    assert m.weight.grad is None


@pytest.mark.parametrize("prefix", ["", "_orig_mod."])
def test_swap_compiled_module_keys(prefix):
    inner = nn.Linear(2, 2)
    m = torch.compile(inner, backend="eager")
    before = state(inner)
    w = torch.zeros(2, 2)
    with fcall.swap({f"{prefix}weight": w}, m):
        assert inner.weight is w
    out = fcall.functional_call(m, {f"{prefix}weight": w}, (torch.ones(2),))
    torch.testing.assert_close(out, inner.bias.detach())
    assert_same_state(inner, before)


# --- tied weights ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["emb.weight", "head.weight"])
def test_tied_given_once_both_names_follow(name):
    m = Tied()
    before = state(m)
    w = torch.zeros(5, 3)
    with fcall.swap({name: w}, m):
        assert m.emb.weight is w and m.head.weight is w
    assert_same_state(m, before)
    out = fcall.functional_call(m, {name: w}, (torch.tensor([1, 2]),))
    assert (out == 0).all()
    assert_same_state(m, before)
    expected = torch.func.functional_call(m, {name: w}, (torch.tensor([1, 2]),))
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("api", ["swap", "functional_call"])
def test_tied_different_values_raise_value_error(api):
    m = Tied()
    before = state(m)
    params = {"emb.weight": torch.zeros(5, 3), "head.weight": torch.ones(5, 3)}
    msg = (
        f"fcall.{api}: got different tensors for the keys 'emb.weight', 'head.weight', "
        "which the module ties to one tensor."
    )
    with pytest.raises(ValueError, match=re.escape(msg)):
        if api == "swap":
            with fcall.swap(params, m):
                pass
        else:
            fcall.functional_call(m, params, (torch.tensor([1]),))
    assert_same_state(m, before)


def test_tied_same_tensor_for_both_names_is_fine():
    m = Tied()
    w = torch.zeros(5, 3)
    with fcall.swap({"emb.weight": w, "head.weight": w}, m):
        assert m.head.weight is w


def test_tie_weights_false_each_name_takes_its_own_value():
    m = Tied()
    before = state(m)
    a, b = torch.zeros(5, 3), torch.ones(5, 3)
    with fcall.swap({"emb.weight": a, "head.weight": b}, m, tie_weights=False):
        assert m.emb.weight is a and m.head.weight is b
    assert_same_state(m, before)
    tied = m.emb.weight
    with fcall.swap({"emb.weight": a}, m, tie_weights=False):
        assert m.emb.weight is a and m.head.weight is tied
    assert_same_state(m, before)
    idx = torch.tensor([0, 3])
    ours = fcall.functional_call(m, {"emb.weight": a}, (idx,), tie_weights=False)
    theirs = torch.func.functional_call(m, {"emb.weight": a}, (idx,), tie_weights=False)
    torch.testing.assert_close(ours, theirs)


# --- functional_call ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["flat", "nested-dict", "tensordict"])
def test_functional_call_matches_torch(kind):
    m = Net().eval()
    before = state(m)
    params = fcall.from_module(m).detach().clone()
    params.apply_(lambda t: t.normal_() if t.is_floating_point() else t)
    params["bn", "running_var"].abs_()
    x = torch.randn(2, 3)
    expected = torch.func.functional_call(m, flat(params), (x,))
    given = {
        "flat": flat(params),
        "nested-dict": params.to_dict(),
        "tensordict": params,
    }[kind]
    torch.testing.assert_close(fcall.functional_call(m, given, (x,)), expected)
    assert_same_state(m, before)


def test_functional_call_args_kwargs_like_torch():
    class Add(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(2))

        def forward(self, x, *, y=0):
            return self.w * x + y

    m = Add()
    p = {"w": torch.full((2,), 2.0)}
    x = torch.ones(2)
    for args in (x, (x,)):
        torch.testing.assert_close(
            fcall.functional_call(m, p, args, {"y": 1}),
            torch.func.functional_call(m, p, args, {"y": 1}),
        )


def test_functional_call_restores_on_exception():
    m = nn.Linear(2, 2)
    before = state(m)
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied"):
        fcall.functional_call(m, {"weight": torch.zeros(2, 2)}, (torch.ones(1, 3),))
    assert_same_state(m, before)


def test_functional_call_strict():
    m = nn.Linear(2, 2)
    msg = "fcall.functional_call(strict=True): params has no value for 1 key(s) of Linear: 'bias'."
    with pytest.raises(RuntimeError, match=re.escape(msg)):
        fcall.functional_call(m, {"weight": torch.zeros(2, 2)}, (torch.ones(2),), strict=True)


def test_functional_call_gradients_match_torch():
    m = nn.Linear(3, 2)
    params = {k: v.detach().clone().requires_grad_() for k, v in m.named_parameters()}
    x = torch.randn(4, 3)
    fcall.functional_call(m, params, (x,)).pow(2).sum().backward()
    ref = {k: v.detach().clone().requires_grad_() for k, v in params.items()}
    torch.func.functional_call(m, ref, (x,)).pow(2).sum().backward()
    for k in params:
        torch.testing.assert_close(params[k].grad, ref[k].grad)
    assert m.weight.grad is None


def test_functional_call_batchnorm_and_reassigned_buffer_write_back_like_torch():
    m = Net().train()
    ours = fcall.from_module(m).detach().clone()
    theirs = flat(ours.clone())
    x = torch.randn(8, 3)
    fcall.functional_call(m, ours, (x,))
    torch.func.functional_call(m, theirs, (x,))
    torch.testing.assert_close(flat(ours), theirs)
    c = Counter()
    cp, ref = {"count": torch.zeros(())}, {"count": torch.zeros(())}
    fcall.functional_call(c, cp, (torch.ones(2),))
    torch.func.functional_call(c, ref, (torch.ones(2),))
    assert cp["count"] == ref["count"] == 1


# --- vmap ----------------------------------------------------------------------------------


def stacked_params(m: nn.Module, n: int = 3) -> TensorDict:
    return torch.stack([fcall.from_module(m).detach().apply(torch.randn_like) for _ in range(n)])


def test_vmap_functional_call_matches_a_loop_and_restores():
    m = nn.Linear(3, 2)
    before = state(m)
    stacked = stacked_params(m)
    x = torch.randn(4, 3)
    out = torch.vmap(lambda p, x: fcall.functional_call(m, p, (x,)), (0, None))(stacked, x)
    for i in range(3):
        torch.testing.assert_close(out[i], torch.func.functional_call(m, flat(stacked[i]), (x,)))
    assert_same_state(m, before)


def test_vmap_swap_inside_the_function_restores():
    m = nn.Linear(3, 2)
    before = state(m)
    stacked = stacked_params(m)

    def run(p, x):
        with fcall.swap(p, m):
            return m(x)

    x = torch.randn(4, 3)
    out = torch.vmap(run, (0, None))(stacked, x)
    torch.testing.assert_close(out[2], torch.func.functional_call(m, flat(stacked[2]), (x,)))
    assert_same_state(m, before)


def test_vmap_gradients_reach_stacked_leaves():
    m = nn.Linear(3, 2)
    stacked = stacked_params(m).apply(lambda t: t.requires_grad_())
    x = torch.randn(4, 3)
    torch.vmap(lambda p, x: fcall.functional_call(m, p, (x,)), (0, None))(
        stacked, x
    ).sum().backward()
    torch.testing.assert_close(stacked["bias"].grad, torch.full((3, 2), 4.0))
    assert m.weight.grad is None
