"""A plan's layout (``types.PlanLayout``, the one builder's) is names and indexes, of no
instance, for every case the builder covers; bound to a module (``bind.reach`` and
``bind.bind``, the same code in eager and in the trace) it puts each entry in its slot, and
binds to another instance of the same architecture as well."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from fcall._core.bind import bind, reach
from fcall._core.build import build
from fcall._core.types import PlanLayout, SlotKind
from tests.support import Net, Tied


class WithAttribute(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.scale = torch.ones(2)  # a plain tensor attribute


class WithLSTM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(2, 3)
        self.head = nn.Linear(3, 1)


def _shared() -> nn.Module:
    block = nn.Linear(2, 2)
    return nn.Sequential(block, block)  # one submodule at two paths


CASES = {
    "parameters and a buffer": (Net, ["lin.weight", "lin.bias", "bn.running_mean", "offset"]),
    "a tie": (Tied, ["emb.weight"]),
    "a plain tensor attribute": (WithAttribute, ["lin.weight", "scale"]),
    "an RNN owner": (WithLSTM, ["rnn.weight_ih_l0", "head.weight"]),
    "a submodule at two paths": (_shared, ["0.weight", "1.weight"]),
}


def _names_and_indexes(value: Any) -> bool:
    if isinstance(value, tuple):  # the NamedTuples too
        return all(map(_names_and_indexes, value))
    return type(value) in (int, str, bool)


def _layout(case: str) -> tuple[nn.Module, PlanLayout]:
    make, names = CASES[case]
    module = make()
    keys = [tuple(name.split(".")) for name in names]
    return module, build(module, keys, tie_weights=True, strict=False)


def _slot_of(module: nn.Module, dotted: str, kind: SlotKind) -> dict:
    prefix, _, _ = dotted.rpartition(".")
    owner = module.get_submodule(prefix)
    if kind is SlotKind.PARAMETER:
        return owner._parameters
    return owner._buffers if kind is SlotKind.BUFFER else owner.__dict__


@pytest.mark.parametrize("case", CASES)
def test_a_layout_is_names_and_indexes(case):
    _, layout = _layout(case)
    assert _names_and_indexes(layout), layout
    hash(layout)  # all constants: Dynamo can hold it as one


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("traced", [False, True])
def test_a_bound_layout_puts_each_entry_in_its_slot_on_any_instance(case, traced):
    module, layout = _layout(case)
    other = CASES[case][0]()  # another instance of the architecture: the same layout binds
    for target in (module, other):
        plan = bind(layout, *reach(layout, target), traced)
        assert len(plan.slots) == len(layout.slot_names)
        for slot, name, dotted, kind in zip(plan.slots, plan.slot_names, plan.names, plan.kinds):
            assert slot is _slot_of(target, dotted, kind), dotted
            assert name == dotted.rpartition(".")[2]
        assert plan.owners_are_modules is traced


def test_the_layout_names_ties_rnns_and_repeated_slots_by_index():
    _, tied = _layout("a tie")
    assert [[tied.names[i] for i in group] for group in tied.tie_groups] == [
        ["emb.weight", "head.weight"]
    ]
    module, rnn = _layout("an RNN owner")
    plan = bind(rnn, *reach(rnn, module), False)
    assert [ref() for ref in plan.rnns] == [module.rnn]
    _, shared = _layout("a submodule at two paths")
    assert (shared.repeated, shared.repeated_first) == ((1,), (0,))
    _, attribute = _layout("a plain tensor attribute")
    assert attribute.has_attributes and len(attribute.attribute_owners) == 1
