"""Regression tests for bugs the parity suite found in fcall."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

import fcall
from tests.support import DYNAMO_2_11

from . import checks


def _params(module):
    return {k: torch.randn_like(v).requires_grad_() for k, v in module.named_parameters()}


def test_rnn_flat_weights_point_back_at_the_module_after_a_swap():
    gru, x = nn.GRU(2, 2, batch_first=True), torch.randn(2, 3, 2)
    params = _params(gru)
    fcall.functional_call(gru, params, (x,))
    with fcall.swap(_params(gru), gru):
        gru(x)
    assert all(a is b for a, b in zip(gru._flat_weights, gru._parameters.values()))


def test_rnn_second_param_set_does_not_recompile():
    # allow_rnn is set for every parity test by conftest's fixture.
    lstm, x = nn.LSTM(2, 2, batch_first=True), torch.randn(2, 3, 2)
    counter = CompileCounterWithBackend("eager")
    step = torch.compile(
        lambda m, p, x: fcall.functional_call(m, p, (x,)), backend=counter, fullgraph=True
    )
    for _ in range(3):
        step(lstm, _params(lstm), x)
    assert counter.frame_count == 1


# ------------------------------------------------------------ torch limits, pinned


class _BatchNorm1dNet(nn.Module):
    """Linear, BatchNorm1d over (N, C, L), Linear: the minimal torch triggers."""

    def __init__(self, contiguous: bool):
        super().__init__()
        self.contiguous = contiguous
        self.lin = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4).eval()
        self.head = nn.Linear(4, 4)

    def forward(self, x):
        x = self.lin(x).transpose(1, 2)
        x = x.contiguous() if self.contiguous else x
        return self.head(self.bn(x).transpose(1, 2))


CALLS = {
    "no_swap": lambda m, p, x: m(x),
    "torch_func": lambda m, p, x: torch.func.functional_call(m, p, (x,)),
    "fcall": lambda m, p, x: fcall.functional_call(m, p, (x,)),
}


@pytest.mark.parametrize("how", sorted(CALLS))
@pytest.mark.parametrize(
    ("contiguous", "grad"), [(False, False), (True, True)], ids=["transposed_fwd", "contig_bwd"]
)
def test_torch_aot_batchnorm1d_fails_with_and_without_fcall(how, contiguous, grad):
    """torch bug, not fcall's: under aot_eager BatchNorm1d on a 3-D input fails with
    "view size is not compatible...", in forward for a transposed input (CPU eager
    batch_norm returns a contiguous output, its fake/meta kernel predicts the input's
    strides) and in backward even for a contiguous one; a plain compiled module fails
    alike. So the generator leaves BatchNorm1d out for AOT backends
    (generators.BN1D_BACKENDS). When this test fails, torch is fixed: widen that."""
    call, model, x = CALLS[how], _BatchNorm1dNet(contiguous), torch.randn(2, 3, 4)
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for name, _ in model.named_parameters():
        params[name].requires_grad_(grad)
    assert call(model, params, x).shape == x.shape  # eager is fine
    torch._dynamo.reset()
    compiled = torch.compile(call, backend="aot_eager", fullgraph=True)
    with pytest.raises(RuntimeError, match=re.escape(checks.KNOWN_AOT_ERROR)):
        out = compiled(model, params, x)
        out.sum().backward()


def test_torch_aot_rnn_with_mixed_swapped_leaves_fails_with_and_without_fcall():
    """Why generators.RNN_BACKENDS is eager only; when this fails, torch is fixed."""
    torch.manual_seed(0)
    lstm, x = nn.LSTM(8, 8, batch_first=True), torch.randn(2, 3, 8)
    params = {}
    for i, (name, value) in enumerate(lstm.named_parameters()):
        fresh = torch.randn_like(value)
        params[name] = (fresh.requires_grad_(), fresh, nn.Parameter(fresh))[i % 3]
    for call in (torch.func.functional_call, fcall.functional_call):
        torch._dynamo.reset()
        step = torch.compile(lambda p, x, call=call: call(lstm, p, (x,))[0], backend="aot_eager")
        with pytest.raises(Exception, match="tensors_saved_with_vc_check to be Tensors"):
            step(params, x).sum().backward()


def test_tied_names_under_vmap_arrive_as_two_tensors_for_torch_too():
    """Why the vmap tests give tied names once: both refuse two batched copies."""
    model = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))
    model[1].weight = model[0].weight
    shared = torch.randn(3, 2, 2)
    stacked = {"0.weight": shared, "1.weight": shared}
    for call, message in (
        (torch.func.functional_call, "which are tied"),
        (fcall.functional_call, "which the module ties to one tensor"),
    ):
        with pytest.raises(ValueError, match=message):
            torch.vmap(lambda p, call=call: call(model, p, (torch.ones(2),)))(stacked)


class _TwoBatchNorm2d(nn.Module):
    """A BatchNorm2d, then one in eval mode, each on ``x.transpose(1, 2).unsqueeze(-1)``
    as the generator's bn2d block runs it."""

    def __init__(self, first_train: bool):
        super().__init__()
        self.bns = nn.ModuleList([nn.BatchNorm2d(6).train(first_train), nn.BatchNorm2d(6).eval()])

    def forward(self, x):
        for bn in self.bns:
            x = bn(x.transpose(1, 2).unsqueeze(-1)).squeeze(-1).transpose(1, 2)
        return x


@pytest.mark.parametrize("first_train", [False, True], ids=["eval_eval", "train_eval"])
def test_torch_aot_batchnorm2d_eval_after_batchnorm2d_gradients_differ_without_fcall(first_train):
    """torch bug, not fcall's (issue 15, point 14): a plain compiled module, no swap,
    no fcall: under aot_eager the first BatchNorm2d's weight and bias gradients differ
    from eager in every element; the second one's agree, and so does the eager backend.
    So generators.module_specs turns such a second BatchNorm2d to train mode for AOT
    backends (BN2D_EVAL_AFTER_BN2D_BACKENDS). When this test fails, torch is fixed:
    widen that."""
    grads = {}
    for backend in ("none", "eager", "aot_eager"):
        torch.manual_seed(0)
        model = _TwoBatchNorm2d(first_train)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_()
        run = model if backend == "none" else torch.compile(model, backend=backend, fullgraph=True)
        torch._dynamo.reset()
        run(torch.randn(2, 3, 6, generator=torch.Generator().manual_seed(1))).sum().backward()
        grads[backend] = [p.grad for p in model.parameters()]
    for got, expected in zip(grads["eager"], grads["none"]):
        torch.testing.assert_close(got, expected)
    first_weight, first_bias, *second = grads["aot_eager"]
    for got, expected in zip(second, grads["none"][2:]):
        torch.testing.assert_close(got, expected)
    for got, expected in ((first_weight, grads["none"][0]), (first_bias, grads["none"][1])):
        assert not torch.isclose(got, expected, rtol=1e-3, atol=1e-3).any()


def test_generator_never_draws_a_batchnorm2d_eval_after_a_batchnorm2d_for_aot():
    from . import generators as gen

    spec = {
        "body": {
            "container": "seq",
            "children": [
                {"kind": "bn2d", "train": False},
                {"kind": "dropout"},
                {"kind": "bn2d", "train": False},
                {"kind": "tanh"},
                {"kind": "bn2d", "train": False},
            ],
        }
    }
    gen._no_bn2d_eval_after_bn2d(spec)
    assert [b.get("train") for _, b in gen.block_refs(spec)] == [False, None, True, None, False]


class _AttentionThenBatchNorm2d(nn.Module):
    """A MultiheadAttention, then a BatchNorm2d on ``x.transpose(1, 2).unsqueeze(-1)``,
    as the generator's blocks run them."""

    def __init__(self, train: bool):
        super().__init__()
        self.mha = nn.MultiheadAttention(4, 2, batch_first=True)
        self.bn = nn.BatchNorm2d(4).train(train)

    def forward(self, x):
        x = self.mha(x, x, x, need_weights=False)[0]
        return self.bn(x.transpose(1, 2).unsqueeze(-1)).squeeze(-1).transpose(1, 2)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_torch_aot_batchnorm2d_after_attention_backward_fails_without_fcall(train):
    """torch bug, not fcall's (found by the deep profile, issue 15): a plain compiled
    module, no swap, no fcall: under aot_eager the backward through a MultiheadAttention
    followed by a BatchNorm2d fails with "view size is not compatible"; eager and the
    eager backend run it. So generators.module_specs turns such a BatchNorm2d into a
    LayerNorm for AOT backends (BN2D_AFTER_BACKENDS). When this test fails, torch
    is fixed: widen that."""
    x = torch.randn(2, 3, 4)
    for backend in ("none", "eager"):
        torch.manual_seed(0)
        model = _AttentionThenBatchNorm2d(train)
        run = model if backend == "none" else torch.compile(model, backend=backend, fullgraph=True)
        torch._dynamo.reset()
        run(x).sum().backward()
    torch._dynamo.reset()
    run = torch.compile(_AttentionThenBatchNorm2d(train), backend="aot_eager", fullgraph=True)
    if DYNAMO_2_11:  # the bug came with torch 2.12
        run(x).sum().backward()
        return
    with pytest.raises(RuntimeError, match=re.escape(checks.KNOWN_AOT_ERROR)):
        run(x).sum().backward()


class _ConvThenBatchNorm2d(nn.Module):
    """A Conv1d, a BatchNorm2d and a per-feature buffer multiply, as the generator's
    blocks and its ``scale`` buffer run them."""

    def __init__(self, train: bool):
        super().__init__()
        self.conv = nn.Conv1d(2, 2, 3, padding=1)
        self.bn = nn.BatchNorm2d(2).train(train)
        self.register_buffer("scale", torch.rand(2) + 0.5)

    def forward(self, x):
        x = self.conv(x.transpose(1, 2)).transpose(1, 2)
        x = self.bn(x.transpose(1, 2).unsqueeze(-1)).squeeze(-1).transpose(1, 2)
        return x * self.scale


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_torch_aot_batchnorm2d_after_a_convolution_gradients_differ_without_fcall(train):
    """torch bug, not fcall's (found by the deep profile, issue 15): a plain compiled
    module, no swap, no fcall: under aot_eager the weight gradients of a Conv1d ->
    BatchNorm2d -> buffer multiply differ from eager; the eager backend agrees. Not generated for
    AOT backends (BN2D_AFTER_BACKENDS). When this test fails, torch is fixed: widen that."""
    grads = {}
    for backend in ("none", "eager", "aot_eager"):
        torch.manual_seed(0)
        model = _ConvThenBatchNorm2d(train)
        run = model if backend == "none" else torch.compile(model, backend=backend, fullgraph=True)
        torch._dynamo.reset()
        x = torch.randn(2, 3, 2, generator=torch.Generator().manual_seed(1))
        run(x).sum().backward()
        grads[backend] = [p.grad for p in model.parameters()]
    for got, expected in zip(grads["eager"], grads["none"]):
        torch.testing.assert_close(got, expected)
    conv_weight, _, bn_weight, _ = grads["aot_eager"]
    # (in train mode the conv bias's gradient is ~0 either way: BatchNorm takes it out)
    for got, expected in ((conv_weight, grads["none"][0]), (bn_weight, grads["none"][2])):
        # the bug came with torch 2.12
        assert torch.allclose(got, expected, rtol=1e-3, atol=1e-3) == DYNAMO_2_11


def test_generator_never_draws_a_batchnorm2d_after_attention_or_convolution_for_aot():
    from . import generators as gen

    spec = {
        "body": {
            "container": "seq",
            "children": [
                {"kind": "mha"},
                {"kind": "dropout"},
                {"kind": "bn2d", "train": False},
                {"kind": "mha"},
                {"kind": "linear"},
                {"kind": "bn2d", "train": True},
                {"kind": "conv1d"},
                {"kind": "tanh"},
                {"kind": "bn2d", "train": True},
                {"kind": "conv2d"},
                {"kind": "bn2d", "train": False},
            ],
        }
    }
    gen._no_bn2d_after_bad_inputs(spec)
    kinds = [b["kind"] for _, b in gen.block_refs(spec)]
    assert kinds == [
        "mha", "dropout", "layernorm", "mha", "linear", "bn2d",
        "conv1d", "tanh", "layernorm", "conv2d", "layernorm",
    ]  # fmt: skip
    assert "train" not in gen.block_refs(spec)[2][1]


def test_swap_dest_swapped_back_in_the_trace_is_an_exact_undo():
    """Found by the deep profile (seed 4293882413): to_module(preserve_module_state=False)
    into swap_dest moves a buffer that gets a Parameter into _parameters; swapping the
    swap_dest back inside the same compiled step must undo that exactly, as in eager."""
    spec = {
        "body": {"children": [{"kind": "linear"}], "container": "seq"},
        "buffers": "persistent",
        "dtype": "float32",
        "features": 2,
        "frozen": [],
        "heads": 1,
        "seed": 0,
        "tie": False,
    }
    kw = {
        "inplace": None,
        "non_blocking": False,
        "preserve_module_state": False,
        "swap_dest": "td",
        "use_state_dict": True,
    }
    use = {"api": "to_module", "entry": "step", "form": "manual", "kw": kw, "vmap": False}
    pspec = {"container": "tdparams", "drop_alias": False, "kinds": ["param"], "seed": 0}
    checks.check_parity(spec, pspec, use, "eager")


@pytest.mark.parametrize("backend", ("eager", "aot_eager"))
def test_strict_with_a_submodule_at_two_paths_swaps_it_once(backend):
    # Found by the deep parity run: with strict=True, the traced walk of the module saw
    # the shared submodule's tensors under two names without asking the tie marks, so
    # the plan did not know its two entries name one slot. The second entry then read
    # the first one's new value as its old one: the module kept a swapped-in Parameter.
    spec = {
        "body": {"children": [{"kind": "linear"}], "container": "seq"},
        "buffers": "none",
        "dtype": "float32",
        "features": 2,
        "frozen": [0],
        "heads": 1,
        "seed": 0,
        "shared": True,
        "tie": False,
        "tie_later": False,
    }
    pspec = {"container": "td", "drop_alias": False, "kinds": ["param"], "seed": 0}
    use = {
        "api": "functional_call",
        "entry": "step",
        "kw": {"strict": True, "tie_weights": True},
        "vmap": False,
    }
    checks.check_instances(spec, pspec, use, backend, instances=2)


def test_generator_draws_a_tensor_to_vmap_over_when_asked():
    """The deep profile once drew, for test_parity_under_vmap, a model whose only block was a
    Dropout: no parameter and no buffer, so torch.vmap had nothing to map over and raised in
    the eager reference itself. With needs_tensors the generator gives such a tree a buffer."""
    from hypothesis import find, given, settings

    from . import generators as gen

    def tensors(spec) -> list:
        module = gen.build_module(spec)
        return [*module.parameters(), *module.buffers()]

    # without the option such a model is drawn (the case is real)
    empty = find(gen.module_specs("eager", kinds=gen.STATELESS_BLOCKS), lambda s: not tensors(s))
    assert not tensors(empty)

    @settings(max_examples=40, deadline=None, database=None)
    @given(spec=gen.module_specs("eager", kinds=gen.STATELESS_BLOCKS, needs_tensors=True))
    def check(spec):
        assert tensors(spec), spec

    check()


def test_dynamo_crashes_on_a_gone_aliasing_source_for_torch_func():
    """Dynamo's own crash that the structure-change test accepts (``_dynamos_reason_crash``):
    with aliasing guards on parameters, a tie fails a cache entry's aliasing guard; once a
    parameter that guard names is deleted, Dynamo's ``recompilation_reason_for_no_tensor_
    aliasing_guard`` evaluates the gone source while wording the next recompile and raises
    ``KeyError``, here for ``torch.func.functional_call`` itself (no fcall in the frame)."""
    from .test_structure_changes import GUARDED, _change, _dynamos_reason_crash, _model, _params

    torch._dynamo.reset()
    model, x = _model([False, False], 3), torch.randn(2, 3)
    params = _params(model, "flat", 0)
    step = torch.compile(
        lambda m, p, x: torch.func.functional_call(m, p, (x,)), backend="eager", fullgraph=True
    )
    with torch._dynamo.config.patch(GUARDED):
        step(model, params, x)
        _change(model, "tie", 0, 3)
        with pytest.raises(torch._dynamo.exc.Unsupported):  # torch.func refuses the tie
            step(model, params, x)
        _change(model, "delete_parameter", 1, 3)
        with pytest.raises(KeyError) as raised:
            step(model, params, x)
    assert _dynamos_reason_crash(raised.value)


@pytest.mark.parametrize("api", ["swap", "functional_call", "to_module"])
@pytest.mark.parametrize("second", ["delete_parameter", "parameter_to_buffer"])
def test_a_tie_then_a_gone_parameter_between_compiled_calls(api, second):
    """The sequence the deep profile found (a tie, then a parameter deleted or made a buffer):
    each compiled call gives eager's outcome, or Dynamo's own crash above."""
    from .test_structure_changes import test_changes_between_compiled_calls_give_eagers_outcome

    test = test_changes_between_compiled_calls_give_eagers_outcome.hypothesis.inner_test
    test(blocks=[False, False], container="tensordict", api=api, changes=[("tie", 0), (second, 1)])
