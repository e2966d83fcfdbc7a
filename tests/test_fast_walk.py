"""The eager fast walk (``_flatten.flatten_eager``) takes nested dicts and TensorDictParams
as well as exact TensorDicts: the same values in the same order, one signature (so one
plan) per key structure whatever the container, and the generic walk for what it cannot
read (dotted names, names that are not strings)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fcall
from fcall._core import flatten as _flatten
from tests.support import assert_same_state, state


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(2, 3), nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2)))


def test_nested_dict_and_tensordictparams_read_as_the_tensordict_does():
    td = fcall.from_module(model()).detach().clone()
    reference = _flatten.flatten_eager(td)
    nested = td.to_dict()
    params = fcall.TensorDictParams(td.clone())
    for container in (nested, params):
        leaves = _flatten.flatten_eager(container)
        assert leaves.signature == reference.signature
        assert leaves.keys == reference.keys == _flatten.flatten_generic(container).keys
    assert all(a is b for a, b in zip(_flatten.flatten_eager(nested).values, reference.values))
    expected = list(params._param_td.values(True, True))
    assert all(a is b for a, b in zip(_flatten.flatten_eager(params).values, expected))


@pytest.mark.parametrize(
    "params",
    [
        {("1", "0"): {"weight": torch.ones(2, 3)}},
        {"0": {"weight": None}},
        {"0.weight": torch.ones(3, 2), "1": {"weight": torch.ones(3)}},
        {"0.weight": None},
    ],
    ids=["tuple name", "None value", "dotted root over a node", "dotted root, None value"],
)
def test_dicts_the_fast_walk_cannot_read_take_the_generic_walk(params):
    leaves = _flatten.flatten_eager(params)
    generic = _flatten.flatten_generic(params)
    assert leaves.signature == generic.signature == tuple(generic.keys)
    assert leaves.values == generic.values


def test_a_flat_dict_of_tensors_is_signed_by_its_names_and_split_only_for_a_plan():
    # torch.func's form: no key tuple per leaf per swap; a structure of its own
    w, b = torch.ones(2, 3), nn.Parameter(torch.ones(2))
    params = {"1.0.weight": w, "1.bias": b}
    leaves = _flatten.flatten_eager(params)
    assert leaves.signature == ("1.0.weight", "1.bias")
    assert (
        leaves.signature != _flatten.flatten_eager({"1": {"0": {"weight": w}, "bias": b}}).signature
    )
    assert leaves.values == [w, b]
    assert (
        leaves.keys
        == _flatten.flatten_generic(params).keys
        == [("1", "0", "weight"), ("1", "bias")]
    )


def test_a_dotted_name_below_the_root_keeps_the_fast_walk_and_the_generic_keys():
    # The signature holds "0.weight" as one name (a structure of its own); the keys a
    # plan is built from are the generic walk's, split, in the order of the values.
    w, b = torch.ones(2, 3), torch.ones(2)
    params = {"1": {"0.weight": w, "bias": b}}
    leaves = _flatten.flatten_eager(params)
    generic = _flatten.flatten_generic(params)
    assert leaves.signature != generic.signature
    assert leaves.signature != _flatten.flatten_eager({"1": {"0": {"weight": w}}}).signature
    assert leaves.keys == generic.keys == [("1", "0", "weight"), ("1", "bias")]
    assert leaves.values == generic.values == [w, b]


def test_one_module_swapped_with_each_container_in_turn():
    m = model()
    before = state(m)
    td = fcall.from_module(m).detach().clone().apply(lambda t: t + 1)
    x = torch.randn(4, 2)
    expected = torch.func.functional_call(m, dict(td.flatten_keys(".").items()), (x,))
    containers = [td, td.to_dict(), fcall.TensorDictParams(td.clone()), td.to_dict()]
    for _ in range(3):
        for params in containers:
            with fcall.swap(params, m):
                torch.testing.assert_close(m(x), expected)
            assert_same_state(m, before)
            with fcall.to_module(params, m):
                assert isinstance(m[0].weight, nn.Parameter)
                torch.testing.assert_close(m(x), expected)
            assert_same_state(m, before)
            torch.testing.assert_close(fcall.functional_call(m, params, (x,)), expected)
            assert_same_state(m, before)
