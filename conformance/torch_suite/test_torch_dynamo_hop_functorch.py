# ruff: noqa
# fmt: off
# Vendored from PyTorch for fcall's conformance suite (see conformance/README.md, "torch").
# PyTorch is BSD-3-Clause licensed: https://github.com/pytorch/pytorch/blob/main/LICENSE
#
# Source:  https://github.com/pytorch/pytorch, test/dynamo/_higher_order_ops_test_functorch.py
#          (the functorch part of test/dynamo/test_higher_order_ops.py, split out upstream)
# Commit:  7e1d64338722bf67330f3bbf431ce0f8b930ff32 (the store has no copy at torch 2.13.0's
#          commit cf30153c4c131c8164ee7798e5022d810682e2cb; this is the stored version used)
# Edits:
#   1. This comment block and the two lines above it (ruff neither lints nor formats
#      this file).
#   2. The upstream file star-imports test/dynamo/_higher_order_ops_test_utils.py (same
#      commit); that is replaced by the explicit imports the kept code uses.
#   3. Base class torch._dynamo.test_case.TestCaseWithNestedGraphBreaks ->
#      torch._dynamo.test_case.TestCase: torch 2.13.0 has no TestCaseWithNestedGraphBreaks
#      (nor nested graph breaks on by default); the upstream test that checks that flag,
#      test_teardown_resets_nested_graph_breaks, is dropped with the rest.
#   4. Trimmed to the functional_call tests: FuncTorchHigherOrderOpTests keeps its tearDown,
#      its _compile_check helper, test_functional_call and
#      test_functional_call_sequential_params_and_buffers. Everything kept is verbatim.
#   5. `if __name__ == "__main__"` block added (the upstream helper file has none).
# Owner(s): ["module: dynamo"]
# flake8: noqa: F403,F405

import warnings

import torch
import torch._dynamo.test_case
from torch._dynamo.testing import (
    check_dynamic_shape_capture,
    EagerAndRecordGraphs,
    empty_line_normalizer,
    normalize_gm,
)
from torch.testing._internal.common_utils import TEST_WITH_TORCHDYNAMO


class FuncTorchHigherOrderOpTests(torch._dynamo.test_case.TestCase):
    def tearDown(self):
        # Ensure that in the case of a test failure, the next test won't fail
        # because of a previous call to _vmap_increment_nesting that wasn't undone
        # i.e. test_vmap_free_tensor fails when PYTORCH_TEST_WITH_DYNAMO=1
        # and the call to increment nesting is not undone
        try:
            if TEST_WITH_TORCHDYNAMO:
                warn = False
                while ci := torch._C._functorch.peek_interpreter_stack():
                    if ci.key() == torch._C._functorch.TransformType.Vmap:
                        warn = True
                        torch._C._functorch._vmap_decrement_nesting()
                    else:
                        break

                if warn:
                    msg = (
                        "Interpreter stack is not empty. Test should have called "
                        "'torch._C._functorch._vmap_decrement_nesting()'"
                    )
                    warnings.warn(msg)
        finally:
            super().tearDown()

    def _compile_check(self, fn, inputs, fullgraph=True, graph_idx=0):
        backend = EagerAndRecordGraphs()
        actual = fn(*inputs)
        expected = torch.compile(fn, backend=backend, fullgraph=fullgraph)(*inputs)

        self.assertEqual(actual, expected)

        wrapped_gm = backend.graphs[graph_idx]
        return wrapped_gm

    def test_functional_call(self):
        def wrapper_fn(model, params, inputs, targets):
            prediction = torch.func.functional_call(model, params, (inputs,))
            return torch.nn.functional.mse_loss(prediction, targets)

        model = torch.nn.Linear(3, 3)
        params = dict(model.named_parameters())
        inputs = torch.randn(64, 3)
        targets = torch.randn(64, 3)

        wrapped_gm = self._compile_check(wrapper_fn, (model, params, inputs, targets))
        # Dynamic shapes produce a slightly different graph.
        if check_dynamic_shape_capture():
            return

        actual = normalize_gm(wrapped_gm.print_readable(print_output=False))
        self.assertExpectedInline(
            actual,
            """\
class GraphModule(torch.nn.Module):
    def forward(self, L_model_parameters_weight_: "f32[3, 3]", L_model_parameters_bias_: "f32[3]", L_inputs_: "f32[64, 3]", L_targets_: "f32[64, 3]"):
        l_model_parameters_weight_ = L_model_parameters_weight_
        l_model_parameters_bias_ = L_model_parameters_bias_
        l_inputs_ = L_inputs_
        l_targets_ = L_targets_

        prediction: "f32[64, 3]" = torch._C._nn.linear(l_inputs_, l_model_parameters_weight_, l_model_parameters_bias_);  l_inputs_ = l_model_parameters_weight_ = l_model_parameters_bias_ = None

        mse_loss: "f32[]" = torch.nn.functional.mse_loss(prediction, l_targets_);  prediction = l_targets_ = None
        return (mse_loss,)
""",
        )

    def test_functional_call_sequential_params_and_buffers(self):
        # copied from test/test_stateless.py
        class MockModule(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.l1 = torch.nn.Linear(1, 1)
                self.register_buffer("buffer", torch.ones(1))
                self.foo = 0.0

            def forward(self, x):
                return self.l1(x) + self.buffer

        def wrapper_fn(model, params, buffers, inputs):
            # two separate dictionaries
            return torch.func.functional_call(model, (params, buffers), inputs)

        model = MockModule()
        params = dict(model.named_parameters())
        buffers = dict(model.named_buffers())
        inputs = torch.tensor([[1.5]])

        wrapped_gm = self._compile_check(
            wrapper_fn, (model, params, buffers, inputs), fullgraph=False
        )
        # Dynamic shapes produce a slightly different graph.
        if check_dynamic_shape_capture():
            return

        actual = normalize_gm(wrapped_gm.print_readable(print_output=False))
        expected = """\
class GraphModule(torch.nn.Module):
    def forward(self, L_inputs_: "f32[1, 1]", L_model_modules_l1_parameters_weight_: "f32[1, 1]", L_model_modules_l1_parameters_bias_: "f32[1]", L_model_buffers_buffer_: "f32[1]"):
        l_inputs_ = L_inputs_
        l_model_modules_l1_parameters_weight_ = L_model_modules_l1_parameters_weight_
        l_model_modules_l1_parameters_bias_ = L_model_modules_l1_parameters_bias_
        l_model_buffers_buffer_ = L_model_buffers_buffer_
        linear: "f32[1, 1]" = torch._C._nn.linear(l_inputs_, l_model_modules_l1_parameters_weight_, l_model_modules_l1_parameters_bias_);  l_inputs_ = l_model_modules_l1_parameters_weight_ = l_model_modules_l1_parameters_bias_ = None
        add: "f32[1, 1]" = linear + l_model_buffers_buffer_;  linear = l_model_buffers_buffer_ = None
        return (add,)
"""
        # We found Windows/Linux have some empty line difference, empty_line_normalizer will help fix it.
        self.assertExpectedInline(
            empty_line_normalizer(actual),
            empty_line_normalizer(normalize_gm(expected)),
        )


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
