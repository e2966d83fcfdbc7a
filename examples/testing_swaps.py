"""fcall.testing on a small model: a passing check, the ParityError of a set that would
recompile, a hypothesis test, and explain() on a compiled function of your own.

Run: python examples/testing_swaps.py (eager and aot_eager backends, a few seconds).
"""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import fcall
from fcall.testing import Failure, ParityError, check_swap_parity, explain
from fcall.testing.strategies import param_sets

BACKENDS = ["eager", "aot_eager"]  # add "inductor" where a C++ compiler is at hand


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU())
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x.to(self.head.weight.dtype)))


model = Net().train()  # train mode: BatchNorm's running stats are compared too
x = torch.randn(8, 16)

# 1. Three sets with the model's layout: one graph, no recompile, compiled == eager.
sets = [fcall.from_module(model).detach().clone() for _ in range(3)]
report = check_swap_parity(model, sets, x, backends=BACKENDS)
assert all(b.graphs == 1 and not b.recompiles for b in report.backends)

# 2. A set in another dtype recompiles: the error names the parameters.
sets[2] = sets[2].apply(lambda t: t.bfloat16() if t.is_floating_point() else t)
try:
    check_swap_parity(model, sets, x, backends=BACKENDS)
except ParityError as err:
    assert err.kind is Failure.RECOMPILE and err.set_index == 2
    assert "changed from param set 1: 8 params float32→bfloat16, first: `body.0.weight`" in str(err)
    message = str(err)
else:
    raise AssertionError("the bfloat16 set was not caught")


# 3. Any sets hypothesis draws in the model's layout pass; a perturbed one is caught.
@settings(max_examples=3, deadline=None, database=None)
@given(st.lists(param_sets(model, requires_grad=True), min_size=2, max_size=3))
def test_any_sets_compile_once(drawn):
    check_swap_parity(model, drawn, x, backends=["eager"])


@settings(max_examples=3, deadline=None, database=None)
@given(param_sets(model), param_sets(model, perturb="requires_grad"))
def test_a_requires_grad_flip_is_caught(first, second):
    try:
        check_swap_parity(model, [first, second], x, backends=["eager"])
    except ParityError as err:
        assert "requires_grad False→True" in str(err)
    else:
        raise AssertionError("the flipped set was not caught")


test_any_sets_compile_once()
test_a_requires_grad_flip_is_caught()


# 4. Why did my own compiled function recompile?
@torch.compile(backend="eager")
def step(params, x):
    with fcall.swap(params, model), torch.no_grad():
        return model(x)


online = fcall.from_module(model).detach().clone()
target = online.clone()
target["head", "bias"].requires_grad_()
why = explain(step, [online, online, target], x)
(recompile,) = why.recompiles
assert recompile.set_index == 2 and recompile.keys == ["head.bias"]

print("testing_swaps: one graph for 3 sets on", ", ".join(BACKENDS))
print(message)
print(why)
