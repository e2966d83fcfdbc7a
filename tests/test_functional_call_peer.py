"""fcall.functional_call against torch.func.functional_call where torch's own tests found
them apart (issue 25, points 1-4): each case is built with both, and compared.

The vendored torch suite (``conformance/torch_suite``) runs torch's own tests through fcall;
these pin each point in fcall's suite, with the module's exact state after every call.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import fcall
from tests.support import assert_same_state, state

CALLS = {"torch.func": torch.func.functional_call, "fcall": fcall.functional_call}


class Scaled(nn.Module):
    """``forward`` reads an attribute that only a functional_call key provides."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


class CountsParameters(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * len(list(self.parameters()))


class Reassigns(nn.Module):
    """``forward`` reassigns its buffer (torch.func writes the new value back into params)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count = self.count + 1
        return x * getattr(self, "extra", 1.0)


# --- 1. unknown keys ------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CALLS))
def test_an_unknown_key_is_an_attribute_for_the_call(name):
    m, x = Scaled(), torch.randn(3, 2)
    before = state(m)
    out = CALLS[name](m, {"scale": torch.tensor(3.0)}, (x,))
    torch.testing.assert_close(out, m.lin(x) * 3.0)
    assert not hasattr(m, "scale")
    assert_same_state(m, before)


@pytest.mark.parametrize("name", list(CALLS))
def test_an_unknown_parameter_key_registers_for_the_call(name):
    m = CountsParameters()
    before = state(m)
    out = CALLS[name](m, {"extra": nn.Parameter(torch.ones(1))}, (torch.ones(1),))
    assert out.item() == 3.0  # lin.weight, lin.bias and extra
    assert "extra" not in dict(m.named_parameters())
    assert_same_state(m, before)


@pytest.mark.parametrize("name", list(CALLS))
def test_an_unknown_key_next_to_known_ones(name):
    m, x = Scaled(), torch.randn(3, 2)
    w = torch.randn(2, 2)
    out = CALLS[name](m, {"lin.weight": w, "scale": torch.tensor(2.0)}, (x,))
    torch.testing.assert_close(out, (x @ w.T + m.lin.bias) * 2.0)


def _raised(call, *args, **kwargs):
    with pytest.raises(Exception) as info:
        call(*args, **kwargs)
    return info.value


@pytest.mark.parametrize(
    "params, exc",
    [
        ({"missing.extra": torch.ones(1)}, AttributeError),  # no such submodule
        ({"lin.in_features": torch.ones(1)}, TypeError),  # an attribute that is no tensor
        ({"lin.extra": 3.0}, TypeError),  # a value that is no tensor
    ],
    ids=["no-submodule", "non-tensor-attribute", "non-tensor-value"],
)
def test_unknown_key_errors_are_torchs(params, exc):
    m = Scaled()
    before = state(m)
    theirs = _raised(torch.func.functional_call, m, params, (torch.ones(2),))
    ours = _raised(fcall.functional_call, m, params, (torch.ones(2),))
    assert type(ours) is type(theirs) is exc
    assert str(ours) == str(theirs) or str(ours).startswith(str(theirs) + "\nfcall.")
    assert_same_state(m, before)


def test_strict_unexpected_and_missing_keys_raise_torchs_runtime_error():
    m = nn.Linear(1, 1)
    before = state(m)
    params = {"weight": torch.ones(1, 1), "extra": torch.ones(1)}
    theirs = _raised(torch.func.functional_call, m, params, (torch.ones(1, 1),), strict=True)
    ours = _raised(fcall.functional_call, m, params, (torch.ones(1, 1),), strict=True)
    assert type(ours) is type(theirs) is RuntimeError
    assert str(ours).startswith(str(theirs) + "\nfcall.functional_call(strict=True): ")
    assert str(ours).endswith("The module was left unchanged.")
    assert_same_state(m, before)


def test_unknown_keys_raise_asks_for_fcalls_key_error():
    m = Scaled()
    before = state(m)
    with pytest.raises(KeyError, match=re.escape("'lin.wieght' names no parameter or buffer")):
        fcall.functional_call(
            m, {"lin.wieght": torch.ones(2, 2)}, (torch.ones(2),), unknown_keys="raise"
        )
    assert_same_state(m, before)


def test_a_key_written_back_by_forward_reaches_the_callers_dict():
    for call in CALLS.values():
        m = Reassigns()
        params = {"count": torch.zeros(()), "extra": torch.tensor(2.0)}
        call(m, params, (torch.ones(1),))
        assert params["count"].item() == 1.0 and m.count.item() == 0.0


@pytest.mark.parametrize("container", ["nested-dict", "TensorDict"])
@pytest.mark.parametrize("extra", [False, True], ids=["known-keys", "with-an-extra-key"])
def test_a_key_written_back_by_forward_reaches_a_nested_container(container, extra):
    """fcall's nested containers (torch.func takes flat dicts only) get the reassigned value
    whether or not some key is an attribute for the call: one write-back serves both."""
    from tensordict import TensorDict

    m = nn.Sequential(Reassigns())
    inner = {"count": torch.zeros(())} | ({"extra": torch.tensor(2.0)} if extra else {})
    params = {"0": inner} if container == "nested-dict" else TensorDict({"0": inner})
    out = fcall.functional_call(m, params, (torch.ones(1),))
    assert out.item() == (2.0 if extra else 1.0)
    assert params["0"]["count"].item() == 1.0 and m[0].count.item() == 0.0
    assert not hasattr(m[0], "extra")


# --- 2. a module with a reference cycle ------------------------------------------------------


@pytest.mark.parametrize("name", list(CALLS))
def test_a_module_with_a_reference_cycle(name):
    m = nn.Sequential(nn.Linear(1, 1))
    m[0].m = m
    before = state(m, remove_duplicate=True)
    w = torch.full((1, 1), 2.0)
    out = CALLS[name](
        m, {"0.weight": w, "0.bias": torch.zeros(1)}, (torch.ones(1, 1),), tie_weights=False
    )
    assert out.item() == 2.0
    assert_same_state(m, before, remove_duplicate=True)


@pytest.mark.parametrize("api", ["swap", "functional_call-tied"])
def test_fcall_also_swaps_a_cycle_with_tie_weights(api):
    """torch.func's tie_weights=True walk recurses forever on a cycle; fcall's stops."""
    m = nn.Sequential(nn.Linear(1, 1))
    m[0].m = m
    params = {"0.weight": torch.full((1, 1), 2.0), "0.bias": torch.zeros(1)}
    if api == "swap":
        with fcall.swap(params, m):
            out = m(torch.ones(1, 1))
    else:
        out = fcall.functional_call(m, params, (torch.ones(1, 1),))
    assert out.item() == 2.0


# --- 3. error messages torch's tests match ------------------------------------------------


def test_a_scripted_module_error_has_torchs_words():
    m = torch.jit.script(nn.Linear(1, 1))
    theirs = _raised(torch.func.functional_call, m, {}, (torch.ones(1),))
    ours = _raised(fcall.functional_call, m, {}, (torch.ones(1),))
    assert type(ours) is type(theirs) is RuntimeError
    assert str(ours).startswith(str(theirs) + ".\nfcall.functional_call: ")


def test_tied_conflict_error_has_torchs_words():
    m = nn.Sequential(nn.Linear(1, 1, bias=False), nn.Linear(1, 1, bias=False))
    m[1].weight = m[0].weight
    params = {"0.weight": torch.ones(1, 1), "1.weight": torch.zeros(1, 1)}
    theirs = _raised(torch.func.functional_call, m, params, (torch.ones(1),))
    ours = _raised(fcall.functional_call, m, params, (torch.ones(1),))
    assert type(ours) is type(theirs) is ValueError
    assert str(ours).startswith(str(theirs) + "\nfcall.functional_call: ")


def test_a_key_in_two_dicts_error_has_torchs_words():
    m = nn.Linear(1, 1)
    dicts = ({"weight": torch.ones(1, 1)}, {"weight": torch.ones(1, 1)})
    theirs = _raised(torch.func.functional_call, m, dicts, (torch.ones(1),))
    ours = _raised(fcall.functional_call, m, dicts, (torch.ones(1),))
    assert type(ours) is type(theirs) is ValueError
    assert str(ours).startswith(str(theirs) + ".\nfcall.functional_call: ")


def test_params_of_another_type_error_has_torchs_words():
    m = nn.Linear(1, 1)
    theirs = _raised(torch.func.functional_call, m, 3, (torch.ones(1),))
    ours = _raised(fcall.functional_call, m, 3, (torch.ones(1),))
    assert type(ours) is type(theirs) is ValueError
    assert str(ours).startswith(str(theirs) + ".\nfcall.functional_call: ")


# --- 4. args=None ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CALLS))
def test_args_none_means_no_positional_argument(name):
    m, x = nn.Linear(2, 2), torch.randn(3, 2)
    out = CALLS[name](m, {}, None, {"input": x})
    torch.testing.assert_close(out, m(x))


def test_args_default_is_none_as_torchs():
    class NoArgs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(()))

        def forward(self) -> torch.Tensor:
            return self.w * 2

    for call in CALLS.values():
        assert call(NoArgs(), {"w": torch.tensor(3.0)}).item() == 6.0


def test_unknown_keys_takes_one_of_two_values():
    m = nn.Linear(1, 1)
    message = (
        "fcall.functional_call: unknown_keys must be 'attribute' (torch.func's behaviour) or "
        "'raise', got 'Raise'."
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        fcall.functional_call(m, {}, (torch.ones(1),), unknown_keys="Raise")


def test_strict_checks_keys_before_looking_for_a_missing_submodule():
    m = nn.Linear(1, 1)
    params = {"weight": torch.ones(1, 1), "bias": torch.ones(1), "missing.extra": torch.ones(1)}
    theirs = _raised(torch.func.functional_call, m, params, (torch.ones(1, 1),), strict=True)
    ours = _raised(fcall.functional_call, m, params, (torch.ones(1, 1),), strict=True)
    assert type(ours) is type(theirs) is RuntimeError
    assert str(ours).startswith(str(theirs) + "\nfcall.functional_call(strict=True): ")


def test_an_empty_name_is_refused_with_torchs_key_error():
    ours, peer = nn.Linear(2, 2), nn.Linear(2, 2)
    before = state(ours)
    with pytest.raises(KeyError) as expected:
        torch.func.functional_call(peer, {"": torch.ones(2)}, (torch.ones(2),))
    with pytest.raises(KeyError) as got:
        fcall.functional_call(ours, {"": torch.ones(2)}, (torch.ones(2),))
    assert str(got.value) == str(expected.value) == "'tensor name can\\'t be empty string \"\"'"
    assert_same_state(ours, before)
    assert "" not in ours.__dict__


def test_a_first_class_dim_value_is_named_by_its_type():
    functorch_dim = pytest.importorskip("functorch.dim")
    value = torch.randn(2, 2)[functorch_dim.dims(1)]
    m = nn.Linear(2, 2)
    before = state(m)
    with pytest.raises(TypeError) as expected:
        torch.func.functional_call(m, {"weight": value}, (torch.ones(2),))
    with pytest.raises(TypeError) as got:
        fcall.functional_call(m, {"weight": value}, (torch.ones(2),))
    # torch.func's own words first (the value's repr spans lines), then fcall's
    assert str(got.value) == str(expected.value) + "\n" + (
        "fcall.functional_call: the value at 'weight' is a functorch.dim.Tensor, expected a "
        "torch.Tensor. Only tensors can be swapped into a module; remove the entry or convert "
        "it to a tensor. The module was left unchanged."
    )
    assert_same_state(m, before)
