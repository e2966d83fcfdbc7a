"""fcall.to_module, eager: every keyword of the spec and issue 2's rules (b, c, f, g, h)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torch import nn

import fcall
from tests.support import (
    Counter,
    Tied,
    assert_same_state,
    state,
)


class Net(nn.Module):
    """A Linear, a BatchNorm, a persistent and a non-persistent buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 4)
        self.bn = nn.BatchNorm1d(4)
        self.register_buffer("scale", torch.ones(4))
        self.register_buffer("offset", torch.zeros(4), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.lin(x)) * self.scale + self.offset


def zeros_like_params(module: nn.Module) -> TensorDict:
    return fcall.from_module(module).detach().clone().zero_()


def test_returns_the_old_values_and_the_documented_pattern_restores_the_same_objects():
    m = Net()
    before = state(m)
    weight, running_mean = m.lin.weight, m.bn.running_mean
    new = zeros_like_params(m)
    old = fcall.to_module(new, m)
    assert isinstance(old, TensorDict)
    assert old["lin", "weight"] is weight
    assert old["bn", "running_mean"] is running_mean
    assert set(old.keys(True, True)) == set(new.keys(True, True))
    assert isinstance(m.lin.weight, nn.Parameter)
    assert (m.lin.weight == 0).all()
    assert m.bn.running_mean is new["bn", "running_mean"]
    assert m(torch.randn(2, 3)).abs().sum() == 0
    again = fcall.to_module(old, m)
    assert again["bn", "running_mean"] is new["bn", "running_mean"]
    assert_same_state(m, before)


def test_return_swap_false_returns_none():
    m = nn.Linear(2, 2)
    weight = m.weight
    assert fcall.to_module({"weight": torch.zeros(2, 2)}, m, return_swap=False) is None
    assert (m.weight == 0).all() and m.weight is not weight


def test_swap_dest_tensordict_is_filled_and_returned():
    m = Net()
    before = state(m)
    weight = m.lin.weight
    dest = TensorDict()
    out = fcall.to_module(zeros_like_params(m), m, swap_dest=dest)
    assert out is dest
    assert dest["lin", "weight"] is weight
    fcall.to_module(dest, m)
    assert_same_state(m, before)


def test_swap_dest_tensordict_as_context_manager_restores():
    m = Net()
    before = state(m)
    dest = TensorDict()
    with fcall.to_module(zeros_like_params(m), m, swap_dest=dest) as out:
        assert out is dest
        assert (m.lin.weight == 0).all()
    assert_same_state(m, before)


def test_old_values_given_back_undo_a_replace_swap_exactly():
    m = Net()
    before = state(m)
    plain = {"lin": {"weight": torch.zeros(4, 3), "bias": torch.zeros(4)}}
    old = fcall.to_module(plain, m, preserve_module_state=False)
    assert "weight" not in m.lin._parameters  # now a plain attribute
    back = fcall.to_module(old, m)
    assert_same_state(m, before)  # same objects, dicts and order
    assert back["lin", "weight"] is plain["lin"]["weight"]


def test_context_manager_restores_on_normal_exit():
    m = Net()
    before = state(m)
    weight = m.lin.weight
    x = torch.randn(2, 3)
    with fcall.to_module(zeros_like_params(m), m) as old:
        assert old["lin", "weight"] is weight
        assert m(x).abs().sum() == 0
    assert_same_state(m, before)


def test_context_manager_restores_on_exception():
    m = Net()
    before = state(m)
    with pytest.raises(ValueError, match="stop"):
        with fcall.to_module(zeros_like_params(m), m):
            raise ValueError("stop")
    assert_same_state(m, before)


def test_nested_blocks_with_several_param_sets_unwind():
    m = nn.Linear(2, 2)
    before = state(m)
    sets = [{"weight": torch.full((2, 2), float(i)), "bias": torch.zeros(2)} for i in range(3)]
    x = torch.ones(1, 2)
    with fcall.to_module(sets[0], m):
        assert m(x).sum() == 0
        inner_weight = m.weight
        with fcall.to_module(sets[1], m):
            with fcall.to_module(sets[2], m):
                assert m(x).sum() == 8
            assert m(x).sum() == 4
        assert m.weight is inner_weight
        assert m(x).sum() == 0
    assert_same_state(m, before)


def test_nested_block_unwinds_on_exception_from_the_inner_block():
    m = nn.Linear(2, 2)
    before = state(m)
    with pytest.raises(KeyError, match="inner"):
        with fcall.to_module({"weight": torch.zeros(2, 2)}, m):
            with fcall.to_module({"weight": torch.ones(2, 2)}, m):
                raise KeyError("inner")
    assert_same_state(m, before, in_any_order=True)


@pytest.mark.parametrize("preserve", [True, False])
def test_old_values_swapped_back_in_a_nested_block_swap_out_again_on_exit(preserve):
    # tensordict: `with p.to_module(m) as old: with old.to_module(m): ...` runs the inner
    # block on the module's own values, and the outer one on p's again after it.
    m = Net()
    before = state(m)
    x = torch.randn(2, 3)
    with fcall.to_module(zeros_like_params(m), m, preserve_module_state=preserve) as old:
        swapped_in, swapped_weight = state(m), m.lin.weight
        with fcall.to_module(old, m, preserve_module_state=preserve) as taken_out:
            assert_same_state(m, before)
            assert taken_out["lin", "weight"] is swapped_weight
        assert_same_state(m, swapped_in)
        assert m.eval()(x).abs().sum() == 0
    assert_same_state(m, before)


def test_old_values_swapped_back_in_a_nested_block_unwind_on_exception():
    m = Net()
    before = state(m)
    with pytest.raises(KeyError, match="inner"):
        with fcall.to_module(zeros_like_params(m), m) as old:
            with fcall.to_module(old, m):
                raise KeyError("inner")
    assert_same_state(m, before)


def test_missing_keys_are_a_partial_swap():
    m = Net()
    bias = m.lin.bias
    before = state(m)
    with fcall.to_module({"lin": {"weight": torch.zeros(4, 3)}}, m) as old:
        assert list(old.keys(True, True)) == [("lin", "weight")]
        assert (m.lin.weight == 0).all()
        assert m.lin.bias is bias
    assert_same_state(m, before, in_any_order=True)


@pytest.mark.parametrize(
    "params",
    [
        {"lin.weight": torch.zeros(4, 3), "bn.running_mean": torch.ones(4)},
        {"lin": {"weight": torch.zeros(4, 3)}, "bn": {"running_mean": torch.ones(4)}},
        {"lin": {"weight": torch.zeros(4, 3)}, "bn.running_mean": torch.ones(4)},
        TensorDict({"lin": {"weight": torch.zeros(4, 3)}, "bn": {"running_mean": torch.ones(4)}}),
    ],
    ids=["flat-dict", "nested-dict", "mixed-dict", "tensordict"],
)
def test_params_containers(params):
    m = Net()
    before = state(m)
    with fcall.to_module(params, m):
        assert (m.lin.weight == 0).all()
        assert (m.bn.running_mean == 1).all()
    assert_same_state(m, before, in_any_order=True)


def test_preserve_wraps_a_plain_tensor_in_a_parameter_with_the_old_requires_grad():
    m = nn.Linear(2, 2)
    m.bias.requires_grad_(False)
    before = state(m)
    w, b = torch.zeros(2, 2), torch.ones(2)
    with fcall.to_module({"weight": w, "bias": b}, m):
        assert type(m.weight) is nn.Parameter and m.weight.requires_grad
        assert type(m.bias) is nn.Parameter and not m.bias.requires_grad
        assert m.weight.data_ptr() == w.data_ptr()  # no copy
        assert list(m._parameters) == ["weight", "bias"]
    assert_same_state(m, before)


def test_preserve_keeps_a_value_that_requires_grad_as_it_is():
    m = nn.Linear(2, 2)
    before = state(m)
    w = torch.zeros(2, 2, requires_grad=True)
    with fcall.to_module({"weight": w}, m):
        assert m.weight is w
        assert m._parameters["weight"] is w
    assert_same_state(m, before, in_any_order=True)


def test_preserve_keeps_buffers_as_buffers():
    m = Net()
    before = state(m)
    mean, offset = torch.ones(4), torch.ones(4)
    with fcall.to_module({"bn": {"running_mean": mean}, "offset": offset}, m):
        assert m.bn._buffers["running_mean"] is mean
        assert m._buffers["offset"] is offset
        assert "offset" in m._non_persistent_buffers_set
        assert "offset" not in m.state_dict()
    assert_same_state(m, before, in_any_order=True)


def test_preserve_keeps_a_vmap_batched_value_as_it_is():
    m = nn.Linear(3, 2)
    before = state(m)
    stacked = torch.stack([fcall.from_module(m).detach().clone() for _ in range(4)])
    seen = []

    def run(p, x):
        with fcall.to_module(p, m):
            seen.append((m.weight is p["weight"], isinstance(m.weight, nn.Parameter)))
            return m(x)

    x = torch.randn(5, 3)
    out = torch.vmap(run, (0, None))(stacked, x)
    assert seen == [(True, False)]
    torch.testing.assert_close(out[1], torch.func.functional_call(m, dict(stacked[1].items()), x))
    assert_same_state(m, before)


def test_preserve_false_deregisters_a_replaced_parameter_and_restores_registration():
    m = nn.Linear(2, 2)
    before = state(m)
    w = torch.zeros(2, 2)
    with fcall.to_module({"weight": w}, m, preserve_module_state=False):
        assert m.weight is w
        assert "weight" not in m._parameters
        assert m.__dict__["weight"] is w
        assert [n for n, _ in m.named_parameters()] == ["bias"]
    assert_same_state(m, before, in_any_order=True)
    assert list(m._parameters) == ["bias", "weight"]  # tensordict's: weight registered again


def test_preserve_false_restores_registration_with_the_documented_pattern():
    m = Net()
    before = state(m)
    old = fcall.to_module(
        {"lin": {"weight": torch.zeros(4, 3), "bias": torch.zeros(4)}},
        m,
        preserve_module_state=False,
    )
    assert list(m.lin._parameters) == []
    fcall.to_module(old, m, preserve_module_state=False)
    assert_same_state(m, before)


@pytest.mark.parametrize("dest", [None, "swap_dest"])
def test_preserve_false_old_values_regrouped_undo_the_swap_in_tensordicts_order(dest):
    # A flat dict lists every parameter before any buffer; the old values (a swap_dest,
    # or the returned TensorDict) group each submodule's buffers with its parameters.
    # Swapping them back puts every object back in its dict, and the dicts in the order
    # tensordict's to_module leaves them (the names of `old` registered again, in order).
    orders = {}
    for name, to_module in (("fcall", fcall.to_module), ("tensordict", TensorDict.to_module)):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
        m[2].requires_grad_(False)
        m[2].register_parameter("unset", None)  # stays, as MultiheadAttention's q_proj_weight
        before = state(m)
        flat = dict(m.named_parameters()) | dict(m.named_buffers())
        params = {k: v.detach().clone().requires_grad_(v.requires_grad) for k, v in flat.items()}
        # tensordict's swap_dest must hold the nested TensorDicts already: its returned
        # old values, grouped the same way, are the peer's side of the swap_dest case
        kwargs = {"swap_dest": TensorDict()} if dest and name == "fcall" else {}
        params = TensorDict(params).unflatten_keys(".")
        old = to_module(params, m, preserve_module_state=False, **kwargs)
        assert list(m[2]._parameters) == ["unset"]
        to_module(old, m)
        assert_same_state(m, before, in_any_order=True)
        orders[name] = [(row[0], row[1], row[2]) for row in state(m)]
    assert orders["fcall"] == orders["tensordict"]


def test_preserve_false_keeps_a_parameter_value_as_a_parameter():
    m = nn.Linear(2, 2)
    before = state(m)
    w = nn.Parameter(torch.zeros(2, 2))
    with fcall.to_module({"weight": w}, m, preserve_module_state=False):
        assert m._parameters["weight"] is w
    assert_same_state(m, before, in_any_order=True)


def test_inplace_copies_values_and_keeps_identity():
    m = Net()
    before = state(m)
    originals = fcall.from_module(m).detach().clone()
    new = zeros_like_params(m)
    old = fcall.to_module(new, m, inplace=True)
    assert_same_state(m, before)
    assert (m.lin.weight == 0).all() and (m.bn.running_var == 0).all()
    assert old["lin", "weight"] is not m.lin.weight
    torch.testing.assert_close(old["lin", "weight"], originals["lin", "weight"])
    assert not old["lin", "weight"].requires_grad
    fcall.to_module(old, m, inplace=True)
    assert_same_state(m, before)
    torch.testing.assert_close(fcall.from_module(m).detach(), originals)


@pytest.mark.parametrize("non_blocking", [False, True])
def test_inplace_context_manager_copies_back(non_blocking):
    m = nn.Linear(2, 2)
    before = state(m)
    weight = m.weight.detach().clone()
    with fcall.to_module({"weight": torch.zeros(2, 2)}, m, inplace=True, non_blocking=non_blocking):
        assert (m.weight == 0).all()
    assert_same_state(m, before, in_any_order=True)
    torch.testing.assert_close(m.weight.detach(), weight)


def test_inplace_broadcasts_like_copy():
    m = nn.Linear(2, 2)
    with fcall.to_module({"weight": torch.tensor(3.0)}, m, inplace=True):
        assert (m.weight == 3).all()


def test_inplace_then_backward_after_the_block_is_a_torch_limit():
    # The block copies the old values back into the very tensors forward saved:
    # autograd sees them modified in place. A documented torch limit.
    m = nn.Linear(2, 2)
    x = torch.ones(1, 2, requires_grad=True)  # forward saves the weight for x's grad
    with fcall.to_module({"weight": torch.zeros(2, 2)}, m, inplace=True):
        y = m(x).sum()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_gradients_reach_leaves_through_to_module():
    m = nn.Linear(2, 2)
    w = torch.randn(2, 2, requires_grad=True)
    pw = nn.Parameter(torch.randn(2))
    x = torch.randn(3, 2)
    with fcall.to_module({"weight": w, "bias": pw}, m):
        m(x).pow(2).sum().backward()
    expected_w, expected_b = torch.autograd.grad(
        torch.func.functional_call(m, {"weight": w, "bias": pw}, (x,)).pow(2).sum(), (w, pw)
    )
    torch.testing.assert_close(w.grad, expected_w)
    torch.testing.assert_close(pw.grad, expected_b)
    assert m.weight.grad is None


def test_batchnorm_running_stats_land_in_the_params():
    m = Net().train()
    before = state(m)
    params = fcall.from_module(m).detach().clone()
    mean = params["bn", "running_mean"]
    with fcall.to_module(params, m):
        m(torch.randn(8, 3) + 5)
    assert params["bn", "running_mean"] is mean
    assert (mean != 0).all()
    assert params["bn", "num_batches_tracked"] == 1
    assert (m.bn.running_mean == 0).all() and m.bn.num_batches_tracked == 0
    assert_same_state(m, before)


@pytest.mark.parametrize("container", ["tensordict", "dict"])
def test_a_buffer_reassigned_by_forward_is_written_back(container):
    m = Counter()
    before = state(m)
    params = fcall.from_module(m).detach().clone()
    if container == "dict":
        params = {"lin.weight": params["lin", "weight"], "count": params["count"]}
    reference = {"count": torch.zeros(())}
    torch.func.functional_call(m, reference, (torch.ones(2),))
    with fcall.to_module(params, m):
        m(torch.ones(2))
        m(torch.ones(2))
    assert params["count"] == 2
    assert reference["count"] == 1  # torch.func.functional_call writes back too
    assert_same_state(m, before, in_any_order=True)
    assert m.count == 0


def test_tied_weights_given_once_only_the_given_name_changes_as_tensordict():
    # tensordict's to_module writes the keys it is given; ties are torch.func's
    # (fcall.swap / fcall.functional_call, tie_weights=True)
    w = torch.zeros(5, 3)
    seen = []
    for to_module in (fcall.to_module, TensorDict.to_module):
        m = Tied()
        with to_module(TensorDict({"emb": {"weight": w}}), m):
            seen.append((m.head.weight is m.emb.weight, bool((m.head.weight == 0).all())))
        assert m.head.weight is m.emb.weight
    assert seen[0] == seen[1] == (False, False)


@pytest.mark.parametrize("prefix", ["", "_orig_mod."])
def test_compiled_module_keys_with_and_without_prefix(prefix):
    inner = nn.Linear(2, 2)
    m = torch.compile(inner, backend="eager")
    before = state(inner)
    weight = inner.weight
    with fcall.to_module({f"{prefix}weight": torch.zeros(2, 2)}, m) as old:
        assert (inner.weight == 0).all()
        assert old[tuple(f"{prefix}weight".split("."))] is weight
    assert_same_state(inner, before, in_any_order=True)


def test_from_module_of_a_compiled_module_round_trips():
    inner = nn.Linear(2, 2)
    m = torch.compile(inner, backend="eager")
    before = state(inner)
    params = fcall.from_module(m)
    assert ("_orig_mod", "weight") in params.keys(True, True)
    with fcall.to_module(params.detach().clone().zero_(), m):
        assert (inner.weight == 0).all()
    assert_same_state(inner, before)


class Hooked(nn.Module):
    """A module that renames a legacy key in a load_state_dict pre-hook."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.calls: list[str] = []
        self.lin.register_load_state_dict_pre_hook(self._public)
        self._register_load_state_dict_pre_hook(self._private)

    def _public(self, module, state_dict, prefix, *args):
        assert module is self.lin
        self.calls.append(f"public:{prefix}")

    def _private(self, state_dict, prefix, *args):
        self.calls.append(f"private:{prefix}")
        legacy = f"{prefix}lin.old_weight"
        if legacy in state_dict:
            state_dict[f"{prefix}lin.weight"] = state_dict.pop(legacy)

    def forward(self, x):
        return self.lin(x)


def test_use_state_dict_runs_the_pre_hooks_once_and_restores_without_them():
    m = Hooked()
    before = state(m)
    new = zeros_like_params(m)
    with fcall.to_module(new, m, use_state_dict=True):
        assert sorted(m.calls) == ["private:", "public:lin."]
        assert (m.lin.weight == 0).all()
        assert isinstance(m.lin.weight, nn.Parameter)
    assert sorted(m.calls) == ["private:", "public:lin."]
    assert_same_state(m, before)
    old = fcall.to_module(new, m, use_state_dict=True)
    fcall.to_module(old, m)
    assert len(m.calls) == 4
    assert_same_state(m, before)


def test_use_state_dict_hook_renames_a_legacy_key():
    m = Hooked()
    before = state(m)
    weight = m.lin.weight
    legacy = {"lin.old_weight": torch.zeros(2, 2), "lin.bias": torch.ones(2)}
    with fcall.to_module(legacy, m, use_state_dict=True) as old:
        assert (m.lin.weight == 0).all() and (m.lin.bias == 1).all()
        assert old["lin", "weight"] is weight
    assert_same_state(m, before, in_any_order=True)


def test_values_that_all_require_grad_go_in_as_they_are_and_none_is_kept():
    # slot_values.parameters_track_gradients: one pass over the parameter values; a None
    # value (a slot such as bias=None) sends the swap to the per-leaf loop
    m = nn.Linear(2, 2)
    m.register_parameter("extra", None)
    weight = torch.ones(2, 2, requires_grad=True)  # a plain tensor that tracks gradients
    for params in ({"weight": weight}, {"weight": weight, "extra": None}):
        before, original = state(m), m.weight
        with fcall.to_module(params, m) as old:
            assert m.weight is weight and m.extra is None
            assert old["weight"] is original
        assert_same_state(m, before, in_any_order=True)
    frozen = {"weight": torch.ones(2, 2), "bias": torch.zeros(2, requires_grad=True)}
    with fcall.to_module(frozen, m):
        assert isinstance(m.weight, nn.Parameter) and m.weight is not frozen["weight"]
        assert m.bias is frozen["bias"]
