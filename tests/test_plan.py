"""The cached swap plan notices every change of the module tree between swaps."""

from __future__ import annotations

import re

import pytest
import torch
from tensordict import TensorDict
from torch import nn

import fcall
from fcall._core import plan as _plan
from fcall._core.flatten import OldValues
from tests.support import (
    flat,
)


def _params(module: nn.Module, fill: float) -> TensorDict:
    return fcall.from_module(module).detach().clone().apply(lambda t: t.fill_(fill))


def _cached_plans(module: nn.Module) -> dict:
    return {i: c.plan for i, c in enumerate(_plan.cached(module))}


def test_a_plan_is_cached_per_key_structure_and_reused():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    with fcall.swap(_params(model, 1.0), model):
        pass
    (plan,) = _cached_plans(model).values()
    with fcall.swap(_params(model, 2.0), model):
        pass
    assert list(_cached_plans(model).values()) == [plan]
    with fcall.swap({"0.weight": torch.zeros(2, 2)}, model):
        pass
    assert len(_cached_plans(model)) == 2


def test_replaced_submodule_gets_the_swap():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    params = _params(model, 1.0)
    with fcall.swap(params, model):
        pass
    model[1] = nn.Linear(2, 2)  # the cached plan points at the old submodule
    with fcall.swap(params, model):
        assert model[1].weight is params["1", "weight"]
    assert model[1].weight is not params["1", "weight"]


def test_deleted_parameter_is_an_error_not_a_silent_reinsert():
    model = nn.Sequential(nn.Linear(2, 2))
    params = _params(model, 1.0)
    with fcall.swap(params, model):
        pass
    del model[0].bias
    model[0].register_parameter("scale", nn.Parameter(torch.ones(2)))
    with pytest.raises(KeyError, match=re.escape("'0.bias' names no parameter or buffer")):
        with fcall.swap(params, model):
            pass
    assert "bias" not in model[0]._parameters


def test_buffer_turned_into_parameter_stays_a_parameter():
    model = nn.BatchNorm1d(2)
    params = _params(model, 1.0).exclude("num_batches_tracked")
    with fcall.swap(params, model):
        pass
    mean = model.running_mean
    del model._buffers["running_mean"]
    model.running_mean = nn.Parameter(mean.clone())
    with fcall.swap(params, model):
        assert model._parameters["running_mean"] is params["running_mean"]
    assert isinstance(model.running_mean, nn.Parameter)
    assert "running_mean" not in model._buffers


class _TwoParametersAndABuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Parameter(torch.zeros(2))
        self.moved = nn.Parameter(torch.zeros(2))
        self.register_buffer("other", torch.zeros(2))


def _trade_places(module: nn.Module) -> None:
    """``moved`` becomes a buffer and ``other`` a parameter: no dict changes size."""
    moved, other = module._parameters.pop("moved"), module._buffers.pop("other")
    module._buffers["moved"] = moved.detach()
    module._parameters["other"] = nn.Parameter(other)


@pytest.mark.parametrize(
    "swap_in",
    [
        lambda params, module: fcall.swap(params, module),
        lambda params, module: fcall.to_module(params, module),
        lambda params, module: fcall.to_module(params, module, inplace=True),
    ],
    ids=["swap", "to_module", "to_module-inplace"],
)
def test_names_that_trade_dicts_get_a_new_plan(swap_in):
    module = _TwoParametersAndABuffer()
    params = _params(module, 1.0).apply(nn.Parameter)
    with swap_in(params, module):
        pass
    (stale,) = _cached_plans(module).values()
    _trade_places(module)
    first, moved, other = module.first, module.moved, module.other
    with swap_in(params, module):
        # the stale plan wrote "first" before it met "moved" in the wrong dict:
        # that write was undone, and the whole swap made again with a new plan
        assert [bool((module.get_parameter(n) == 1).all()) for n in ("first", "other")] == [1, 1]
        assert bool((module.get_buffer("moved") == 1).all())
        assert "moved" in module._buffers and "other" in module._parameters
    assert all(
        now is then
        for now, then in zip([module.first, module.moved, module.other], [first, moved, other])
    )
    assert stale not in _cached_plans(module).values()


def test_registered_parameter_is_seen_by_strict():
    model = nn.Linear(2, 2)
    params = _params(model, 1.0)
    with fcall.swap(params, model, strict=True):
        pass
    model.register_buffer("extra", torch.zeros(1))
    with pytest.raises(RuntimeError, match=re.escape("params has no value for 1 key(s)")):
        with fcall.swap(params, model, strict=True):
            pass


def test_a_buffer_registered_beside_parameters_only_keeps_the_plan():
    # Staleness counts the buffers of the modules that own a buffer entry, and of every
    # module for strict=True (above); a new buffer beside given parameters changes no slot
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    params = _params(model, 1.0).exclude(("1", "num_batches_tracked"))
    with fcall.swap(params, model):
        pass
    (plan,) = _cached_plans(model).values()
    model[0].register_buffer("extra", torch.zeros(1))
    with fcall.swap(params, model):
        assert model[0].weight is params["0", "weight"]
        assert model[1].running_mean is params["1", "running_mean"]
    assert list(_cached_plans(model).values()) == [plan]
    model[1].register_buffer("extra", torch.zeros(1))  # beside a buffer entry: a new plan
    with fcall.swap(params, model):
        assert model[1].running_var is params["1", "running_var"]
    assert plan not in _cached_plans(model).values()
    assert model[0].extra.shape == model[1].extra.shape == (1,)


def test_untied_weights_no_longer_follow_each_other():
    model = nn.Sequential(nn.Embedding(3, 2), nn.Linear(2, 3, bias=False))
    model[1].weight = model[0].weight
    new = {"0.weight": torch.ones(3, 2)}
    with fcall.swap(new, model):
        assert model[1].weight is new["0.weight"]
    model[1].weight = nn.Parameter(torch.zeros(3, 2))  # untie
    with fcall.swap(new, model):
        assert model[1].weight is not new["0.weight"]


def test_same_slot_given_twice_is_refused():
    model = nn.Sequential(nn.Linear(2, 2))
    params = {"0.weight": torch.ones(2, 2), "0": {"weight": torch.zeros(2, 2)}}
    with pytest.raises(KeyError, match=re.escape("params gives '0.weight' more than once")):
        fcall.to_module(params, model)


def test_old_values_build_their_nodes_on_first_read():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    before = fcall.from_module(model)
    old = fcall.to_module(_params(model, 0.0), model)
    assert isinstance(old, TensorDict) and type(old) is OldValues
    assert "_entries" not in old.__dict__  # nothing built yet
    assert old["1", "bias"] is before["1", "bias"]
    assert type(old["1"]) is TensorDict
    assert old.clone()["0", "weight"].equal(before["0", "weight"])
    with old:  # restores the module
        pass
    assert model[0].weight is before["0", "weight"]


@pytest.mark.parametrize("params", ["TensorDict", "flat dict"])
def test_unread_old_values_swap_back_without_building_their_nodes(params):
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    before = fcall.from_module(model)
    new = _params(model, 0.0)
    new = new if params == "TensorDict" else flat(new)
    old = fcall.to_module(new, model)
    again = fcall.to_module(old, model)  # the spec's pattern: puts everything back
    assert "_entries" not in old.__dict__  # swapped back from the pending values
    assert model[0].weight is before["0", "weight"] and model[1].bias is before["1", "bias"]
    assert again["0", "weight"].eq(0).all()  # what the module held: the swapped-in zeros
    # Unread old values into another module of the same structure: no cached plan there.
    other = fcall.to_module(new, model)
    twin = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    fcall.to_module(other, twin)
    assert twin[0].weight is before["0", "weight"] and twin[1].bias is before["1", "bias"]


@pytest.mark.parametrize("make", [lambda: nn.Sequential(nn.Linear(2, 2)), lambda: nn.GRU(2, 2)])
def test_a_cached_plan_does_not_keep_its_module_alive(make):
    import gc
    import weakref

    model = make()
    alive, key = weakref.ref(model), id(model)
    with fcall.swap(_params(model, 1.0), model):
        pass
    fcall.to_module(fcall.to_module(_params(model, 2.0), model), model)
    assert key in _plan._CACHE
    del model
    gc.collect()
    assert alive() is None
    assert key not in _plan._CACHE  # the cache entry went with its module


def test_key_structures_that_differ_only_in_nesting_get_their_own_plans():
    model = nn.Module()
    model.a = nn.Module()
    model.a.register_parameter("b", nn.Parameter(torch.zeros(1)))
    model.b = nn.Module()
    model.b.register_parameter("y", nn.Parameter(torch.zeros(1)))
    fits = TensorDict({"a": {"b": torch.ones(1)}, "b": {"y": torch.ones(1)}})
    with fcall.swap(fits, model):
        pass
    # the same names in the same order, nested differently: a.b.y and b name nothing
    other = TensorDict({"a": {"b": {"y": torch.ones(1)}}, "b": torch.ones(1)})
    with pytest.raises(KeyError, match=re.escape("'a.b.y' names no parameter or buffer")):
        with fcall.swap(other, model):
            pass
    assert model.a.b.item() == 0 and model.b.y.item() == 0


def _registering_elsewhere() -> dict:
    """What other code does between swaps that registers parameters or modules."""
    other = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    values = fcall.from_module(other).detach().clone()
    return {
        "building a module": lambda: nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)),
        "a TensorDictParams": lambda: fcall.from_module(other, as_module=True),
        "tensordict's to_module": lambda: values.to_module(other).to_module(other),
        "a new Parameter in a slot": lambda: setattr(
            other[0], "weight", nn.Parameter(values["0", "weight"])
        ),
    }


@pytest.mark.parametrize("elsewhere", list(_registering_elsewhere()))
def test_registrations_that_tie_nothing_keep_the_plans_current(elsewhere):
    # Only a registration that may tie counts (fcall/_core/plan.py, TieWatch): the rest of
    # the program building modules, or tensordict swapping another model, leaves this plan current.
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    with fcall.swap(_params(model, 1.0), model):
        pass
    (cached,) = _plan.cached(model)
    action = _registering_elsewhere()[elsewhere]
    for fill in (2.0, 3.0):
        action()
        assert cached.staleness.holds()
        with fcall.swap(_params(model, fill), model):
            assert (model[1].weight == fill).all()
    assert _plan.cached(model) == [cached]


def test_a_tie_into_modules_built_before_import_fcall_is_seen_and_so_is_a_re_tie():
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import torch
        from torch import nn
        m = nn.ModuleDict({"emb": nn.Embedding(5, 3), "head": nn.Linear(3, 5, bias=False)})
        import fcall  # after the model: its registrations were never seen
        w = torch.randn(5, 3)
        def head_follows():
            with fcall.swap({"emb.weight": w}, m):
                return m["head"].weight is w
        assert not head_follows()  # a plan of the untied model
        m["head"].weight = m["emb"].weight
        assert head_follows()  # the tie is seen
        m["head"].weight = nn.Parameter(torch.randn(5, 3))
        assert not head_follows()
        m["head"].weight = m["emb"].weight  # tied again: seen again
        assert head_follows()
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
