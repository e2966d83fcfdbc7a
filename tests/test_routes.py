"""A Route (``fcall/_core/routes.py``) puts every value where the one builder's plan does, or
declines with its reason (``Generic``), and then the generic path decides (and raises).

A Route is built at trace time from the real module, and its reads and writes go through
builtins that run the same in eager: here both run in eager, and the slots a Route reaches
are compared with the generic plan's. compile_tests/ check it under ``torch.compile``.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torch import nn

import fcall
from fcall._core import flatten as _flatten
from fcall._core import traced as _traced
from fcall._core.bind import bind, pick, reach
from fcall._core.build import build
from fcall._core.routes import Generic, route_of_dict, route_of_tensordict
from fcall._core.tree import unwrap
from fcall._core.types import DictLevel, attributes_of
from tests.support import Net, Tied, flat


def _generic(params, module, tie_weights=True):
    leaves = _flatten.flatten(params)
    layout = build(module, leaves.keys, tie_weights=tie_weights, strict=False)
    return bind(layout, *reach(layout, unwrap(module)[0]), False), leaves


def _routed(params, module, tie_weights=True):
    """The Route of ``params`` in ``module`` run in eager: (slot, name, value) per entry; or
    the reason it declines."""
    if isinstance(params, dict):
        shape, level_values = _traced._dict_shape(params, ordered=False)
        route = route_of_dict([DictLevel(*level) for level in shape], module, tie_weights)
        if isinstance(route, Generic):
            return route
        values = pick(level_values, route.leaf_nodes)
    else:
        route = route_of_tensordict(params, module, tie_weights)
        if isinstance(route, Generic):
            return route
        values = _traced._tensordict_values(params, route)
    _, dicts = reach(route.layout, unwrap(module)[0])
    slots = pick(dicts, route.layout.slots)
    return route, [(id(slot), name) for slot, name in zip(slots, route.layout.slot_names)], values


class WithAttribute(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.scale = torch.ones(2)  # a plain tensor attribute


def _cases():
    net = Net()
    td = fcall.from_module(net)
    deep = nn.Sequential(nn.Sequential(Net()))
    rnn = nn.Sequential(nn.GRU(2, 3))
    return [
        ("TensorDict", td, net),
        ("nested dict", td.to_dict(), net),
        ("partial", TensorDict({"lin": {"weight": torch.ones(4, 3)}}), net),
        ("TensorDictParams", fcall.TensorDictParams(td.detach().clone()), net),
        ("flat dict", flat(td), net),
        ("flat dict, keys out of order", dict(reversed(flat(td).items())), net),
        (
            "flat dict, root and nested keys",
            {"offset": torch.ones(4), "lin.bias": torch.ones(4)},
            net,
        ),
        (
            "dict with dotted and nested keys",
            {"lin": {"bias": torch.ones(4)}, "bn.weight": torch.ones(4)},
            net,
        ),
        ("flat dict, deep", flat(fcall.from_module(deep)), deep),
        ("an RNN", flat(fcall.from_module(rnn)), rnn),
        ("a compiled module", flat(td), torch.compile(net)),
    ]


@pytest.mark.parametrize("case", _cases(), ids=lambda case: case[0])
@pytest.mark.parametrize("tie_weights", [True, False])
def test_a_route_reaches_the_generic_plans_slots(case, tie_weights):
    _, params, module = case
    routed = _routed(params, module, tie_weights)
    assert not isinstance(routed, Generic), f"the Route declined: {routed}"
    route, slots, values = routed
    plan, leaves = _generic(params, module, tie_weights)
    assert slots == [(id(slot), name) for slot, name in zip(plan.slots, plan.slot_names)]
    assert [id(v) for v in values] == [id(leaves.values[leaf]) for leaf in plan.leaves]
    assert list(route.dotted) == [".".join(key) for key in leaves.keys]


def _columns(plan, values):
    """A plan's entries as rows: the slot, the name, the value, the kind, the owner's dict."""
    return [
        (id(slot), name, id(values[leaf]), kind, id(attributes_of(plan, index)))
        for index, (slot, name, leaf, kind) in enumerate(
            zip(plan.slots, plan.slot_names, plan.leaves, plan.kinds)
        )
    ]


@pytest.mark.parametrize("case", _cases(), ids=lambda case: case[0])
def test_a_routes_plan_is_the_generic_plan_bound_by_descent(case):
    """The plan a Route binds in the trace (``bind.bind``) has the generic plan's columns:
    each entry's slot, name, value, kind and owner's ``__dict__`` (read from the owner
    modules, where the generic plan keeps the dicts)."""
    _, params, module = case
    route, _, values = _routed(params, module, tie_weights=False)
    plan = bind(route.layout, *reach(route.layout, unwrap(module)[0]), True)
    assert plan.owners_are_modules
    generic, leaves = _generic(params, module, tie_weights=False)
    assert not generic.owners_are_modules
    assert _columns(plan, values) == _columns(generic, leaves.values)


@pytest.mark.parametrize(
    ("params", "module", "reason"),
    [
        (TensorDict({"emb": {"weight": torch.ones(5, 3)}}), Tied(), Generic.TIED),
        (
            {"emb.weight": torch.ones(5, 3), "head.weight": torch.ones(5, 3)},
            Tied(),
            Generic.TIED,
        ),
        (
            {"lin.weight": torch.ones(2, 2), "scale": torch.ones(2)},
            WithAttribute(),
            Generic.ATTRIBUTE,
        ),
        # unknown: the generic path raises
        ({"lin": {"wieght": torch.ones(4, 3)}}, Net(), Generic.BUILDER_RAISED),
        ({"lin.wieght": torch.ones(4, 3)}, Net(), Generic.BUILDER_RAISED),
        ({"lin": {"weight": "not a tensor"}}, Net(), Generic.NOT_TENSORS),
        ({"lin.weight": None}, Net(), Generic.NOT_TENSORS),
        ({"lin..weight": torch.ones(4, 3)}, Net(), Generic.BUILDER_RAISED),
        # a module's name for a tensor
        ({"lin": torch.ones(4, 3)}, Net(), Generic.BUILDER_RAISED),
        ({"lin.weight": torch.ones(4, 3), 0: torch.ones(1)}, Net(), Generic.KEY_FORM),
        ({}, Net(), Generic.NO_KEYS),
        # a dotted TensorDict key
        (TensorDict({"lin": {"bn.weight": torch.ones(4, 3)}}), Net(), Generic.KEY_FORM),
    ],
    ids=[
        "tied-given",
        "tied-both-given",
        "plain-attribute",
        "unknown",
        "flat-unknown",
        "not-a-tensor",
        "none-value",
        "empty-name",
        "module-name",
        "non-string-key",
        "empty",
        "dotted-tensordict-key",
    ],
)
def test_a_route_declines_what_the_generic_path_decides(params, module, reason):
    assert _routed(params, module) is reason


def test_a_shared_submodule_takes_the_generic_path():
    shared = nn.Linear(2, 2)
    module = nn.Sequential(shared, shared)
    routed = _routed(flat(fcall.from_module(module)), module, tie_weights=False)
    assert routed is Generic.REPEATED


def test_preserve_wraps_plain_values_and_keeps_parameters_with_the_slots_requires_grad():
    net = Net()
    net.lin.bias.requires_grad_(False)
    params = TensorDict(
        {
            "lin": {"weight": torch.ones(4, 3), "bias": nn.Parameter(torch.ones(4))},
            "bn": {"weight": torch.ones(4, requires_grad=True), "running_mean": torch.ones(4)},
        }
    )
    route = route_of_tensordict(params, net, False, preserve=True)
    rule = route.preserve
    names = list(route.dotted)
    assert [names[i] for i in rule.wrap] == ["lin.weight", "lin.bias"]  # lin.bias: its flag
    assert rule.wrap_requires_grad == (True, False)
    assert rule.kept == ()  # bn.weight tracks gradients: in as it is; running_mean: a buffer
    assert rule.order == (4, 5, 2, 3)


def test_preserve_declines_a_parameter_for_a_buffer():
    net = Net()
    params = TensorDict({"offset": nn.Parameter(torch.ones(4))})
    assert route_of_tensordict(params, net, False) is not Generic.PARAMETER_FOR_BUFFER
    found = route_of_tensordict(params, net, False, preserve=True)
    assert found is Generic.PARAMETER_FOR_BUFFER
