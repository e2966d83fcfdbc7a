"""Errors, eager (issue 2, rule a): validated before anything is written, messages pinned.

In every error case the module must hold the very same objects, in the same dicts,
in the same order, with the same flags. The compiled twins of these checks are in
compile_tests/test_core_compile.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch
from tensordict import TensorDict
from torch import nn

import fcall
from tests.support import (
    Net,
    assert_same_state,
    state,
)


def values_before(module: nn.Module) -> TensorDict:
    return fcall.from_module(module).detach().clone()


def call_swap(params, module, **kwargs):
    with fcall.swap(params, module, **kwargs):
        raise AssertionError("the block must not run")


def call_functional(params, module, **kwargs):
    # fcall's strict keyword: torch.func's default sets an unknown key as an attribute
    # (tests/test_functional_call_peer.py compares that with torch.func).
    kwargs.setdefault("unknown_keys", "raise")
    return fcall.functional_call(module, params, (torch.randn(2, 3),), **kwargs)


APIS: dict[str, Callable] = {
    "to_module": fcall.to_module,
    "swap": call_swap,
    "functional_call": call_functional,
}

UNKNOWN = (
    "fcall.{api}: 'lin.wieght' names no parameter or buffer of Net (the nearest existing "
    "keys: 'lin.weight', 'bn.weight', 'lin.bias'). Keys must match "
    "module.named_parameters() / named_buffers(). The module was left unchanged."
)


def raises_and_unchanged(module, exc, message, fn, *args, **kwargs):
    before, values = state(module), values_before(module)
    with pytest.raises(exc, match=re.escape(message)) as raised:
        fn(*args, **kwargs)
    # the API's own error: the core's Fault is worded by the front, not chained to it
    assert raised.value.__context__ is None and raised.value.__cause__ is None
    assert_same_state(module, before)
    torch.testing.assert_close(values_before(module), values)


@pytest.mark.parametrize("api", list(APIS))
@pytest.mark.parametrize(
    "params",
    [
        {"bn.weight": torch.zeros(4), "lin.wieght": torch.zeros(4, 3)},
        {"bn": {"weight": torch.zeros(4)}, "lin": {"wieght": torch.zeros(4, 3)}},
        TensorDict({"bn": {"weight": torch.zeros(4)}, "lin": {"wieght": torch.zeros(4, 3)}}),
    ],
    ids=["flat-dict", "nested-dict", "tensordict"],
)
def test_unknown_key_is_a_key_error_naming_the_nearest_keys(api, params):
    m = Net()
    raises_and_unchanged(m, KeyError, UNKNOWN.format(api=api), APIS[api], params, m)


@pytest.mark.parametrize(
    "key, nearest",
    [
        ("lni.weight", "'lin.weight', 'bn.weight', 'lin.bias'"),
        ("lin.weight.x", "'lin.weight', 'bn.weight', 'lin.bias'"),
        ("lin", "'lin.bias', 'lin.weight', 'bn.running_var'"),
        ("training", "'bn.running_var', 'lin.weight', 'bn.running_mean'"),
    ],
)
def test_unknown_submodule_or_attribute_is_a_key_error(key, nearest):
    m = Net()
    msg = (
        f"fcall.to_module: {key!r} names no parameter or buffer of Net "
        f"(the nearest existing keys: {nearest})."
    )
    raises_and_unchanged(m, KeyError, msg, fcall.to_module, {key: torch.zeros(1)}, m)


def test_unknown_key_of_a_compiled_module_names_the_unprefixed_keys():
    m = torch.compile(nn.Linear(2, 2), backend="eager")
    msg = "fcall.to_module: 'wieght' names no parameter or buffer of Linear"
    raises_and_unchanged(m, KeyError, msg, fcall.to_module, {"_orig_mod.wieght": torch.ones(1)}, m)


@pytest.mark.parametrize("api", list(APIS))
@pytest.mark.parametrize(
    "params, type_name",
    [
        ({"lin.weight": torch.zeros(4, 3), "lin.bias": 3}, "int"),
        ({"lin": {"weight": torch.zeros(4, 3), "bias": [1.0]}}, "list"),
        (TensorDict({"lin": {"weight": torch.zeros(4, 3), "bias": "x"}}), "str"),
    ],
    ids=["int", "list", "non-tensor-data"],
)
def test_non_tensor_leaf_is_a_type_error_naming_the_key(api, params, type_name):
    m = Net()
    msg = (
        f"fcall.{api}: the value at 'lin.bias' is a {type_name}, expected a torch.Tensor. "
        "Only tensors can be swapped into a module; remove the entry or convert it to a "
        "tensor. The module was left unchanged."
    )
    raises_and_unchanged(m, TypeError, msg, APIS[api], params, m)


@pytest.mark.parametrize("memo", [{}, object()])
def test_memo_is_a_runtime_error(memo):
    m = Net()
    msg = "fcall.to_module: memo cannot be passed to the public to_module anymore."
    params = {"lin.weight": torch.zeros(4, 3)}
    raises_and_unchanged(m, RuntimeError, msg, fcall.to_module, params, m, memo=memo)


@pytest.mark.parametrize("api, position", [("to_module", "second"), ("swap", "second")])
def test_target_not_a_module_is_a_type_error(api, position):
    msg = (
        f"fcall.{api}: expected an nn.Module to swap parameters into, got Linear2. "
        f"Pass the module as the {position} argument."
    )

    class Linear2:
        weight = torch.zeros(2, 2)

    target = Linear2()
    with pytest.raises(TypeError, match=re.escape(msg)):
        APIS[api]({"weight": torch.ones(2, 2)}, target)
    assert (target.weight == 0).all()


def test_functional_call_target_not_a_module_is_a_type_error():
    msg = (
        "fcall.functional_call: expected an nn.Module to swap parameters into, got dict. "
        "Pass the module as the first argument."
    )
    with pytest.raises(TypeError, match=re.escape(msg)):
        fcall.functional_call({"weight": torch.ones(2)}, nn.Linear(2, 2), ())


def test_from_module_target_not_a_module_is_a_type_error():
    msg = "fcall.from_module: expected an nn.Module to read parameters from, got int."
    with pytest.raises(TypeError, match=re.escape(msg)):
        fcall.from_module(3)


@pytest.mark.parametrize("api", list(APIS))
def test_params_of_the_wrong_type_is_a_type_error(api):
    m = Net()
    if api == "functional_call":  # a list is torch.func's (params, buffers) form there
        msg = (
            "fcall.functional_call: params is a tuple or list, so each of its elements must "
            "be a dict of tensors (as torch.func.functional_call's (params, buffers) form), "
            "but element 0 is of type Tensor. Pass dicts, or one dict. The module was left "
            "unchanged."
        )
        raises_and_unchanged(m, ValueError, msg, APIS[api], [torch.zeros(1)], m)
        return
    msg = (
        f"fcall.{api}: expected params to be a TensorDict, a TensorDictParams or a dict "
        "of tensors, got list."
    )
    raises_and_unchanged(m, TypeError, msg, APIS[api], [torch.zeros(1)], m)


@pytest.mark.parametrize("inplace", [True, False])
def test_inplace_with_use_state_dict_is_a_runtime_error(inplace):
    m = Net()
    msg = "fcall.to_module: inplace argument cannot be passed when use_state_dict=True."
    params = {"lin.weight": torch.zeros(4, 3)}
    raises_and_unchanged(
        m, RuntimeError, msg, fcall.to_module, params, m, inplace=inplace, use_state_dict=True
    )


def test_use_state_dict_unknown_key_leaves_the_module_unchanged():
    m = Net()
    params = {"bn.weight": torch.zeros(4), "lin.wieght": torch.zeros(4, 3)}
    msg = UNKNOWN.format(api="to_module")
    raises_and_unchanged(m, KeyError, msg, fcall.to_module, params, m, use_state_dict=True)


def test_inplace_shape_mismatch_on_a_later_key_copies_nothing():
    m = Net()
    msg = (
        "fcall.to_module(inplace=True): the value at 'lin.bias' has shape (3,), which cannot "
        "be copied into the module's tensor of shape (4,). Give a tensor of shape (4,). "
        "The module was left unchanged."
    )
    params = {"lin.weight": torch.zeros(4, 3), "lin.bias": torch.zeros(3)}
    raises_and_unchanged(m, RuntimeError, msg, fcall.to_module, params, m, inplace=True)


def test_inplace_into_a_none_slot_is_a_value_error():
    m = nn.Linear(2, 2, bias=False)
    m.register_parameter("bias", None)
    msg = (
        "fcall.to_module(inplace=True): the module holds None at 'bias', so there is nothing "
        "to copy into. Swap without inplace=True to set it. The module was left unchanged."
    )
    params = {"weight": torch.zeros(2, 2), "bias": torch.zeros(2)}
    raises_and_unchanged(m, ValueError, msg, fcall.to_module, params, m, inplace=True)


def test_swap_dest_of_the_wrong_type_is_a_type_error():
    m = Net()
    msg = (
        "fcall.to_module: swap_dest must be a TensorDict (it is returned and restores the "
        "module in `with`), got list."
    )
    params = {"lin.weight": torch.zeros(4, 3)}
    raises_and_unchanged(m, TypeError, msg, fcall.to_module, params, m, swap_dest=[])


def test_integer_value_for_a_trainable_parameter_fails_and_undoes_the_writes_made():
    # preserve_module_state=True wraps a plain value in a Parameter that requires
    # grad: torch refuses integer dtypes. The conversion runs in the write loop, after
    # bn.running_mean was written: that write is undone.
    m = Net()
    params = {"bn.running_mean": torch.ones(4), "lin.weight": torch.zeros(4, 3, dtype=torch.long)}
    msg = "Only Tensors of floating point and complex dtype can require gradients"
    raises_and_unchanged(m, RuntimeError, msg, fcall.to_module, params, m)


def test_a_none_slot_takes_a_value_and_the_documented_pattern_puts_none_back():
    m = nn.Linear(2, 2, bias=False)
    before = state(m)
    bias = torch.ones(2)
    with fcall.to_module({"bias": bias}, m) as old:
        assert (m(torch.zeros(2)) == 1).all()
        assert m._parameters["bias"] is bias  # no old requires_grad to copy: as it is
        assert old.get("bias") is None
    assert_same_state(m, before)
    old = fcall.to_module({"bias": torch.ones(2)}, m)
    fcall.to_module(old, m)
    assert m.bias is None
    assert_same_state(m, before)


@pytest.mark.parametrize("preserve", [True, False])
def test_none_value_empties_a_slot_like_torch_functional_call(preserve):
    m = nn.Linear(2, 2)
    before = state(m)
    x = torch.ones(2)
    with fcall.to_module({"bias": None}, m, preserve_module_state=preserve):
        assert m.bias is None
        torch.testing.assert_close(m(x), torch.func.functional_call(m, {"bias": None}, (x,)))
    assert_same_state(m, before)
    with fcall.swap({"bias": None}, m):
        assert m.bias is None
    assert_same_state(m, before)


def test_none_value_with_inplace_is_a_type_error():
    m = nn.Linear(2, 2)
    msg = "fcall.to_module: the value at 'bias' is a NoneType, expected a torch.Tensor."
    params = {"weight": torch.zeros(2, 2), "bias": None}
    raises_and_unchanged(m, TypeError, msg, fcall.to_module, params, m, inplace=True)


def test_an_error_of_the_forward_with_attribute_keys_chains_to_nothing():
    # torch.func's attribute keys: the forward runs once the swap is in, not while fcall
    # handles the unknown key, so its error is the user's alone
    class Fails(nn.Linear):
        def forward(self, x):
            raise ValueError("the forward's own")

    m = Fails(3, 4)
    before = state(m)
    with pytest.raises(ValueError, match="the forward's own") as raised:
        params = {"weight": torch.zeros(4, 3), "extra": torch.ones(1)}
        fcall.functional_call(m, params, (torch.ones(3),))
    assert raised.value.__context__ is None
    assert_same_state(m, before)


def test_a_container_changed_in_the_block_fails_the_write_back_with_fcalls_error():
    # The write-back walks the params again (a buffer reassigned in the block goes back into
    # them); a non-tensor put into them meanwhile is worded as fcall's, never a bare Fault.
    m = nn.Module()
    m.register_buffer("count", torch.zeros(1))
    params = TensorDict({"count": torch.ones(1)})
    before = state(m)
    with pytest.raises(TypeError, match=r"^fcall: the value at 'junk' is a ") as raised:
        with fcall.swap(params, m):
            m.count = m.count + 1  # reassigned: written back on exit
            params["junk"] = "not a tensor"
    assert type(raised.value) is TypeError
    assert_same_state(m, before)
