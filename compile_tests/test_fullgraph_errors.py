"""What a bad key shows under ``fullgraph=True`` (issue 15, point 12).

Dynamo turns an exception that leaves a ``fullgraph=True`` region into ``Unsupported:
Observed exception``; the exception itself, with fcall's whole message, is in the line
``Developer debug context: raised exception UnknownKey(...)`` (fcall's ``KeyError`` subclass)
and in ``__cause__``. That is
all Dynamo 2.13 lets through, and it needs the message to be made while tracing: the
nearest names are computed by a function Dynamo runs rather than traces
(``assume_constant_result``), not a ``torch.compiler.disable``-d one, whose call
``fullgraph=True`` refuses before any message exists. See docs/faq.md.
"""

from __future__ import annotations

import re

import pytest
import torch
from tensordict import TensorDict
from torch._dynamo.exc import Unsupported

import fcall
from fcall._errors import UnknownKey
from tests.support import DYNAMO_2_11, Net, assert_same_state, raised_in_trace, state
from tests.test_errors import UNKNOWN  # the eager message, pinned there

NOT_A_TENSOR = (
    "fcall.{api}: the value at 'lin.bias' is a int, expected a torch.Tensor. Only tensors "
    "can be swapped into a module; remove the entry or convert it to a tensor. The module "
    "was left unchanged."
)


def call(api, params, m, x):
    if api == "functional_call":  # torch.func's default sets an unknown key as an attribute
        return fcall.functional_call(m, params, (x,), unknown_keys="raise")
    with (fcall.swap if api == "swap" else fcall.to_module)(params, m):
        return m(x)


def bad_key(x):
    return {"bn": {"weight": torch.zeros(4)}, "lin": {"wieght": x}}


APIS = ["swap", "to_module", "functional_call"]


@pytest.mark.parametrize("api", APIS)
def test_unknown_key_under_fullgraph_shows_the_eager_message(counter, api):
    m = Net()
    before = state(m)
    fn = torch.compile(lambda x: call(api, bad_key(x), m, x), backend=counter(), fullgraph=True)
    with pytest.raises(Unsupported) as raised:
        fn(torch.zeros(4, 3))
    message = UNKNOWN.format(api=api)
    text = str(raised.value)
    assert text.splitlines()[0] == "Observed exception"
    assert f"Developer debug context: {raised_in_trace(UnknownKey(message))}" in text
    assert issubclass(UnknownKey, KeyError)
    assert "torch.compiler.disable" not in text
    cause = raised.value.__cause__
    assert type(cause).__name__ == "ObservedUnknownKeyError"
    assert DYNAMO_2_11 or message in str(cause)  # 2.11: "...ObjectVariable(UnknownKey)"
    assert_same_state(m, before)


@pytest.mark.parametrize("api", APIS)
def test_unknown_key_without_fullgraph_is_the_eager_key_error(counter, api):
    m = Net()
    before = state(m)
    fn = torch.compile(lambda x: call(api, bad_key(x), m, x), backend=counter())
    with pytest.raises(KeyError, match=re.escape(UNKNOWN.format(api=api))):
        fn(torch.zeros(4, 3))
    assert_same_state(m, before)


@pytest.mark.parametrize("api", APIS)
def test_non_tensor_value_under_fullgraph_shows_the_eager_message(counter, api):
    m = Net()
    before = state(m)
    params = TensorDict(lin=TensorDict(weight=torch.zeros(4, 3)))

    def f(x):
        return call(api, {"lin": {"weight": x, "bias": 3}}, m, x)

    fn = torch.compile(f, backend=counter(), fullgraph=True)
    with pytest.raises(Unsupported) as raised:
        fn(params["lin", "weight"])
    message = NOT_A_TENSOR.format(api=api)
    if api == "functional_call":  # torch.func's own words first
        message = "3 is not an instance of torch.Tensor\n" + message
    assert raised_in_trace(TypeError(message)) in str(raised.value)
    assert_same_state(m, before)
