"""fcall.testing: each failure kind is caught, with its message pinned; passing cases for
every API; the layout diff, the recompile log, the strategies and the pytest plugin.

Backends "eager" and "aot_eager" only (inductor: compile_tests/test_testing_compile.py).
"""

from __future__ import annotations

import contextlib
import inspect
import re
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch._dynamo
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from torch import nn

import fcall
import fcall.testing._parity
from fcall.testing import (
    Failure,
    ParityError,
    check_swap_parity,
    explain,
    record_recompiles,
)
from fcall.testing._layout import Layout, diff_layouts
from fcall.testing.strategies import param_sets

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True)
def _reset_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Net(nn.Module):
    """Linear, BatchNorm (train mode: its running stats are updated), Linear; the input is
    cast to the first weight's dtype, so a float64 set runs eagerly."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 4)
        self.bn = nn.BatchNorm1d(4)
        self.b = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.bn(self.a(x.to(self.a.weight.dtype))).tanh()
        return {"logits": self.b(h.to(self.b.weight.dtype)), "hidden": h}


class Affine(nn.Module):
    """Elementwise only: any of its values may have another float dtype (type promotion)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3))
        self.bias = nn.Parameter(torch.randn(3))
        self.register_buffer("scale", torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.weight + self.bias) * self.scale


class Chain(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.layers[0].weight.dtype)
        for layer in self.layers:
            x = layer(x)
        return x


class Breaks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.lin(x)
        torch._dynamo.graph_break()
        return x.relu()


BREAK_LINE = inspect.getsourcelines(Breaks.forward)[1] + 2
X = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
FAST = ("eager", "aot_eager")


def sets(model: nn.Module, n: int = 3, requires_grad: bool = False) -> list[TensorDict]:
    """``n`` sets in the model's layout, float leaves shifted by 0.1 * i."""
    base = fcall.from_module(model).detach().clone()
    out = []
    for i in range(n):
        td = base.apply(lambda t, i=i: t + 0.1 * i if t.is_floating_point() else t.clone())
        for key in ("a", "weight"), ("b", "weight"):
            if key in td.keys(True, True):
                td[key].requires_grad_(requires_grad)
        out.append(td)
    return out


def raised(fn: Any, *args: Any, **kwargs: Any) -> ParityError:
    with pytest.raises(ParityError) as info:
        fn(*args, **kwargs)
    return info.value


# ------------------------------------------------------------------------------ passing


@pytest.mark.parametrize("api", ["swap", "to_module", "functional_call"])
def test_passes_for_every_api_with_grads_and_train_mode_buffers(api: str) -> None:
    model = Net()
    report = check_swap_parity(model, sets(model, requires_grad=True), X, api=api, backends=FAST)
    assert [b.backend for b in report.backends] == ["eager", "aot_eager"]
    assert all(b.graphs == 1 and not b.recompiles and not b.graph_breaks for b in report.backends)
    assert report.api == api and report.sets == 3
    assert str(report).startswith(f"swap parity ({api}, 3 param set(s)): OK\n  eager: 1 graph(s)")


def test_to_module_passes_where_it_registers_names_again() -> None:
    # A partial set (tensordict's params hold no None bias): to_module moves `weight` after
    # `bias`, as tensordict's does; the order eager leaves is the compiled runs' reference.
    model = nn.Sequential(nn.Linear(3, 4, bias=False), nn.Tanh(), nn.Linear(4, 2))
    given = [fcall.from_module(model).detach().apply(torch.randn_like) for _ in range(2)]
    report = check_swap_parity(model, given, torch.randn(5, 3), api="to_module", backends=FAST)
    assert list(model[0]._parameters) == ["bias", "weight"]
    assert all(b.graphs == 1 and not b.recompiles for b in report.backends)


@pytest.mark.parametrize("container", ["dict", "tensordictparams"])
def test_passes_with_other_containers(container: str) -> None:
    model = Net()
    tds = sets(model)
    given_sets: list[Any] = (
        [dict(td.flatten_keys(".").items()) for td in tds]
        if container == "dict"
        else [fcall.TensorDictParams(td, no_convert=True) for td in tds]
    )
    report = check_swap_parity(model, given_sets, X, backends=["eager"])
    assert report.backends[0].graphs == 1


def test_module_buffers_that_a_train_forward_updates_end_as_eager_leaves_them() -> None:
    # The sets hold only the parameters: BatchNorm updates the module's own running stats.
    model, reference = Net(), Net()
    reference.load_state_dict(model.state_dict())
    only_params = [td.exclude(("bn", "running_mean"), ("bn", "running_var")) for td in sets(model)]
    only_params = [td.exclude(("bn", "num_batches_tracked")) for td in only_params]
    mean = model.bn.running_mean
    check_swap_parity(model, only_params, X, backends=FAST)
    for td in only_params:
        fcall.functional_call(reference, td, (X,))
    assert model.bn.running_mean is mean
    torch.testing.assert_close(model.bn.running_mean, reference.bn.running_mean)
    assert int(model.bn.num_batches_tracked) == 3


def test_graph_breaks_within_the_budget_pass_and_are_reported() -> None:
    model = Breaks()
    report = check_swap_parity(
        model, sets(model, 2), X, backends=["eager"], fullgraph=False, max_graph_breaks=1
    )
    (brk,) = report.backends[0].graph_breaks
    assert brk.location == f"{__file__}:{BREAK_LINE} (in forward)"
    assert brk.reason.startswith("Call to `torch._dynamo.graph_break()`")


def test_recompiles_within_the_budget_pass_and_are_reported() -> None:
    model = Net()
    given_sets = sets(model)
    given_sets[2] = given_sets[2].apply(lambda t: t.double() if t.is_floating_point() else t)
    report = check_swap_parity(model, given_sets, X, backends=["eager"], max_recompiles=1)
    (recompile,) = report.backends[0].recompiles
    assert recompile.set_index == 2
    assert str(recompile.layout_diff) == "8 params float32→float64, first: `a.weight`"


# ------------------------------------------------------------------------------ failing


def test_a_float64_set_fails_naming_the_key() -> None:
    model = Net()
    given_sets = sets(model)
    given_sets[1]["b"] = given_sets[1]["b"].double()
    err = raised(check_swap_parity, model, given_sets, X, backends=FAST)
    assert err.kind is Failure.RECOMPILE and err.backend == "eager" and err.set_index == 1
    assert str(err) == (
        "[recompile] backend 'eager': param set 1 recompiled the swapped call "
        "(1 recompile(s) over 3 sets, max_recompiles=0).\n"
        "  changed from param set 0: 2 params float32→float64, first: `b.weight`\n"
        "  Dynamo's reason: `b.weight` dtype mismatch. expected Float, actual Double\n"
        "  Every set should have the first one's layout (keys, Parameter vs tensor, dtype, "
        "shape, device, requires_grad), or raise max_recompiles."
    )
    assert err.recompile is not None and err.recompile.keys == ["b.weight", "b.bias"]


def test_many_params_changed_alike_are_grouped() -> None:
    model = Chain(20)
    first = fcall.from_module(model).detach().clone()
    second = first.apply(lambda t: t.to(torch.bfloat16))
    err = raised(check_swap_parity, model, [first, second], torch.ones(4), backends=["eager"])
    assert (
        "  changed from param set 0: 40 params float32→bfloat16, first: `layers.0.weight`\n"
        in str(err)
    )


def test_a_requires_grad_change_fails_naming_the_key() -> None:
    model = Net()
    given_sets = sets(model)
    given_sets[2]["a", "weight"].requires_grad_(True)
    err = raised(check_swap_parity, model, given_sets, X, backends=["eager"])
    assert err.set_index == 2
    assert "  changed from param set 1: 1 param requires_grad False→True, `a.weight`\n" in str(err)
    assert "  Dynamo's reason: `a.weight` requires_grad mismatch. expected requires_grad=0\n" in (
        str(err)
    )


def test_a_missing_key_fails_naming_the_key() -> None:
    model = Net()
    given_sets = sets(model)
    del given_sets[1]["b", "bias"]
    err = raised(check_swap_parity, model, given_sets, X, backends=["eager"])
    assert "  changed from param set 0: 1 key missing from the new set, `b.bias`\n" in str(err)
    # the failing guard is the traced front's read of the node's keys (fcall/_core/traced.py);
    # torch < 2.13 words it as the failing condition (`!=`), later ones as the guard (`==`)
    assert re.search(r"  Dynamo's reason: len\(`b`\) [=!]= 2\b", str(err))


def test_a_parameter_where_the_first_set_had_a_tensor_fails() -> None:
    model = nn.Linear(3, 2)
    first = {k: v.detach().clone() for k, v in model.state_dict().items()}
    second = dict(first, weight=nn.Parameter(first["weight"].clone(), requires_grad=False))
    err = raised(check_swap_parity, model, [first, second], torch.ones(3), backends=["eager"])
    assert "  changed from param set 0: 1 param Tensor→Parameter, `weight`\n" in str(err)


def test_a_graph_break_fails_with_the_users_file_and_line() -> None:
    model = Breaks()
    err = raised(check_swap_parity, model, sets(model, 1), X, backends=["eager"])
    assert err.kind is Failure.GRAPH_BREAK and err.graph_break is not None
    assert str(err).startswith(
        "[graph break] backend 'eager': graph break (fullgraph=True) with param set 0 at "
        f"{__file__}:{BREAK_LINE} (in forward): Call to `torch._dynamo.graph_break()`\n"
        "  Explanation: User-inserted graph break."
    )


def test_graph_breaks_over_the_budget_fail() -> None:
    model = Breaks()
    err = raised(check_swap_parity, model, sets(model, 1), X, backends=["eager"], fullgraph=False)
    assert str(err).startswith(
        "[graph break] 1 graph break(s), max_graph_breaks=0:\n"
        f"  {__file__}:{BREAK_LINE} (in forward): Call to `torch._dynamo.graph_break()`"
    )


def corrupt(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
    """A backend whose graphs add 1e-2 to every floating output."""

    def run(*args: Any) -> Any:
        return [o + 1e-2 if torch.is_tensor(o) and o.is_floating_point() else o for o in gm(*args)]

    return run


def test_a_backend_that_corrupts_the_output_fails_naming_backend_and_path() -> None:
    model = Net()
    err = raised(check_swap_parity, model, sets(model), X, backends=["eager", corrupt])
    assert err.kind is Failure.MISMATCH and err.backend == "corrupt"
    assert err.mismatch is not None and err.mismatch.path == "output['logits']"
    assert str(err).startswith(
        "[mismatch] backend 'corrupt': differs from eager on param set 0 at output['logits'], "
        "largest abs difference 0.01\nTensor-likes are not close!"
    )


def counts_twice(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
    """A backend that adds 1 to every integer tensor its graphs read (BatchNorm's
    ``num_batches_tracked``, after the graph's own ``add_(1)``)."""

    def run(*args: Any) -> Any:
        out = gm(*args)
        for a in args:
            if torch.is_tensor(a) and a.dtype == torch.int64:
                a.add_(1)
        return out

    return run


@pytest.mark.parametrize("in_the_set", [True, False])
def test_a_buffer_update_that_differs_fails_naming_the_buffer(in_the_set: bool) -> None:
    model = Net()
    given_sets = sets(model, 2)
    if not in_the_set:  # BatchNorm updates the module's own buffers
        given_sets = [td.exclude("bn") for td in given_sets]
    err = raised(check_swap_parity, model, given_sets, X, backends=[counts_twice])
    where = (
        "value of `bn.num_batches_tracked` after the call"
        if in_the_set
        else "module's own `bn.num_batches_tracked` after the call"
    )
    assert err.mismatch is not None and err.mismatch.path == where
    assert str(err).startswith(
        f"[mismatch] backend 'counts_twice': differs from eager on param set 0 at {where}, "
        "largest abs difference 1\n"
    )


def test_a_corrupted_gradient_fails_naming_the_key() -> None:
    model = nn.Linear(3, 2)
    given_sets = [fcall.from_module(model).detach().clone().requires_grad_() for _ in range(2)]

    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            return grad * 2

    def doubles_gradients(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        def run(*args: Any) -> Any:
            return [Scaled.apply(o) if torch.is_tensor(o) else o for o in gm(*args)]

        return run

    err = raised(check_swap_parity, model, given_sets, torch.ones(3), backends=[doubles_gradients])
    assert err.mismatch is not None and err.mismatch.path == "grad of `weight`"
    expected = "differs from eager on param set 0 at grad of `weight`, largest abs difference 1.5\n"
    assert expected in str(err)


class Disabled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    @torch.compiler.disable
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def test_a_call_that_runs_no_compiled_graph_fails() -> None:
    model = Disabled()
    err = raised(
        check_swap_parity,
        model,
        sets(model, 1),
        X,
        backends=["eager"],
        fullgraph=False,
        max_graph_breaks=1,
    )
    assert str(err) == (
        "[eager fallback] backend 'eager': param set 0 ran no compiled graph: Dynamo gave up "
        "on the swapped call and ran it eagerly (recompile limit, or a frame it skips)."
    )


@contextlib.contextmanager
def swap_without_restore_when_compiled(params: Any, model: nn.Module) -> Iterator[None]:
    """A broken swap: under compile it leaves the new values in the module."""
    old = fcall.to_module(params, model)
    yield
    if not torch.compiler.is_compiling():
        fcall.to_module(old, model)


def test_a_module_left_with_the_swapped_values_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = SimpleNamespace(swap=swap_without_restore_when_compiled)
    monkeypatch.setattr(fcall.testing._parity, "fcall", broken)
    model = nn.Linear(3, 2)
    err = raised(check_swap_parity, model, sets(model, 1), torch.ones(3), backends=["eager"])
    assert err.kind is Failure.RESTORE
    assert str(err) == (
        "[restore] backend 'eager': after the swaps: `weight` holds another object than before "
        "the swap (Parameter)"
    )


def fails_at_run(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
    def run(*args: Any) -> Any:
        raise RuntimeError("boom")

    return run


def test_a_compiled_call_that_raises_fails_naming_the_backend() -> None:
    model = nn.Linear(3, 2)
    err = raised(check_swap_parity, model, sets(model, 1), torch.ones(3), backends=[fails_at_run])
    assert err.kind is Failure.ERROR and isinstance(err.__cause__, RuntimeError)
    assert str(err) == (
        "[error] backend 'fails_at_run': param set 0 raised compiled, not eagerly: "
        "RuntimeError: boom"
    )


def test_arguments_are_validated() -> None:
    model = nn.Linear(3, 2)
    with pytest.raises(ValueError, match=r"api must be one of \('swap', 'to_module', 'functi"):
        check_swap_parity(model, sets(model, 1), torch.ones(3), api="swapp")
    with pytest.raises(ValueError, match="param_sets is empty"):
        check_swap_parity(model, [], torch.ones(3))
    with pytest.raises(ValueError, match="backends must be a non-empty sequence, got 'eager'"):
        check_swap_parity(model, sets(model, 1), torch.ones(3), backends="eager")
    with pytest.raises(ValueError, match="max_graph_breaks=1 needs fullgraph=False"):
        check_swap_parity(model, sets(model, 1), torch.ones(3), max_graph_breaks=1)


# ------------------------------------------------------------- layouts, recompile log


def test_layout_diff_names_each_kind_of_change() -> None:
    before = Layout.of(
        {"w": torch.ones(2, 3), "b": torch.ones(3), "p": nn.Parameter(torch.ones(1))}
    )
    after = Layout.of(
        TensorDict({"w": torch.ones(3, 2), "b": torch.ones(3).requires_grad_(), "x": torch.ones(1)})
    )
    assert str(diff_layouts(before, after)) == (
        "container dict→TensorDict; 1 key missing from the new set, `p`; "
        "1 key new in the new set, `x`; 1 param shape (2, 3)→(3, 2), `w`; "
        "1 param requires_grad False→True, `b`"
    )
    assert not diff_layouts(before, before)
    assert str(diff_layouts(before, before)).startswith("the layout is the same")


def test_record_recompiles_maps_guard_sources_to_keys() -> None:
    model = Affine()

    @torch.compile(backend="eager")
    def step(params: Any, x: torch.Tensor) -> torch.Tensor:
        with fcall.swap(params, model):
            return model(x)

    first = fcall.from_module(model).detach().clone()
    second = first.clone()
    second["bias"] = second["bias"].double()
    with record_recompiles() as log:
        step(first, torch.ones(3))
        assert len(log) == 0
        step(second, torch.ones(3))
    (recompile,) = log.recompiles
    (failure,) = recompile.failures
    assert failure.raw.startswith("0/0: tensor 'params._tensordict['bias']' dtype mismatch.")
    assert failure.reason == "`bias` dtype mismatch. expected Float, actual Double"
    assert failure.keys == ("bias",)
    assert recompile.function == "step"
    assert str(log).startswith("1 recompile:\nrecompiled `step` (")


def test_explain_attributes_each_recompile_to_its_set() -> None:
    model = nn.Linear(3, 2)
    step = torch.compile(lambda p, x: fcall.functional_call(model, p, (x,)), backend="eager")
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}
    grad = dict(base, bias=base["bias"].clone().requires_grad_())
    out = explain(step, [base, base, grad, grad], torch.ones(3))
    (recompile,) = out.recompiles
    assert recompile.set_index == 2 and recompile.keys == ["bias"]
    assert str(out) == (
        "4 param sets, 1 recompile(s):\n"
        f"param set 2 recompiled `<lambda>` ({__file__}:{recompile.location.split(':')[-1]})\n"
        "  changed from param set 1: 1 param requires_grad False→True, `bias`\n"
        "  Dynamo's reason: `bias` requires_grad mismatch. expected requires_grad=0"
    )


# ------------------------------------------------------------------------- strategies


@pytest.mark.parametrize("container", ["tensordict", "dict", "tensordictparams"])
def test_strategy_sets_pass_for_each_container(container: str) -> None:
    model = Net()

    @settings(max_examples=2, deadline=None, database=None)
    @given(st.lists(param_sets(model, container=container), min_size=2, max_size=2))
    def check(drawn: list[Any]) -> None:
        check_swap_parity(model, drawn, X, backends=["eager"])

    check()


@pytest.mark.parametrize("perturb", ["dtype", "requires_grad", "missing_key"])
def test_strategy_perturbations_are_caught_naming_the_drawn_key(perturb: str) -> None:
    model = Affine()
    keys = set(dict(model.state_dict()))

    @settings(max_examples=2, deadline=None, database=None)
    @given(param_sets(model), param_sets(model, perturb=perturb))  # type: ignore[arg-type]
    def check(first: TensorDict, second: TensorDict) -> None:
        err = raised(check_swap_parity, model, [first, second], X[0], backends=["eager"])
        assert err.recompile is not None and err.recompile.layout_diff is not None
        (key,) = err.recompile.layout_diff.keys()
        assert key in keys and f"`{key}`" in str(err)

    check()


@pytest.mark.parametrize("perturb", ["dtype", "requires_grad", "missing_key"])
def test_each_perturbation_changes_one_key(perturb: str) -> None:
    model = Net()

    @settings(max_examples=3, deadline=None, database=None)
    @given(param_sets(model), param_sets(model, perturb=perturb))  # type: ignore[arg-type]
    def check(first: TensorDict, second: TensorDict) -> None:
        diff = diff_layouts(Layout.of(first), Layout.of(second))
        assert len(diff.keys()) == 1
        (change,) = diff.changes
        assert change.field == {"dtype": "dtype", "requires_grad": "requires_grad"}.get(
            perturb, "missing"
        )

    check()


def test_strategy_sets_give_tied_names_once() -> None:
    model = nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 5, bias=False))
    model[1].weight = model[0].weight  # a tied head

    @settings(max_examples=2, deadline=None, database=None)
    @given(st.lists(param_sets(model, container="dict"), min_size=2, max_size=2))
    def check(drawn: list[Any]) -> None:
        assert all(sorted(d) == ["0.weight"] for d in drawn)
        check_swap_parity(model, drawn, torch.tensor([1, 2]), backends=["eager"])

    check()


def test_strategy_arguments_are_validated() -> None:
    with pytest.raises(ValueError, match="container must be 'tensordict', 'dict' or 'tensordictp"):
        param_sets(nn.Linear(1, 1), container="list")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="perturb must be None, 'dtype', 'requires_grad' or 'mi"):
        param_sets(nn.Linear(1, 1), perturb="shape")  # type: ignore[arg-type]


# ---------------------------------------------------------------- imports, pytest plugin


IMPORTS = """
import sys
import fcall_pytest
print("torch" in sys.modules, "fcall" in sys.modules)
import fcall
print("fcall.testing" in sys.modules, "hypothesis" in sys.modules)
import fcall.testing
print("hypothesis" in sys.modules)
"""


def test_import_fcall_does_not_import_the_toolkit_and_the_plugin_imports_no_torch() -> None:
    out = subprocess.run(
        [sys.executable, "-c", IMPORTS], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[:3] == ["False False", "False False", "False"]


PLUGIN_TESTS = """
import pytest, torch, fcall
from fcall.testing import ParityError

class Cast(torch.nn.Linear):
    def forward(self, x):
        return super().forward(x.to(self.weight.dtype))

MODEL = Cast(3, 2)

def sets():
    first = fcall.from_module(MODEL).detach().clone()
    return [first, first.apply(lambda t: t.double())]

def test_passes(swap_parity):
    report = swap_parity(MODEL, sets()[:1], torch.ones(3))
    assert [b.backend for b in report.backends] == ["eager"]

@pytest.mark.swap_parity(max_recompiles=1)
def test_marker_sets_defaults(swap_parity):
    swap_parity(MODEL, sets(), torch.ones(3))

def test_fails_with_the_key(swap_parity):
    swap_parity(MODEL, sets(), torch.ones(3))
"""


def test_pytest_plugin_fixture_marker_and_option(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_swaps=PLUGIN_TESTS)
    result = pytester.runpytest_inprocess("--swap-parity-backends=eager", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*[[]recompile] backend 'eager': param set 1 recompiled the swapped call*",
            "*changed from param set 0: 2 params float32→float64, first: `weight`",
        ]
    )
    markers = pytester.runpytest_inprocess("--markers")
    markers.stdout.fnmatch_lines(["@pytest.mark.swap_parity(**kwargs): defaults of the swap_p*"])


def test_the_gradients_compared_are_not_rounding_noise_after_a_train_mode_batchnorm():
    """``out.sum()`` after a train-mode BatchNorm is constant in its input: the gradients
    above it would be rounding noise (~1e-7 here, 8e-5 in a parity example), compared as
    values. The toolkit's loss weighs each output element (``loss_weights``)."""
    from fcall.testing._compare import grads, loss_weights

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).train()
    params = {k: v.detach().clone().requires_grad_() for k, v in model.named_parameters()}
    x = torch.randn(8, 3)
    plain = torch.autograd.grad(
        torch.func.functional_call(model, params, (x,)).sum(), params["0.weight"]
    )[0]
    assert plain.abs().max() < 1e-5  # the degenerate loss: nothing but noise
    out = torch.func.functional_call(model, params, (x,))
    weighted = grads(out, params)["0.weight"]
    assert weighted is not None and weighted.abs().max() > 1e-2
    weights = loss_weights(out)
    assert (
        weights.shape == out.shape and float(weights.min()) == 0.5 and float(weights.max()) == 1.5
    )
