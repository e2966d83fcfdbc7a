"""The eager express lane (fcall/_express.py): used when it fits, and when it does not,
the module is untouched and the generic path gives the very same result or error."""

from __future__ import annotations

import gc
import re
import weakref

import pytest
import torch
from support import Counter, Net, Tied, assert_same_state, state
from tensordict import TensorDict
from torch import nn

import fcall
from fcall import _api, _express, _plan


@pytest.fixture
def generic_swaps(monkeypatch: pytest.MonkeyPatch) -> list:
    """Express built at a plan's first use; the list records each generic swap."""
    monkeypatch.setattr(_express, "_OFFERS_BEFORE_BUILD", 1)
    calls: list = []
    resolve = _api._resolve

    def counted(*args, **kwargs):
        calls.append(args[0])
        return resolve(*args, **kwargs)

    monkeypatch.setattr(_api, "_resolve", counted)
    return calls


def chain(n: int = 3) -> nn.Sequential:
    return nn.Sequential(*[nn.Linear(2, 2) for _ in range(n)])


def params_of(module: nn.Module, fill: float, grad: bool = True) -> TensorDict:
    params = fcall.from_module(module).detach().clone().apply(lambda t: t.fill_(fill))
    return params.apply(nn.Parameter) if grad else params


def primed(module: nn.Module, params: TensorDict, api: str = "swap") -> None:
    """Swap ``params`` in and out until ``module`` has an express for their structure (an
    express serves the tie_weights of its plan: to_module's, or swap's and functional_call's)."""
    swap = fcall.to_module if api == "to_module" else fcall.swap
    for _ in range(2):
        with swap(params, module):
            pass
    assert _plan.current_express(module) is not None


def test_by_default_an_express_comes_with_the_256th_swap():
    model, params = chain(), params_of(chain(), 1.0)
    for _ in range(_express._OFFERS_BEFORE_BUILD - 1):
        with fcall.swap(params, model):
            pass
    assert _plan.current_express(model) is None  # a structure swapped a few times: no code
    with fcall.swap(params, model):
        pass
    assert _plan.current_express(model) is not None


def test_the_express_of_to_module_does_not_serve_a_swap_that_follows_ties(monkeypatch):
    # to_module's plans follow no tie (tensordict's); swap's do (torch.func's)
    monkeypatch.setattr(_express, "_OFFERS_BEFORE_BUILD", 1)
    m = Tied()
    w = torch.zeros(5, 3)
    for _ in range(3):
        with fcall.to_module(TensorDict({"emb": {"weight": w}}), m):
            assert m.head.weight is not m.emb.weight
    assert _plan.current_express(m) is not None
    with fcall.swap(TensorDict({"emb": {"weight": w}}), m):
        assert m.head.weight is w


@pytest.mark.parametrize("api", ["swap", "to_module", "functional_call"])
def test_express_swaps_in_the_values_and_restores_the_very_objects(generic_swaps, api):
    model = chain()
    own, before = fcall.from_module(model), state(model)
    params = params_of(model, 2.0)
    primed(model, params, api)
    generic_swaps.clear()
    seen = []
    for fill in (3.0, 4.0):
        other = params_of(model, fill)
        if api == "functional_call":
            out = fcall.functional_call(model, other, (torch.ones(1, 2),))
            seen.append(out)
            continue
        swap = fcall.swap if api == "swap" else fcall.to_module
        with swap(other, model) as old:
            assert model[1].weight is other["1", "weight"]
            assert old["1", "weight"] is own["1", "weight"]
            seen.append(model(torch.ones(1, 2)))
        assert_same_state(model, before)
    assert generic_swaps == []  # both swaps went through the express
    for fill, out in zip((3.0, 4.0), seen):
        flat = {name: torch.full_like(t, fill) for name, t in model.named_parameters()}
        torch.testing.assert_close(out, torch.func.functional_call(model, flat, torch.ones(1, 2)))


def test_a_tensordictparams_takes_the_express(generic_swaps):
    model = chain()
    params = fcall.TensorDictParams(params_of(model, 1.0))
    primed(model, params)
    generic_swaps.clear()
    with fcall.swap(params, model):
        assert model[0].weight is params["0", "weight"]
    assert generic_swaps == []


@pytest.mark.parametrize("api", ["swap", "to_module", "functional_call"])
@pytest.mark.parametrize("record", ["unlock_", "tensordict to_module"])
def test_a_tensordict_carrying_another_ops_record_takes_the_express(generic_swaps, api, record):
    # Only the record of an fcall swap (to_module may undo it) keeps a TensorDict off the
    # express; tensordict's own records (lock_/unlock_, its to_module) change nothing.
    model = chain()
    before = state(model)
    params = params_of(model, 1.0)
    if record == "unlock_":
        params.lock_().unlock_()
    else:  # the old values that tensordict's to_module returns
        params = params.to_module(chain())
    assert params._last_op is not None and params._last_op[0] != "_fcall_to_module"
    primed(model, params, api)
    generic_swaps.clear()
    if api == "functional_call":
        fcall.functional_call(model, params, (torch.ones(1, 2),))
    else:
        with getattr(fcall, api)(params, model):
            assert model[0].weight is params["0", "weight"]
    assert generic_swaps == []
    assert_same_state(model, before)


def test_to_module_converts_plain_tensors_like_the_generic_path(generic_swaps):
    model = chain()
    model[0].weight.requires_grad_(False)
    primed(model, params_of(model, 1.0), "to_module")
    generic_swaps.clear()
    plain = params_of(model, 2.0, grad=False)
    with fcall.to_module(plain, model):
        weight, bias = model[0].weight, model[0].bias
        assert isinstance(weight, nn.Parameter) and not weight.requires_grad
        assert isinstance(bias, nn.Parameter) and bias.requires_grad
        assert weight.data_ptr() == plain["0", "weight"].data_ptr()  # no copy
    assert generic_swaps == []


def test_a_failed_conversion_leaves_the_module_as_it_was(generic_swaps):
    model = chain()
    primed(model, params_of(model, 1.0))
    before = state(model)
    integers = params_of(model, 1.0, grad=False).apply(lambda t: t.long())
    with pytest.raises(RuntimeError, match="Only Tensors of floating point"):
        fcall.to_module(integers, model)
    assert_same_state(model, before)


def test_a_reassigned_buffer_is_written_back_into_the_params(generic_swaps):
    model = Counter()
    params = fcall.from_module(model).detach().clone()
    primed(model, params)
    generic_swaps.clear()
    counted = params["count"]
    with fcall.swap(params, model):
        model(torch.ones(1, 2))
    assert generic_swaps == []
    assert params["count"] is not counted and params["count"].item() == counted.item() + 1
    assert model.count.item() == 0


def test_a_nested_exact_undo_puts_the_outer_values_back_on_exit(generic_swaps):
    model = chain()
    own = fcall.from_module(model)
    params = params_of(model, 5.0)
    primed(model, params)
    with fcall.to_module(params, model) as old:
        with fcall.to_module(old, model):
            assert model[2].bias is own["2", "bias"]
        assert model[2].bias is params["2", "bias"]
    assert model[2].bias is own["2", "bias"]


def test_a_tensordictparams_swap_dest_swapped_back_is_an_exact_undo(generic_swaps):
    model = chain()
    params = params_of(model, 1.0)
    primed(model, params)
    before = state(model)
    dest = fcall.TensorDictParams(params_of(model, 0.0))
    fcall.to_module(params, model, swap_dest=dest)
    # dest carries the swap's record (on the TensorDictParams, not on its TensorDict):
    # the express leaves it to the generic path, whose exact undo is what restores
    assert _express._entries_of(dest) is None
    generic_swaps.clear()
    fcall.to_module(dest, model)
    assert generic_swaps == [dest]
    assert_same_state(model, before)


def mutations() -> dict:
    def replace_submodule(m):
        m[1] = nn.Linear(2, 2)

    def register_parameter(m):
        m[1].register_parameter("scale", nn.Parameter(torch.ones(2)))

    def buffer_to_parameter(m):
        m[1].register_buffer("extra", torch.ones(2))

    def swap_a_name_for_another(m):  # sizes unchanged: caught on the read of the slot
        del m[1].bias
        m[1].register_parameter("gain", nn.Parameter(torch.ones(2)))

    def replace_a_parameter_object(m):  # no structure change: the express still fits
        m[1].weight = nn.Parameter(torch.zeros(2, 2))

    return {
        f.__name__: f
        for f in (
            replace_submodule,
            register_parameter,
            buffer_to_parameter,
            swap_a_name_for_another,
            replace_a_parameter_object,
        )
    }


@pytest.mark.parametrize("mutate", list(mutations()))
def test_a_changed_module_tree_is_seen_by_the_express(generic_swaps, mutate):
    model, fresh = chain(), chain()
    params = params_of(model, 1.0)
    primed(model, params)
    mutations()[mutate](model)
    mutations()[mutate](fresh)  # the same change on a module with no plan: the reference
    for target in (fresh, model):
        before = state(target)
        try:
            with fcall.swap(params, target):
                assert target[1].weight is params["1", "weight"]
                assert target[0].bias is params["0", "bias"]
            outcome = None
        except KeyError as error:
            outcome = str(error).replace(type(target).__name__, "")
        assert_same_state(target, before)
        if target is fresh:
            expected = outcome
    assert outcome == expected


def edits() -> dict:
    return {
        "an extra key": lambda p: p.set(("1", "nope"), torch.ones(2)),
        "a key less": lambda p: p.del_(("1", "bias")),
        "a node for a leaf": lambda p: p.set(("1", "bias"), TensorDict(x=torch.ones(2))),
        "a leaf for a node": lambda p: p.set("1", torch.ones(2)),
        "another key order": lambda p: p.set("0", p.get("0").select("bias", "weight")),
        "a non-tensor value": lambda p: p.set_non_tensor(("1", "bias"), "text"),
    }


@pytest.mark.parametrize("edit", list(edits()))
@pytest.mark.parametrize("api", ["swap", "to_module"])
def test_a_changed_params_structure_takes_the_generic_path(generic_swaps, edit, api):
    model = chain()
    params = params_of(model, 1.0)
    primed(model, params, api)
    generic_swaps.clear()
    edited = edits()[edit](params_of(model, 2.0))
    before = state(model)
    swap = fcall.swap if api == "swap" else fcall.to_module
    try:
        with swap(edited, model):
            for key, value in edited.items(True, True):
                if isinstance(value, torch.Tensor) and key != ("1", "nope"):
                    assert model.get_submodule(key[0])._parameters[key[1]] is value
    except (KeyError, TypeError) as error:
        assert "The module was left unchanged" in str(error) or "not a tensor" in str(error)
    assert_same_state(model, before)
    assert len(generic_swaps) == 1  # the express declined, the generic path ran


def nested_edits() -> dict:
    return {
        "an extra key": lambda d: {**d, "1": {**d["1"], "nope": torch.ones(2)}},
        "a key less": lambda d: {**d, "1": {"weight": d["1"]["weight"]}},
        "a node for a leaf": lambda d: {**d, "1": {**d["1"], "bias": {"x": torch.ones(2)}}},
        "a leaf for a node": lambda d: {**d, "1": torch.ones(2)},
        "another key order": lambda d: {**d, "0": dict(reversed(d["0"].items()))},
        "a non-tensor value": lambda d: {**d, "1": {**d["1"], "bias": "text"}},
    }


@pytest.mark.parametrize("edit", [None, *nested_edits()])
@pytest.mark.parametrize("api", ["swap", "to_module", "functional_call"])
def test_a_nested_dict_takes_the_express_until_its_structure_changes(generic_swaps, edit, api):
    model = chain()
    before = state(model)

    def nested(fill):
        return params_of(model, fill).to_dict()

    swap = fcall.to_module if api == "to_module" else fcall.swap
    for _ in range(2):
        with swap(nested(1.0), model):
            pass
    assert _plan.current_express(model) is not None
    generic_swaps.clear()
    params = nested(2.0) if edit is None else nested_edits()[edit](nested(2.0))
    try:
        if api == "functional_call":  # fcall's KeyError for a key the model lacks
            fcall.functional_call(model, params, (torch.ones(1, 2),), unknown_keys="raise")
        else:
            with getattr(fcall, api)(params, model):
                assert model[0].weight is params["0"]["weight"]
    except (KeyError, TypeError) as error:
        assert "The module was left unchanged" in str(error) or "not a tensor" in str(error)
    assert_same_state(model, before)
    assert len(generic_swaps) == (edit is not None)  # declined only for a changed structure


@pytest.mark.parametrize("api", ["swap", "to_module"])
def test_dotted_names_inside_a_nested_dict_swap_right_with_or_without_express(generic_swaps, api):
    # The fast walk keeps "0.weight" as one name in the signature; the plan comes from the
    # generic walk, which splits it; an express built for the plain structure declines.
    model = nn.Sequential(nn.Sequential(nn.Linear(2, 2)), nn.Linear(2, 2))
    before = state(model)
    swap = fcall.swap if api == "swap" else fcall.to_module

    def values(fill: float, dotted: bool) -> dict:
        w, b = nn.Parameter(torch.full((2, 2), fill)), nn.Parameter(torch.full((2,), fill))
        inner = {"0.weight": w, "0.bias": b} if dotted else {"0": {"weight": w, "bias": b}}
        return {"0": inner, "1": {"weight": w, "bias": b}}

    for fill, dotted in [(1.0, False), (2.0, False), (3.0, True), (4.0, True), (5.0, True)]:
        params = values(fill, dotted)
        with swap(params, model):
            assert model[0][0].weight is params["1"]["weight"]
            assert model[1].bias is params["1"]["bias"]
        assert_same_state(model, before)


def without(flat: dict, name: str) -> dict:
    return {key: value for key, value in flat.items() if key != name}


def flat_edits() -> dict:
    return {
        "an extra key": lambda d: {**d, "1.nope": torch.ones(2)},
        "a key less": lambda d: without(d, "1.bias"),
        "another key order": lambda d: dict(reversed(d.items())),
        "a nested dict": lambda d: {**without(d, "1.bias"), "1": {"bias": d["1.bias"]}},
        "a non-tensor value": lambda d: {**d, "1.bias": "text"},
        "a tuple key": lambda d: {**without(d, "1.bias"), ("1", "bias"): d["1.bias"]},
    }


@pytest.mark.parametrize("edit", list(flat_edits()))
@pytest.mark.parametrize("api", ["swap", "to_module"])
def test_a_flat_dict_takes_the_express_until_its_keys_change(generic_swaps, edit, api):
    model = chain()
    swap = fcall.swap if api == "swap" else fcall.to_module
    flat = {name: nn.Parameter(torch.full_like(t, 1.0)) for name, t in model.named_parameters()}
    for _ in range(2):
        with swap(flat, model):
            pass
    generic_swaps.clear()
    with swap(dict(flat), model):  # a new dict, the same keys: the express
        assert model[2].weight is flat["2.weight"]
    assert generic_swaps == []
    edited = flat_edits()[edit](dict(flat))
    before = state(model)
    try:
        with swap(edited, model):
            for key, value in edited.items():
                name = ".".join(key) if isinstance(key, tuple) else key
                if isinstance(value, torch.Tensor):
                    assert model.get_parameter(name) is value
    except (KeyError, TypeError) as error:
        assert "The module was left unchanged" in str(error)
    assert_same_state(model, before)
    assert len(generic_swaps) == 1  # the express declined, the generic path ran


def test_a_structure_too_large_gets_no_express_nested_sooner_than_flat(monkeypatch):
    monkeypatch.setattr(_express, "_OFFERS_BEFORE_BUILD", 1)
    monkeypatch.setattr(_express, "_MAX_LEAVES", 4)
    monkeypatch.setattr(_express, "_MAX_FLAT_LEAVES", 6)
    for leaves, flat, built in [(6, False, False), (6, True, True), (8, True, False)]:
        model = chain(leaves // 2)
        params = params_of(model, 1.0)
        if flat:
            params = {".".join(key): value for key, value in params.items(True, True)}
        for _ in range(3):
            with fcall.swap(params, model):
                pass
        assert (_plan.current_express(model) is not None) == built, (leaves, flat)


def test_tied_names_get_no_express(monkeypatch):
    from support import Tied

    monkeypatch.setattr(_express, "_OFFERS_BEFORE_BUILD", 1)
    model = Tied()
    params = TensorDict({"emb": {"weight": torch.zeros(5, 3)}})  # the head follows
    for _ in range(3):
        with fcall.swap(params, model):
            assert model.head.weight is params["emb", "weight"]
    assert _plan.current_express(model) is None


def test_the_express_does_not_keep_its_module_alive(generic_swaps):
    model = Net()
    primed(model, fcall.from_module(model).detach().clone())
    alive, key = weakref.ref(model), id(model)
    del model
    gc.collect()
    assert alive() is None and key not in _plan._CACHE


def test_an_unknown_key_after_the_express_names_the_key(generic_swaps):
    model = Net()
    primed(model, fcall.from_module(model).detach().clone())
    bad = fcall.from_module(model).detach().clone()
    bad["lin", "wieght"] = bad["lin"].pop("weight")
    before = state(model)
    with pytest.raises(KeyError, match=re.escape("'lin.wieght' names no parameter or buffer")):
        fcall.to_module(bad, model)
    assert_same_state(model, before)


def test_a_source_cpython_refuses_leaves_the_swap_made_and_the_generic_path(monkeypatch):
    monkeypatch.setattr(_express, "_OFFERS_BEFORE_BUILD", 1)

    def refuse(*args):
        raise RecursionError("maximum recursion depth exceeded during compilation")

    monkeypatch.setattr(_express, "_build", refuse)
    model = chain()
    params = params_of(model, 1.0)
    for _ in range(3):
        with fcall.swap(params, model):
            assert model[1].weight is params["1", "weight"]
    assert _plan.current_express(model) is None
