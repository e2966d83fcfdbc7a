"""to_module / swap / functional_call under torch.compile (issue 2).

Every compiled call runs with ``fullgraph=True`` (zero graph breaks) or counts its
graphs; each test calls the compiled function with fresh param sets of the same
structure and asserts that nothing new was compiled. Dynamo is reset per test by
``conftest.py``. Known Dynamo limits are pinned with the exact error, not hidden.
"""

from __future__ import annotations

import re

import pytest
import tensordict.base
import torch
from tensordict import TensorDict
from torch import nn
from torch._dynamo.exc import Unsupported

import fcall
from fcall._core import plan as _plan
from fcall.testing import check_swap_parity
from tests.support import (
    Counter,
    Net,
    Tied,
    assert_frames,
    assert_same_state,
    flat,
    key_order_recompiles,
    state,
)

BACKENDS = ["eager", "aot_eager"]


def fresh(module: nn.Module) -> TensorDict:
    """A new param set of the module's structure, with new random float values."""
    return (
        fcall.from_module(module)
        .detach()
        .apply(lambda t: torch.randn_like(t).abs() if t.is_floating_point() else t.clone())
    )


def reference(module: nn.Module, params: TensorDict, x: torch.Tensor) -> torch.Tensor:
    return torch.func.functional_call(module, flat(params.clone()), (x,))


# --- one graph for every API, every container, every call -----------------------------------


def api_to_module_with(m, p, x):
    with fcall.to_module(p, m):
        return m(x)


def api_to_module_pattern(m, p, x):
    old = fcall.to_module(p, m)
    y = m(x)
    fcall.to_module(old, m)
    return y


def api_swap(m, p, x):
    with fcall.swap(p, m) as old:
        return m(x) + 0 * old["lin", "weight"].detach().sum()


def api_functional_call(m, p, x):
    return fcall.functional_call(m, p, (x,))


APIS = [api_to_module_with, api_to_module_pattern, api_swap, api_functional_call]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("api", APIS, ids=lambda f: f.__name__[4:])
def test_one_graph_for_new_param_sets(counter, backend, api):
    m = Net().eval()
    before = state(m)
    cnt = counter(backend)
    fn = torch.compile(api, backend=cnt, fullgraph=True)
    x = torch.randn(2, 3)
    for _ in range(3):
        p = fresh(m)
        torch.testing.assert_close(fn(m, p, x), reference(m, p, x))
        assert_same_state(m, before)
    assert cnt.frame_count == 1


@pytest.mark.parametrize("container", ["flat-dict", "nested-dict"])
def test_dict_containers_one_graph(container):
    # fcall.testing: one graph for both sets, compiled == eager, the module restored exactly
    m = Net().eval()
    x = torch.randn(2, 3)
    sets = [fresh(m) for _ in range(2)]
    given = [flat(p) if container == "flat-dict" else p.to_dict() for p in sets]
    report = check_swap_parity(m, given, x, api="functional_call", backends=["eager"])
    assert report.backends[0].graphs == 1
    for p, g in zip(sets, given):  # and eager == torch.func
        torch.testing.assert_close(api_to_module_with(m, g, x), reference(m, p, x))


# --- every keyword of to_module and their combinations --------------------------------------

COMBOS = [
    {},
    {"inplace": True},
    {"inplace": True, "non_blocking": True},
    {"inplace": True, "swap_dest": "inside"},
    {"preserve_module_state": False},
    {"preserve_module_state": False, "swap_dest": "inside"},
    {"use_state_dict": True},
    {"use_state_dict": True, "preserve_module_state": False},
    {"swap_dest": "inside"},
]


class Small(nn.Module):
    """A Linear and a non-persistent buffer: cheap to compile."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 4)
        self.register_buffer("scale", torch.ones(4), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


# every combination with the eager backend; aot_eager on the ones that write differently
KEYWORD_CASES = [("eager", kw) for kw in COMBOS] + [
    ("aot_eager", COMBOS[i]) for i in (0, 3, 5, 7, 8)
]


@pytest.mark.parametrize(
    "backend, kwargs",
    KEYWORD_CASES,
    ids=[f"{b}-{'-'.join(kw) or 'defaults'}" for b, kw in KEYWORD_CASES],
)
def test_to_module_keywords_one_graph(counter, backend, kwargs):
    m = Small()
    before = state(m)
    values = fcall.from_module(m).detach().clone()
    kwargs = dict(kwargs)
    dest_kind = kwargs.pop("swap_dest", None)

    def f(p, x):
        if dest_kind is None:
            dest = None
        else:
            dest = TensorDict()
        out = fcall.to_module(p, m, swap_dest=dest, **kwargs)
        y = m(x)
        fcall.to_module(out, m, **kwargs)
        return y, out

    cnt = counter(backend)
    fn = torch.compile(f, backend=cnt, fullgraph=True)
    x = torch.randn(2, 3)
    with torch.no_grad():  # inplace: see test_inplace_backward_is_a_torch_limit
        for _ in range(2):
            p = fresh(m)
            y, out = fn(p, x)
            torch.testing.assert_close(y, reference(m, p, x))
            assert isinstance(out, TensorDict)
            assert_same_state(m, before)
            torch.testing.assert_close(fcall.from_module(m).detach(), values)
    assert cnt.frame_count == 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kwargs", [{}, {"inplace": True}, {"preserve_module_state": False}])
def test_to_module_with_block_keywords_one_graph(counter, backend, kwargs):
    m = nn.Linear(3, 2)
    before = state(m)
    values = fcall.from_module(m).detach().clone()

    def f(p, x):
        with fcall.to_module(p, m, **kwargs) as old:
            return m(x), old

    cnt = counter(backend)
    fn = torch.compile(f, backend=cnt, fullgraph=True)
    x = torch.randn(3)
    with torch.no_grad():
        for _ in range(2):
            p = fresh(m)
            y, old = fn(p, x)
            torch.testing.assert_close(y, reference(m, p, x))
            if kwargs.get("inplace"):
                torch.testing.assert_close(old, values)
            else:
                assert old["weight"] is before[0][3]
            assert_same_state(m, before)
    assert cnt.frame_count == 1


@pytest.mark.parametrize("preserve", [True, False])
def test_old_values_swapped_back_in_a_nested_block_one_graph(counter, preserve):
    m = nn.Linear(3, 2)
    before = state(m)

    def f(p, x):
        with fcall.to_module(p, m, preserve_module_state=preserve) as old:
            with fcall.to_module(old, m, preserve_module_state=preserve):
                own = m(x)
            return own, m(x)

    cnt = counter("eager")
    fn = torch.compile(f, backend=cnt, fullgraph=True)
    x = torch.randn(3)
    with torch.no_grad():
        for _ in range(2):
            p = fresh(m)
            own, swapped = fn(p, x)
            torch.testing.assert_close(own, m(x))
            torch.testing.assert_close(swapped, reference(m, p, x))
            assert_same_state(m, before)
    assert cnt.frame_count == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_old_values_regrouped_in_swap_dest_come_back_in_their_place_one_graph(counter, backend):
    # A flat dict lists parameters before buffers; swap_dest groups each submodule's
    # buffers with its parameters. Swapping it back puts every object back in its dict,
    # in the order eager leaves (tensordict's: the names written are registered again).
    m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    m[2].requires_grad_(False)
    m[2].register_parameter("unset", None)
    before = state(m)

    def f(p, x):
        old = fcall.to_module(p, m, preserve_module_state=False, swap_dest=TensorDict())
        out = m(x)
        fcall.to_module(old, m)
        return out

    def params():  # trainable values for the parameters, plain ones for the buffers
        weights = {k: torch.randn_like(v).requires_grad_() for k, v in m.named_parameters()}
        return weights | {k: v.clone() for k, v in m.named_buffers()}

    cnt = counter(backend)
    fn = torch.compile(f, backend=cnt, fullgraph=True)
    x = torch.randn(5, 3)
    p = params()
    expected = torch.func.functional_call(m, p, (x,))
    f(params(), x)  # eager first: the order it leaves is the reference
    assert_same_state(m, before, in_any_order=True)
    after_eager = state(m)
    torch.testing.assert_close(fn(p, x), expected)
    assert_same_state(m, after_eager)  # every dict in eager's key order
    with torch.compiler.set_stance("fail_on_recompile"):
        fn(params(), x)
    assert_same_state(m, after_eager)
    assert cnt.frame_count == 1


def test_return_swap_false_leaves_the_new_values_registered(counter):
    m = nn.Linear(3, 2)
    weight, bias = m.weight, m.bias
    cnt = counter("eager")

    def f(p, x):
        assert fcall.to_module(p, m, return_swap=False) is None
        return m(x)

    fn = torch.compile(f, backend=cnt, fullgraph=True)
    for _ in range(2):
        p = fresh(m)
        torch.testing.assert_close(fn(p, torch.ones(3)), reference(m, p, torch.ones(3)))
        assert type(m.weight) is nn.Parameter and m.weight.requires_grad
        torch.testing.assert_close(m.weight.detach(), p["weight"])
        fcall.to_module({"weight": weight, "bias": bias}, m)  # eager
        assert m.weight is weight
    assert cnt.frame_count == 1


def test_swap_dest_passed_in_with_a_with_block_is_an_unsupported_context_manager(counter):
    # Dynamo cannot enter a TensorDict created outside the compiled region as a
    # context manager. swap_dest without `with`, or created inside, works (above).
    m = nn.Linear(3, 2)
    before = state(m)

    def f(p, x, dest):
        with fcall.to_module(p, m, swap_dest=dest):
            return m(x)

    fn = torch.compile(f, backend=counter("eager"), fullgraph=True)
    msg = "Dynamo does not know how to enter a `TensorDict` context manager"
    with pytest.raises(Unsupported, match=re.escape(msg)):
        fn(fresh(m), torch.ones(3), TensorDict())
    assert_same_state(m, before)


def test_swap_dest_passed_in_without_with_one_graph(counter):
    m = nn.Linear(3, 2)
    before = state(m)

    def f(p, x, dest):
        fcall.to_module(p, m, swap_dest=dest)
        y = m(x)
        fcall.to_module(dest, m)
        return y

    cnt = counter("aot_eager")
    fn = torch.compile(f, backend=cnt, fullgraph=True)
    for _ in range(2):
        dest, p = TensorDict(), fresh(m)
        torch.testing.assert_close(fn(p, torch.ones(3), dest), reference(m, p, torch.ones(3)))
        assert dest["weight"] is before[0][3]
        assert_same_state(m, before)
    assert cnt.frame_count == 1


def test_preserve_module_state_on_a_value_computed_inside_is_one_graph(counter):
    # A non-grad value computed in the graph needs nn.Parameter() on a non-input, which
    # Dynamo graph-breaks on by default (config.graph_break_on_nn_param_ctor): fcall
    # patches the flag around its own constructor while tracing, and Dynamo takes its
    # traceable path (torch/_dynamo/create_parameter_op.py). fcall.swap makes none.
    m = nn.Linear(3, 2)
    before = state(m)

    def computed(p, x):
        with fcall.to_module(p.apply(lambda t: t * 2), m):
            return m(x), m.weight

    cnt = counter("aot_eager")
    fn = torch.compile(computed, backend=cnt, fullgraph=True)
    for _ in range(2):
        p = fresh(m)
        y, weight = fn(p, torch.ones(3))
        torch.testing.assert_close(y, reference(m, p * 2, torch.ones(3)))
        assert isinstance(weight, nn.Parameter) and weight.requires_grad  # as in eager
        y.sum().backward()
        torch.testing.assert_close(weight.grad, torch.ones(2, 3))
        assert_same_state(m, before)
    assert cnt.frame_count == 1
    assert torch._dynamo.config.graph_break_on_nn_param_ctor  # patched while tracing only

    def swapped(p, x):
        with fcall.swap(p.apply(lambda t: t * 2), m):
            return m(x)

    cnt = counter("eager")
    fn = torch.compile(swapped, backend=cnt, fullgraph=True)
    torch.testing.assert_close(fn(p, torch.ones(3)), reference(m, p * 2, torch.ones(3)))
    assert cnt.frame_count == 1
    assert_same_state(m, before)


# --- use_state_dict hooks -------------------------------------------------------------------


class Hooked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        # a tensor counter: a Python list mutated in a hook makes Dynamo guard on it
        self.public_calls = torch.zeros((), dtype=torch.long)
        self.private_calls = torch.zeros((), dtype=torch.long)
        self.lin.register_load_state_dict_pre_hook(self._public)
        self._register_load_state_dict_pre_hook(self._private)

    def _public(self, module, state_dict, prefix, *args):
        self.public_calls.add_(1)

    def _private(self, state_dict, prefix, *args):
        self.private_calls.add_(1)
        legacy = f"{prefix}lin.old_weight"
        if legacy in state_dict:
            state_dict[f"{prefix}lin.weight"] = state_dict.pop(legacy)

    def forward(self, x):
        return self.lin(x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_use_state_dict_runs_hooks_once_per_call_and_renames(request, counter, backend):
    key_order_recompiles(request)  # the hook's rename moves `weight` to the end
    m = Hooked()
    before = state(m)

    def f(p, x):
        with fcall.to_module(p, m, use_state_dict=True):
            return m(x)

    cnt = counter(backend)
    fn = torch.compile(f, backend=cnt, fullgraph=True)
    for i in range(1, 3):
        legacy = {"lin.old_weight": torch.randn(2, 2), "lin.bias": torch.randn(2)}
        expected = torch.nn.functional.linear(torch.ones(2), *legacy.values())
        torch.testing.assert_close(fn(legacy, torch.ones(2)), expected)
        assert m.public_calls == i and m.private_calls == i
        assert_same_state(m, before, in_any_order=True)  # the hook renamed: weight last
    assert_frames(cnt, 1)


# --- errors: same type and message as eager, module unchanged -------------------------------


def _error_cases():
    tied_params = {"emb.weight": torch.zeros(5, 3), "head.weight": torch.ones(5, 3)}
    return {
        "unknown-key": (lambda m, x: fcall.to_module({"lin.wieght": torch.ones(1)}, m), Net),
        "non-tensor": (lambda m, x: fcall.swap({"lin": {"bias": 3}}, m).__enter__(), Net),
        "memo": (lambda m, x: fcall.to_module({}, m, memo={}), Net),
        "not-a-module": (lambda m, x: fcall.functional_call(x, {}, ()), Net),
        "inplace-state-dict": (
            lambda m, x: fcall.to_module({}, m, inplace=True, use_state_dict=True),
            Net,
        ),
        "strict": (
            lambda m, x: fcall.functional_call(m, {"lin.bias": torch.ones(4)}, (x,), strict=True),
            Net,
        ),
        "tied-conflict": (lambda m, x: fcall.functional_call(m, tied_params, (x,)), Tied),
        "inplace-shape": (
            lambda m, x: fcall.to_module(
                {"lin.weight": torch.ones(4, 3), "lin.bias": torch.ones(3)}, m, inplace=True
            ),
            Net,
        ),
    }


ERRORS = _error_cases()


@pytest.mark.parametrize("case", list(ERRORS))
def test_errors_match_eager_with_fullgraph_false(counter, case):
    call, make = ERRORS[case]
    m = make()
    before = state(m)
    x = torch.tensor([1, 2]) if make is Tied else torch.ones(2, 3)
    with pytest.raises(Exception) as eager:
        call(m, x)
    assert_same_state(m, before)
    fn = torch.compile(call, backend=counter("eager"), fullgraph=False)
    with pytest.raises(eager.type, match=re.escape(str(eager.value.args[0]))):
        fn(m, x)
    assert_same_state(m, before)


def test_an_exception_leaving_a_fullgraph_region_is_unsupported():
    m = nn.Linear(3, 2)
    before = state(m)
    fn = torch.compile(ERRORS["memo"][0], backend="eager", fullgraph=True)
    with pytest.raises(Unsupported, match=re.escape("Observed exception")):
        fn(m, None)
    assert_same_state(m, before)


class Raising(Small):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        super().forward(x)
        raise ValueError("stop in forward")


@pytest.mark.parametrize("api", ["to_module", "swap", "functional_call"])
def test_exception_in_the_block_propagates_and_restores(api):
    m = Raising()
    before, weight = state(m), m.lin.weight

    def f(p, x):
        if api == "functional_call":
            return fcall.functional_call(m, p, (x,))
        with (fcall.to_module if api == "to_module" else fcall.swap)(p, m):
            return m(x)

    fn = torch.compile(f, backend="eager", fullgraph=False)
    with pytest.raises(ValueError, match="stop in forward"):
        fn(fresh(m), torch.ones(2, 3))
    if api == "to_module" and not hasattr(tensordict.base, "_UNDO_ON_ERROR_OPS"):
        # tensordict 0.14: the TensorDict a compiled to_module returns exits as tensordict
        # 0.14's own __exit__ does, undoing nothing on an exception (docs/versions.md)
        assert m.lin.weight is not weight
        m = Raising()
        before = state(m)
    else:
        assert_same_state(m, before)
    torch._dynamo.reset()  # else the frame's cached fallback runs
    with pytest.raises(Unsupported, match="Observed exception"):
        torch.compile(f, backend="eager", fullgraph=True)(fresh(m), torch.ones(2, 3))
    assert_same_state(m, before)


# --- tied weights ---------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["to_module", "swap", "functional_call"])
def test_tied_given_once_the_peers_result(counter, api):
    m = Tied()
    before = state(m)

    def f(w, idx):
        if api == "functional_call":
            return fcall.functional_call(m, {"emb.weight": w}, (idx,))
        cm = fcall.to_module if api == "to_module" else fcall.swap
        with cm({"emb": {"weight": w}}, m):
            return m(idx)

    cnt = counter("eager")
    fn = torch.compile(f, backend=cnt, fullgraph=True)
    idx = torch.tensor([0, 4])
    for _ in range(2):
        w = torch.randn(5, 3)
        if api == "to_module":  # tensordict's: the given name only, the tied one as it is
            with TensorDict({"emb": {"weight": w}}).to_module(m):
                expected = m(idx)
        else:
            expected = torch.func.functional_call(m, {"emb.weight": w}, idx)
        torch.testing.assert_close(fn(w, idx), expected)
        assert_same_state(m, before)
    assert cnt.frame_count == 1


def test_tie_weights_false_each_name_takes_its_own_value(counter):
    m = Tied()
    before = state(m)

    def f(p, idx):
        return fcall.functional_call(m, p, (idx,), tie_weights=False)

    cnt = counter("aot_eager")
    fn = torch.compile(f, backend=cnt, fullgraph=True)
    idx = torch.tensor([1, 2])
    for _ in range(2):
        p = {"emb.weight": torch.randn(5, 3), "head.weight": torch.randn(5, 3)}
        expected = torch.func.functional_call(m, p, (idx,), tie_weights=False)
        torch.testing.assert_close(fn(p, idx), expected)
        assert_same_state(m, before)
    assert cnt.frame_count == 1


# --- gradients ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "backend, api",
    [
        ("aot_eager", api_to_module_with),
        ("aot_eager", api_swap),
        ("aot_eager", api_functional_call),
        ("inductor", api_functional_call),
    ],
    ids=["aot_eager-to_module", "aot_eager-swap", "aot_eager-functional_call", "inductor"],
)
def test_gradients_reach_the_leaves(counter, backend, api):
    m = Net().eval()
    before = state(m)
    cnt = counter(backend)
    fn = torch.compile(api, backend=cnt, fullgraph=True)
    x = torch.randn(2, 3)
    for as_parameter in (False, True):
        p = fresh(m)
        leaf = nn.Parameter if as_parameter else (lambda t: t.requires_grad_())
        p["lin", "weight"] = leaf(p["lin", "weight"])
        p["bn", "bias"] = leaf(p["bn", "bias"])
        fn(m, p, x).pow(2).sum().backward()
        ref = p.detach().clone()
        ref["lin", "weight"].requires_grad_()
        ref["bn", "bias"].requires_grad_()
        reference(m, ref, x).pow(2).sum().backward()
        torch.testing.assert_close(p["lin", "weight"].grad, ref["lin", "weight"].grad)
        torch.testing.assert_close(p["bn", "bias"].grad, ref["bn", "bias"].grad)
        assert_same_state(m, before)
    assert m.lin.weight.grad is None
    # a Parameter vs a plain leaf is a different graph input type: two graphs
    assert cnt.frame_count == 2


def test_inductor_to_module_with_block():
    # fcall.testing: one graph, compiled (inductor) == eager, outputs and gradients
    m = Net().eval()
    sets = [fresh(m) for _ in range(2)]
    for p in sets:
        p["lin", "weight"].requires_grad_()
    x = torch.randn(2, 3)
    report = check_swap_parity(m, sets, x, api="to_module", backends=["inductor"])
    assert report.backends[0].graphs == 1
    with torch.no_grad():  # and eager == torch.func
        torch.testing.assert_close(api_to_module_with(m, sets[0], x), reference(m, sets[0], x))


# --- buffers --------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("api", [api_to_module_with, api_swap], ids=["to_module", "swap"])
def test_batchnorm_stats_land_in_params(counter, backend, api):
    m = Net().train()
    before = state(m)
    cnt = counter(backend)
    fn = torch.compile(api, backend=cnt, fullgraph=True)
    for _ in range(2):
        p = fcall.from_module(m).detach().clone()
        mean = p["bn", "running_mean"]
        fn(m, p, torch.randn(8, 3) + 3)
        assert p["bn", "running_mean"] is mean and (mean != 0).all()
        assert p["bn", "num_batches_tracked"] == 1
        assert_same_state(m, before)
        assert (m.bn.running_mean == 0).all()
    assert cnt.frame_count == 1


@pytest.mark.parametrize("api", ["to_module", "swap", "functional_call"])
def test_a_reassigned_buffer_is_written_back(counter, api):
    m = Counter()
    before = state(m)

    def f(p, x):
        if api == "functional_call":
            return fcall.functional_call(m, p, (x,))
        with (fcall.to_module if api == "to_module" else fcall.swap)(p, m):
            return m(x)

    cnt = counter("eager")
    fn = torch.compile(f, backend=cnt, fullgraph=True)
    for _ in range(2):
        p = {"count": torch.zeros(())}
        fn(p, torch.ones(2))
        assert p["count"] == 1
        assert_same_state(m, before)
        assert m.count == 0
    assert cnt.frame_count == 1


# --- wrapped modules ------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["", "_orig_mod."])
def test_compiled_module_keys_with_and_without_prefix(request, counter, prefix):
    key_order_recompiles(request)  # the first call moves `weight` to the end
    inner = nn.Linear(3, 2)
    wrapped = torch.compile(inner, backend="eager")
    before = state(inner)

    def f(w, x):
        with fcall.to_module({f"{prefix}weight": w}, wrapped):
            return inner(x)

    cnt = counter("eager")
    fn = torch.compile(f, backend=cnt, fullgraph=True)
    for _ in range(2):
        w = torch.randn(2, 3)
        torch.testing.assert_close(fn(w, torch.ones(3)), w.sum(1) + inner.bias.detach())
        assert_same_state(inner, before, in_any_order=True)
        assert list(inner._parameters) == ["bias", "weight"]  # as tensordict's, as eager
    assert_frames(cnt, 1)


def test_swaps_outside_a_compiled_model_do_not_recompile(counter):
    inner = Net().eval()
    cnt = counter("aot_eager")
    model = torch.compile(inner, backend=cnt, fullgraph=True)
    before = state(inner)
    x = torch.randn(2, 3)
    model(x)
    with torch.compiler.set_stance("fail_on_recompile"):
        for _ in range(2):
            p = fresh(inner)
            with fcall.to_module(p, model):
                torch.testing.assert_close(model(x), reference(inner, p, x))
            old = fcall.to_module(fresh(inner), model)
            model(x)
            fcall.to_module(old, model)
            q = fcall.from_module(Net().eval())  # Parameters, like the module's own
            with fcall.swap(q, model):
                torch.testing.assert_close(model(x), reference(inner, q, x))
            torch.testing.assert_close(
                fcall.functional_call(model, q, (x,)), reference(inner, q, x)
            )
            assert_same_state(inner, before)
    assert cnt.frame_count == 1


def test_eager_swaps_with_cached_plans_beside_compiled_code(counter):
    # eager swaps reuse their cached plans; a compiled model between them and a compiled
    # swap of the same module see the module as it was, and compile once
    inner = Net().eval()
    cnt, cnt_swap = counter("aot_eager"), counter("aot_eager")
    model = torch.compile(inner, backend=cnt, fullgraph=True)
    swap_and_call = torch.compile(api_swap, backend=cnt_swap, fullgraph=True)
    before = state(inner)
    x = torch.randn(2, 3)
    for _ in range(3):
        p, q = fresh(inner), fcall.from_module(Net().eval())  # q: Parameters, like the module's
        with fcall.swap(q, model):
            torch.testing.assert_close(model(x), reference(inner, q, x))
        with fcall.to_module(p, inner):
            torch.testing.assert_close(model(x), reference(inner, p, x))
        torch.testing.assert_close(swap_and_call(inner, p, x), reference(inner, p, x))
        assert_same_state(inner, before)
    assert _plan.cached(model) and _plan.cached(inner)
    assert (cnt.frame_count, cnt_swap.frame_count) == (1, 1)


# --- vmap -----------------------------------------------------------------------------------


def _stacked(m: nn.Module, n: int = 3) -> TensorDict:
    return torch.stack([fresh(m) for _ in range(n)])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("api", ["functional_call", "swap", "to_module"])
def test_vmap_inside_compile_one_graph(counter, backend, api):
    m = nn.Linear(3, 2)
    before = state(m)

    def one(p, x):
        if api == "functional_call":
            return fcall.functional_call(m, p, (x,))
        with (fcall.swap if api == "swap" else fcall.to_module)(p, m):
            return m(x)

    def f(stacked, x):
        return torch.vmap(one, (0, None))(stacked, x)

    cnt = counter(backend)
    fn = torch.compile(f, backend=cnt, fullgraph=True)
    x = torch.randn(4, 3)
    for _ in range(2):
        stacked = _stacked(m)
        out = fn(stacked, x)
        for i in range(3):
            torch.testing.assert_close(out[i], reference(m, stacked[i], x))
        assert_same_state(m, before)
    assert cnt.frame_count == 1
