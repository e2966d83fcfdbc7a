"""Compiled ``to_module(preserve_module_state=True)`` with plain tensors.

Inside the compiled block the parameter slots hold Parameters with the old
``requires_grad``, one graph serves new values, and the module is restored exactly. What
that costs per call is Dynamo's: ``nn.Parameter(t)`` on a graph input is traced by building
the Parameter in Python *before the graph*, on every call, and passing both ``t`` and the
Parameter into the graph (``torch/_dynamo/variables/torch.py``,
``_nn_param_via_prefix_insert``). The last test pins that mechanism: the per-call cost of
this cell in ``benchmarks/matrix.py`` is one ``nn.Parameter`` per leaf, and if a torch
release changes how it is traced, the test says so.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

import fcall
from tests.support import assert_same_state, state


class Flags(nn.Module):
    """Encodes in its output what code inside the block observes of its parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.lin.bias.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = self.lin.weight, self.lin.bias
        code = 1 * isinstance(w, nn.Parameter) + 2 * w.requires_grad
        code += 4 * isinstance(b, nn.Parameter) + 8 * b.requires_grad
        return self.lin(x) * 0 + code


class GradSeen(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * 0 + (self.lin.weight.grad is None)


def plain(m: nn.Module) -> dict[str, torch.Tensor]:
    return {name: torch.randn_like(t) for name, t in m.named_parameters()}


def test_parameters_with_the_old_requires_grad_inside_one_graph(counter):
    m = Flags()
    before = state(m)

    def f(x, p):
        with fcall.to_module(p, m):
            return m(x)

    cnt = counter("aot_eager")
    fn = torch.compile(f, backend=cnt, fullgraph=True)
    x = torch.randn(4, 3)
    for call in range(3):
        with torch.compiler.set_stance("fail_on_recompile" if call else "default"):
            out = fn(x, plain(m))
        assert (out == 1 + 2 + 4).all()  # Parameters; weight trains, bias does not
        assert_same_state(m, before)
    assert cnt.frame_count == 1


@pytest.mark.xfail(
    strict=True,
    reason="torch 2.13 Dynamo bug: inside a compiled region, `nn.Parameter(graph_input).grad "
    "is None` is False (eager: True), so code in a compiled to_module block with plain values "
    "sees a fresh Parameter's .grad as set; the same check on a Parameter passed in is right",
)
def test_a_fresh_parameters_grad_is_none_inside_the_compiled_block(counter):
    m = GradSeen()

    def f(x, p):
        with fcall.to_module(p, m):
            return m(x)

    x = torch.randn(1, 3)
    assert (f(x, plain(m)) == 1).all()  # eager
    parameters = {k: nn.Parameter(v) for k, v in plain(m).items()}
    assert (torch.compile(f, backend=counter("eager"), fullgraph=True)(x, parameters) == 1).all()
    torch._dynamo.reset()
    cnt = counter("eager")
    assert (torch.compile(f, backend=cnt, fullgraph=True)(x, plain(m)) == 1).all()


def test_dynamo_builds_each_parameter_before_the_graph_on_every_call(counter):
    m = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2))
    leaves = 4

    def plain_values(x, p):
        with fcall.to_module(p, m):
            return m(x)

    def parameter_values(x, p):
        with fcall.to_module(p, m):
            return m(x)

    inputs = {}
    for fn, values in [
        (plain_values, plain(m)),
        (parameter_values, {k: nn.Parameter(v) for k, v in plain(m).items()}),
    ]:
        cnt = counter("eager")
        torch.compile(fn, backend=cnt, fullgraph=True)(torch.randn(1, 3), values)
        assert cnt.frame_count == 1
        (graph,) = cnt.graphs
        inputs[fn.__name__] = sum(node.op == "placeholder" for node in graph.graph.nodes)
        (entry,) = _debug_get_cache_entry_list(fn.__code__)
        inputs[fn.__name__ + " builds Parameters"] = "Parameter" in entry.code.co_names
    assert inputs == {
        # x and each Parameter made of a value (the value is read to make it before the
        # graph, guarded, and not itself an input of the graph)
        "plain_values": 1 + leaves,
        "plain_values builds Parameters": True,
        "parameter_values": 1 + leaves,
        "parameter_values builds Parameters": False,
    }


def test_each_parameter_is_made_before_the_modules_dicts_are_read(counter, monkeypatch):
    # Dynamo's nn.Parameter(graph_input) scans every guard made so far
    # (remove_guards_with_source): made after the module's dicts and the values are read,
    # N Parameters cost N times that whole guard set (a first compile 7x the model's at
    # 1,000 leaves). The traced front makes them first (fcall/_core/traced.py): the guard set
    # does not grow while they are made.
    from torch._guards import GuardsSet

    sizes = []
    scan = GuardsSet.remove_guards_with_source

    def counted(guards, source):
        sizes.append(len(guards.inner))
        scan(guards, source)

    monkeypatch.setattr(GuardsSet, "remove_guards_with_source", counted)
    m = nn.Sequential(*[nn.Linear(2, 2) for _ in range(10)])

    def f(x, p):
        with fcall.to_module(p, m):
            return m(x)

    torch.compile(f, backend=counter("eager"), fullgraph=True)(torch.randn(1, 2), plain(m))
    assert len(sizes) == 20
    assert max(sizes) <= min(sizes) + len(sizes) < 10 * len(sizes)
