"""The plan built while Dynamo traces (one walk over params and module together,
``fcall/_build.py``'s traced front) equals the plan of its key front, or defers to it.

The walk does not depend on Dynamo, so it is compared with the generic build in
eager; compile_tests/ check what it does under ``torch.compile``.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torch import nn

import fcall
from fcall import _flatten, _plan
from fcall._build import build, plan_while_tracing
from tests.support import Net, Tied, flat


def _summary(plan: _plan.Plan) -> tuple:
    entries = [(id(slot), name, index, kind) for slot, name, index, _, kind in plan.entries]
    root_dicts = None if plan.root_dicts is None else [id(d) for d in plan.root_dicts]
    chain = [(id(modules), name, id(child)) for modules, name, child in plan.chain]
    return entries, plan.names, plan.given, plan.tie_sources, plan.has_attributes, root_dicts, chain


def _generic(params, module, tie_weights=True, strict=False):
    leaves = _flatten.flatten(params, "t")
    plan = build(module, leaves.keys, "t", tie_weights=tie_weights, strict=strict)
    return plan, leaves


class WithAttribute(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.scale = torch.ones(2)  # a plain tensor attribute


def _cases():
    net = Net()
    tied = Tied()
    rnn = nn.Sequential(nn.GRU(2, 3), nn.Linear(3, 1))
    attr = WithAttribute()
    td = fcall.from_module(net)
    root_and_nested = {"offset": torch.ones(4), "lin.bias": torch.ones(4)}
    flat_with_attribute = {"lin.weight": torch.ones(2, 2), "scale": torch.ones(2)}
    return [
        ("TensorDict", td, net),
        ("nested dict", td.to_dict(), net),
        ("partial", TensorDict({"lin": {"weight": torch.ones(4, 3)}}), net),
        ("dict holding a TensorDict", {"lin": td["lin"], "bn": td["bn"].to_dict()}, net),
        ("TensorDictParams", fcall.TensorDictParams(td.detach().clone()), net),
        ("tied, one name given", TensorDict({"emb": {"weight": torch.ones(5, 3)}}), tied),
        ("tied, both given", fcall.from_module(tied), tied),
        ("RNN", fcall.from_module(rnn), rnn),
        ("plain attribute", {"lin": {"weight": torch.ones(2, 2)}, "scale": torch.ones(2)}, attr),
        ("flat dict", flat(td), net),
        ("flat dict, keys out of order", dict(reversed(flat(td).items())), net),
        ("flat dict, root and nested keys", root_and_nested, net),
        ("flat dict, tied, both given", flat(fcall.from_module(tied)), tied),
        ("flat dict, RNN", flat(fcall.from_module(rnn)), rnn),
        ("flat dict, plain attribute", flat_with_attribute, attr),
        ("flat dict, deep", flat(fcall.from_module(nn.Sequential(nn.Sequential(net)))), None),
    ]


@pytest.mark.parametrize("case", _cases(), ids=lambda case: case[0])
@pytest.mark.parametrize("tie_weights", [True, False])
def test_the_traced_walk_builds_the_generic_plan(case, tie_weights):
    _, params, module = case
    if module is None:  # the deep case: the module is the one its params came from
        module = nn.Sequential(nn.Sequential(Net()))
        params = flat(fcall.from_module(module))
    traced = plan_while_tracing(params, module, "t", tie_weights=tie_weights, strict=False)
    assert traced is not None, "the walk deferred to the generic path"
    plan, leaves = traced
    generic, generic_leaves = _generic(params, module, tie_weights=tie_weights)
    assert _summary(plan) == _summary(generic)
    assert [id(v) for v in leaves.values] == [id(v) for v in generic_leaves.values]
    assert [r() for r in plan.rnns] == [r() for r in generic.rnns]
    assert plan.names_are_keys and not generic.names_are_keys
    assert plan.names[: plan.given] == [".".join(key) for key in generic_leaves.keys]


@pytest.mark.parametrize(
    "params",
    [
        {"lin": {"bn.weight": torch.ones(4, 3)}},  # dotted key in a node: the generic path
        {"_orig_mod": {"lin": {"weight": torch.ones(4, 3)}}},  # a torch.compile prefix
        {"_orig_mod.lin.weight": torch.ones(4, 3)},
        {"lin": {"wieght": torch.ones(4, 3)}},  # unknown: the generic path raises
        {"lin.wieght": torch.ones(4, 3)},
        {"lin": {"weight": "not a tensor"}},
        {"lin.weight": "not a tensor"},
        {"lin.weight": {"x": torch.ones(1)}},
        TensorDict({"nope": {"weight": torch.ones(4, 3)}}),
        {"nope.weight": torch.ones(4, 3)},
        {"lin..weight": torch.ones(4, 3)},
        {"lin": torch.ones(4, 3)},  # a module's name for a tensor
        {"lin.weight": torch.ones(4, 3), 0: torch.ones(1)},
    ],
    ids=[
        "dotted-in-node",
        "prefix",
        "flat-prefix",
        "unknown",
        "flat-unknown",
        "not-a-tensor",
        "flat-not-a-tensor",
        "flat-node-value",
        "unknown-submodule",
        "flat-unknown-submodule",
        "flat-empty-name",
        "module-name",
        "flat-non-string-key",
    ],
)
def test_the_traced_walk_defers_what_it_does_not_handle(params):
    assert plan_while_tracing(params, Net(), "t", tie_weights=True, strict=False) is None


def test_strict_misses_raise_the_generic_message_from_the_walk():
    net = Net()
    partial = TensorDict({"lin": {"weight": torch.ones(4, 3)}})
    with pytest.raises(RuntimeError) as walked:
        plan_while_tracing(partial, net, "t", tie_weights=True, strict=True)
    with pytest.raises(RuntimeError) as generic:
        _generic(partial, net, strict=True)
    assert str(walked.value) == str(generic.value)


def test_old_values_of_a_walked_plan_have_the_params_keys():
    net = Net()
    params = fcall.from_module(net).detach().clone()
    plan, leaves = plan_while_tracing(params, net, "t", tie_weights=True, strict=False)
    old = _flatten.old_values(None, plan.names[: plan.given], leaves.values)
    assert flat(old).keys() == flat(params).keys()
    assert all(old[k] is params[k] for k in params.keys(True, True))
