"""Issue 15, points 1-9, under torch.compile: compiled equals eager (and the peer).

``fullgraph=True`` where torch allows it, a counting backend, a second call with new
values under ``fail_on_recompile``, and the module checked exactly after each call.
"""

from __future__ import annotations

import re

import pytest
import tensordict
import torch
from tensordict import TensorDict
from torch import nn

import fcall
from tests.support import (
    Tied,
    Untied,
    assert_frames,
    assert_same_state,
    key_order_recompiles,
    state,
)

BACKENDS = ["eager", "aot_eager"]


def bn_model() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).train()


def dicts_of(m: nn.Module) -> tuple[dict, dict]:
    params = {k: torch.randn_like(v) for k, v in m.named_parameters()}
    buffers = {k: v.detach().clone() for k, v in m.named_buffers()}
    return params, buffers


# --- 1. the (params, buffers) tuple form --------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_tuple_of_dicts_form_compiles_to_one_graph(counter, backend):
    m, peer = bn_model(), bn_model()
    peer.load_state_dict(m.state_dict())
    before = state(m)
    cnt = counter(backend)
    fn = torch.compile(
        lambda p, b, x: fcall.functional_call(m, (p, b), (x,)), backend=cnt, fullgraph=True
    )
    x = torch.randn(5, 3)
    for call in range(2):
        params, buffers = dicts_of(m)
        ours = {k: v.clone() for k, v in buffers.items()}
        with torch.compiler.set_stance("fail_on_recompile" if call else "default"):
            y = fn(params, ours, x)
        torch.testing.assert_close(y, torch.func.functional_call(peer, (params, buffers), (x,)))
        torch.testing.assert_close(ours, buffers)  # running stats, in place, as the peer's
        assert_same_state(m, before)
    assert cnt.frame_count == 1


def test_a_key_in_two_dicts_raises_the_eager_message_compiled(counter):
    m = nn.Linear(2, 2)
    before = state(m)
    fn = torch.compile(
        lambda p, x: fcall.functional_call(m, (p, p), (x,)), backend=counter("eager")
    )
    msg = "fcall.functional_call: 'weight', 'bias' appeared in more than one of the params dicts"
    with pytest.raises(ValueError, match=re.escape(msg)):
        fn({k: torch.zeros_like(v) for k, v in m.named_parameters()}, torch.ones(2))
    assert_same_state(m, before)


# --- 2. one compiled function, many instances of one architecture ------------------------


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(5, 3)
        self.head = nn.Linear(3, 5)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(idx))


def architecture_calls(api):
    if api == "functional_call":
        return lambda m, p, x: fcall.functional_call(m, p, (x,))
    if api == "to_module_replace":  # parameters leave their dict: a key order is recorded

        def replace(m, p, x):
            with fcall.to_module(p, m, preserve_module_state=False):
                return m(x)

        return replace

    def call(m, p, x):
        swap = fcall.swap if api == "swap" else fcall.to_module
        with swap(p, m):
            return m(x)

    return call


@pytest.mark.parametrize("api", ["swap", "functional_call", "to_module", "to_module_replace"])
@pytest.mark.parametrize("container", ["flat", "nested"])
def test_one_compiled_function_serves_ten_instances_of_an_architecture(counter, api, container):
    models = [Model() for _ in range(10)]
    befores = [state(m) for m in models]
    cnt = counter("eager")
    fn = torch.compile(architecture_calls(api), backend=cnt, fullgraph=True)
    idx = torch.tensor([0, 3])
    for call in range(2):
        for m, before in zip(models, befores):
            p = fcall.from_module(m).detach().clone().apply(torch.randn_like)
            if container == "flat":
                p = dict(p.flatten_keys("."))
            stance = "fail_on_recompile" if call or m is not models[0] else "default"
            with torch.compiler.set_stance(stance):
                y = fn(m, p, idx)
            expected = torch.func.functional_call(m, dict(TensorDict(p).flatten_keys(".")), idx)
            torch.testing.assert_close(y, expected)
            assert_same_state(m, before)
    assert cnt.frame_count == 1  # as torch.func.functional_call


# Dynamo does not guard that two parameters stay distinct objects
# (torch._dynamo.config.skip_no_tensor_aliasing_guards_on_parameters, True by default, "a
# deliberate soundness hit"): a compiled function traced on an untied instance is reused for
# a tied one. fcall, like torch.func, walks the module's tensors in the trace and registers
# no hook (issue 26), so it gives what torch.func's compiled function gives; with the
# setting off, Dynamo guards the aliasing and both recompile to the right result.
ALIASING_GUARDED = {"skip_no_tensor_aliasing_guards_on_parameters": False}


def _instances_in_turn(fn, peer_fn) -> list[tuple[bool, bool]]:
    untied = [Untied() for _ in range(3)]
    tied = [Untied() for _ in range(3)]
    for m in tied:
        m.head.weight = m.emb.weight
    idx = torch.tensor([0, 4])
    w = torch.randn(5, 3)
    right = []
    for m in untied + tied + untied:
        expected = torch.func.functional_call(m, {"emb.weight": w}, idx)
        ours, peer = fn(m, {"emb.weight": w}, idx), peer_fn(m, {"emb.weight": w}, idx)
        right.append((torch.allclose(ours, expected), torch.allclose(peer, expected)))
    return right


def test_instances_with_and_without_ties_get_what_torch_func_compiled_gives(counter):
    cnt = counter("eager")
    fn = torch.compile(architecture_calls("functional_call"), backend=cnt, fullgraph=True)
    peer = torch.compile(lambda m, p, x: torch.func.functional_call(m, p, (x,)), backend="eager")
    right = _instances_in_turn(fn, peer)
    assert [ours for ours, _ in right] == [peer for _, peer in right]
    assert cnt.frame_count == 1  # one frame for every instance, as torch.func


def test_instances_with_and_without_ties_each_get_their_own_result_with_aliasing_guards(counter):
    cnt = counter("eager")
    fn = torch.compile(architecture_calls("functional_call"), backend=cnt, fullgraph=True)
    peer = torch.compile(lambda m, p, x: torch.func.functional_call(m, p, (x,)), backend="eager")
    with torch._dynamo.config.patch(ALIASING_GUARDED):
        right = _instances_in_turn(fn, peer)
    assert all(ours for ours, _ in right)
    assert 2 <= cnt.frame_count <= 4  # untied once; tied ones share slots guarded by id


# --- 3. a TorchScript target ---------------------------------------------------------------


def test_a_scripted_module_is_refused_with_the_eager_message_compiled(counter):
    scripted = torch.jit.script(nn.Linear(2, 2))
    weight = scripted.weight
    fn = torch.compile(
        lambda p, x: fcall.functional_call(scripted, p, (x,)), backend=counter("eager")
    )
    with pytest.raises(RuntimeError, match="RecursiveScriptModule is a TorchScript module"):
        fn({"weight": torch.zeros(2, 2)}, torch.ones(2))
    assert scripted.weight is weight


# --- 4. weights tied after a first swap ------------------------------------------------------


@pytest.mark.parametrize("api", ["swap", "functional_call"])
def test_weights_tied_after_a_first_swap_compile_to_the_tied_result(counter, api):
    m = Untied()
    idx = torch.tensor([0, 4])

    def f(w, i):
        if api == "functional_call":
            return fcall.functional_call(m, {"emb.weight": w}, (i,))
        with fcall.swap({"emb": {"weight": w}}, m):
            return m(i)

    w = torch.randn(5, 3)
    fcall.functional_call(m, {"emb.weight": w}, (idx,))  # a first swap, eager
    m.head.weight = m.emb.weight
    before = state(m)
    cnt = counter("eager")
    fn = torch.compile(f, backend=cnt, fullgraph=True)
    for call in range(2):
        w = torch.randn(5, 3)
        with torch.compiler.set_stance("fail_on_recompile" if call else "default"):
            y = fn(w, idx)
        torch.testing.assert_close(y, torch.func.functional_call(m, {"emb.weight": w}, idx))
        torch.testing.assert_close(y, w[idx] @ w.T)
        assert_same_state(m, before)
    assert cnt.frame_count == 1


def test_a_tie_made_after_compiling_recompiles_to_the_tied_result_with_aliasing_guards(counter):
    """Without the aliasing guards (Dynamo's default), fcall's compiled function, like
    torch.func's, keeps its untied trace: ``test_instances_with_and_without_ties_get_what_
    torch_func_compiled_gives``."""
    ours, peer = Untied(), Untied()
    peer.load_state_dict(ours.state_dict())
    idx = torch.tensor([0, 4])
    cnt = counter("eager")
    fcall_fn = torch.compile(
        lambda w, i: fcall.functional_call(ours, {"emb.weight": w}, (i,)),
        backend=cnt,
        fullgraph=True,
    )
    w = torch.randn(5, 3)
    with torch._dynamo.config.patch(ALIASING_GUARDED):
        torch.testing.assert_close(
            fcall_fn(w, idx), torch.func.functional_call(peer, {"emb.weight": w}, idx)
        )
        ours.head.weight = ours.emb.weight
        peer.head.weight = peer.emb.weight
        before = state(ours)
        tied = torch.func.functional_call(peer, {"emb.weight": w}, idx)
        torch.testing.assert_close(fcall_fn(w, idx), tied)
    assert cnt.frame_count == 2
    assert_same_state(ours, before)


# --- 5. a slot deleted inside the block -----------------------------------------------------


@pytest.mark.parametrize("api", ["swap", "functional_call", "to_module"])
@pytest.mark.parametrize("name", ["weight", "rb"])
def test_a_slot_deleted_in_a_compiled_block_is_restored(request, counter, api, name):
    m = nn.Linear(2, 2)
    m.register_buffer("rb", torch.ones(2))

    class Deleting(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = m

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.m(x) + self.m.rb
            delattr(self.m, name)
            return y

    outer = Deleting()
    params = {"m.weight": torch.zeros(2, 2), "m.bias": torch.ones(2), "m.rb": torch.ones(2)}

    def f(p, x):
        if api == "functional_call":
            return fcall.functional_call(outer, p, (x,))
        with (fcall.swap if api == "swap" else fcall.to_module)(p, outer):
            return outer(x)

    cnt = counter("eager")
    fn = torch.compile(f, backend=cnt, fullgraph=True)
    objects = {key: value for key, value in fcall.from_module(m).items()}
    # The trace reads no tensor of the module (its plan is decided outside the trace,
    # fcall/_core/traced.py) and guards the names in each swapped dict, not their order: the
    # deleted name, back at the end of its dict, recompiles nothing (torch.func's compiled
    # function, which walks the module's tensors, recompiles once).
    if name == "weight" and api != "to_module":
        key_order_recompiles(request)  # the deleted name comes back at the end of its dict
    for _ in range(3):
        torch.testing.assert_close(fn(params, torch.ones(2)), torch.full((2,), 2.0))
        # every object back in its own dict; the deleted one at the end of it, as in
        # eager and as torch.func registers it again
        for key, value in objects.items():
            assert (m._buffers if key == "rb" else m._parameters)[key] is value
        # (to_module registers every name it wrote back again, in the params' order, as
        # tensordict's restore does)
        order = (
            ["bias", "weight"] if name == "weight" and api != "to_module" else ["weight", "bias"]
        )
        assert list(m._parameters) == order and list(m._buffers) == ["rb"]
        assert not any(key in m.__dict__ for key in objects)
    assert_frames(cnt, 1)


# --- 6. one swap object entered twice ----------------------------------------------------------


def test_entering_one_swap_twice_nests_compiled(counter):
    m = nn.Linear(2, 2)
    before = state(m)

    def f(p, x):
        s = fcall.swap(p, m)
        with s:
            with s:
                y = m(x)
            z = m(x)
        return y + z + m(x)

    cnt = counter("eager")
    fn = torch.compile(f, backend=cnt, fullgraph=True)
    x = torch.ones(2)
    for call in range(2):
        p = {"weight": torch.randn(2, 2), "bias": torch.randn(2)}
        with torch.compiler.set_stance("fail_on_recompile" if call else "default"):
            y = fn(p, x)
        swapped = torch.func.functional_call(m, p, (x,))
        torch.testing.assert_close(y, 2 * swapped + m(x))
        assert_same_state(m, before)
    assert cnt.frame_count == 1


# --- 7. a submodule at two paths -----------------------------------------------------------


@pytest.mark.parametrize("preserve", [False, True])
def test_to_module_into_a_submodule_at_two_paths_compiled(counter, preserve):
    l0 = nn.Linear(2, 2)
    m = nn.Sequential(l0, nn.Sequential(l0))
    peer_l0 = nn.Linear(2, 2)
    peer = nn.Sequential(peer_l0, nn.Sequential(peer_l0))
    peer_l0.load_state_dict(l0.state_dict())
    before = state(m)

    def f(p, x):
        with fcall.to_module(p, m, preserve_module_state=preserve):
            return m(x)

    cnt = counter("eager")
    fn = torch.compile(f, backend=cnt, fullgraph=True)
    x = torch.randn(3, 2)
    for call in range(2):
        p = fcall.from_module(m).detach().clone().apply(torch.randn_like)
        with torch.compiler.set_stance("fail_on_recompile" if call else "default"):
            y = fn(p, x)
        with p.to_module(peer, preserve_module_state=preserve):
            expected = peer(x)
        torch.testing.assert_close(y, expected)
        assert_same_state(m, before)
    assert cnt.frame_count == 1


# --- 8. to_module into a TensorDictParams ---------------------------------------------------


def test_to_module_into_a_tensordict_params_compiled(counter):
    target = fcall.TensorDictParams(fcall.from_module(nn.Sequential(nn.Linear(2, 2))))
    weight = target["0", "weight"]

    def f(p):
        with fcall.to_module(p, target):
            return target["0", "weight"] * 2

    cnt = counter("eager")
    fn = torch.compile(f, backend=cnt, fullgraph=True)
    for call in range(2):
        p = target.data.clone().apply(torch.randn_like)
        with torch.compiler.set_stance("fail_on_recompile" if call else "default"):
            torch.testing.assert_close(fn(p), p["0", "weight"] * 2)
        assert target["0", "weight"] is weight
    assert cnt.frame_count == 1
    peer = tensordict.nn.TensorDictParams(TensorDict.from_module(nn.Sequential(nn.Linear(2, 2))))
    p = peer.data.clone().apply(torch.randn_like)
    with p.to_module(peer):
        torch.testing.assert_close(peer["0", "weight"] * 2, p["0", "weight"] * 2)


# --- 9. a Parameter for a buffer slot, preserve_module_state=True -----------------------------


def test_a_parameter_for_a_buffer_is_registered_as_a_buffer_compiled(counter):
    m = nn.BatchNorm1d(2).eval()
    before = state(m)

    held = {"slot": None}  # what the buffer slot held in the block (a replayed side effect)

    def f(p, x):
        with fcall.to_module(p, m):
            held["slot"] = m._buffers["running_mean"]
            return m(x)

    cnt = counter("eager")
    fn = torch.compile(f, backend=cnt, fullgraph=True)
    x = torch.randn(4, 2)
    for call in range(2):
        p = fcall.from_module(m).detach().clone()
        # requires_grad=False: batch_norm in eval refuses a running_mean that requires grad
        p["running_mean"] = nn.Parameter(torch.randn(2), requires_grad=False)
        with torch.compiler.set_stance("fail_on_recompile" if call else "default"):
            y = fn(p, x)
        with TensorDict(p.to_dict()).to_module(m):
            expected = m(x)
            peer_held = m._buffers["running_mean"]
        torch.testing.assert_close(y, expected)
        assert type(held["slot"]) is type(peer_held) is torch.Tensor  # a buffer, as tensordict's
        torch.testing.assert_close(held["slot"], p["running_mean"].detach())
        assert_same_state(m, before)
    assert cnt.frame_count == 1


def test_parameters_that_require_grad_into_a_frozen_module_get_its_requires_grad_compiled(
    counter,
):
    m = nn.Linear(2, 2).requires_grad_(False)
    before = state(m)
    held = {"weight": None, "bias": None}  # what the slots held in the block (replayed)

    def f(p, x):
        with fcall.to_module(p, m):
            held["weight"], held["bias"] = m._parameters["weight"], m._parameters["bias"]
            return m(x)

    cnt = counter("eager")
    fn = torch.compile(f, backend=cnt, fullgraph=True)
    x = torch.randn(4, 2)
    for call in range(2):
        p = {"weight": nn.Parameter(torch.randn(2, 2)), "bias": nn.Parameter(torch.randn(2))}
        with torch.compiler.set_stance("fail_on_recompile" if call else "default"):
            y = fn(p, x)
        peer = nn.Linear(2, 2).requires_grad_(False)
        with TensorDict(p).to_module(peer):
            expected = peer(x)
            peer_weight = peer._parameters["weight"]
        torch.testing.assert_close(y, expected)
        assert y.requires_grad is expected.requires_grad is False
        assert held["weight"].requires_grad is peer_weight.requires_grad is False
        assert type(held["weight"]) is type(peer_weight) is nn.Parameter
        assert_same_state(m, before, in_any_order=True)
    assert cnt.frame_count == 1


def test_deep_copies_of_a_tied_model_keep_their_ties_compiled(counter):
    import copy

    original = Untied()
    original.head.weight = original.emb.weight
    models = [copy.deepcopy(original) for _ in range(3)]
    fn = torch.compile(architecture_calls("functional_call"), backend=counter("eager"))
    idx = torch.tensor([0, 4])
    for m in models:
        w = torch.randn(5, 3)
        y = fn(m, {"emb.weight": w}, idx)
        torch.testing.assert_close(y, torch.func.functional_call(m, {"emb.weight": w}, idx))
        torch.testing.assert_close(y, w[idx] @ w.T)


def test_deep_copies_of_an_untied_model_share_one_graph(counter):
    import copy

    models = [copy.deepcopy(Model()) for _ in range(10)]
    cnt = counter("eager")
    fn = torch.compile(architecture_calls("functional_call"), backend=cnt, fullgraph=True)
    idx = torch.tensor([0, 3])
    for m in models:
        p = dict(fcall.from_module(m).detach().clone().apply(torch.randn_like).flatten_keys("."))
        torch.testing.assert_close(fn(m, p, idx), torch.func.functional_call(m, p, idx))
    assert cnt.frame_count == 1


def test_a_tie_in_a_deep_copy_after_compiling_is_seen_with_aliasing_guards(counter):
    import copy

    twin = copy.deepcopy(Untied())
    cnt = counter("eager")
    fn = torch.compile(architecture_calls("functional_call"), backend=cnt, fullgraph=True)
    idx = torch.tensor([0, 4])
    w = torch.randn(5, 3)
    with torch._dynamo.config.patch(ALIASING_GUARDED):
        fn(twin, {"emb.weight": w}, idx)
        twin.head.weight = twin.emb.weight
        y = fn(twin, {"emb.weight": w}, idx)
    torch.testing.assert_close(y, torch.func.functional_call(twin, {"emb.weight": w}, idx))
    torch.testing.assert_close(y, w[idx] @ w.T)


def _untying_steps():
    """Steps that swap again inside a to_module block of plain tensors given under both
    tied names: to_module makes one Parameter per name, as tensordict's does, so the
    second swap meets the names untied (found by the deep parity run)."""

    def undo(m, p, q, idx):
        old = fcall.to_module(p, m)
        out = m(idx)
        fcall.to_module(old, m)
        return out

    def nested_swap(m, p, q, idx):
        with fcall.to_module(p, m):
            with fcall.swap(q, m):
                inner = m(idx)
            return inner, m(idx)

    return {"undo": undo, "nested_swap": nested_swap}


@pytest.mark.parametrize("step", ["undo", "nested_swap"])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_swap_inside_a_block_that_untied_names_compiles_as_eager(counter, step, backend):
    m = Tied()
    before = state(m)
    idx = torch.tensor([0, 4, 2])

    def params():
        w, v = torch.randn(5, 3), torch.randn(5, 3)
        return (
            TensorDict({"emb": {"weight": w}, "head": {"weight": w}}),
            TensorDict({"emb": {"weight": v}}),
        )

    cnt = counter(backend)
    fn = torch.compile(_untying_steps()[step], backend=cnt, fullgraph=True)
    p, q = params()
    expected = _untying_steps()[step](m, p, q, idx)
    assert_same_state(m, before, in_any_order=True)  # to_module moved head.weight last
    after_eager = state(m)
    torch.testing.assert_close(fn(m, p, q, idx), expected)
    assert_same_state(m, after_eager)  # the order of every dict included
    with torch.compiler.set_stance("fail_on_recompile"):
        p, q = params()
        torch.testing.assert_close(fn(m, p, q, idx), _untying_steps()[step](m, p, q, idx))
    assert_same_state(m, after_eager)
    assert cnt.frame_count == 1
