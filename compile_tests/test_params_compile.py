"""TensorDictParams under torch.compile: graph counts pinned exactly (issue 3, points 9-10)."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from tensordict import TensorDict
from torch import nn
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend

from fcall import TensorDictParams


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _make() -> TensorDictParams:
    return TensorDictParams(
        TensorDict(a=torch.randn(3), n={"b": torch.randn(3)}, i=torch.arange(3))
    )


def _compiled(fn, backend="eager", fullgraph=True):
    cnt = CompileCounterWithBackend(backend)
    return torch.compile(fn, backend=cnt, fullgraph=fullgraph), cnt


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_reads_one_graph_and_no_recompile_for_a_new_object(backend):
    def read(p, x):
        return p["a"] * x + p.get(("n", "b")) + p["n"]["b"] + p["n", "b"] + p["i"]

    fn, cnt = _compiled(read, backend)
    p, x = _make(), torch.randn(3)
    torch.testing.assert_close(fn(p, x), read(p, x))
    q = _make()
    with torch.compiler.set_stance("fail_on_recompile"):
        torch.testing.assert_close(fn(q, x), read(q, x))
    assert cnt.frame_count == 1


def test_reads_with_get_post_hooks_apply_the_hooks():
    def read(p):
        return p["a"], p["n"]["b"], p.get(("n", "b")), sum(v.sum() for v in p.values(True, True))

    p = _make()
    p.register_get_post_hook(lambda tdp, v: v * 2 if v.is_floating_point() else None)
    fn, cnt = _compiled(read)
    out = fn(p)
    torch.testing.assert_close(out[0], p._param_td["a"] * 2)
    torch.testing.assert_close(out[1], p._param_td["n", "b"] * 2)
    torch.testing.assert_close(out[2], p._param_td["n", "b"] * 2)
    assert cnt.frame_count == 1


def test_set_entries_registers_them_without_graph_break():
    def setter(p, x):
        p["c"] = x
        p["n", "d"] = x.long()
        return p["c"] * 2

    p, x = _make(), torch.randn(3)
    fn, cnt = _compiled(setter)
    fn(p, x)
    assert cnt.frame_count == 1
    assert isinstance(p["c"], nn.Parameter)
    assert "c" in dict(p.named_parameters())
    assert "n.d" in dict(p.named_buffers())
    assert not isinstance(p["n", "d"], nn.Parameter)


def test_set_entry_computed_in_the_graph_breaks_once_at_the_parameter_ctor():
    # Dynamo refuses nn.Parameter(t) on a tensor made in the graph
    # (torch._dynamo.config.graph_break_on_nn_param_ctor, True by default).
    def setter(p, x):
        p["c"] = x * 2
        return p["c"] + 1

    p, x = _make(), torch.randn(3)
    with pytest.raises(torch._dynamo.exc.Unsupported, match=r"torch.nn.Parameter\(\)"):
        torch.compile(setter, backend="eager", fullgraph=True)(p, x)
    torch._dynamo.reset()
    fn, cnt = _compiled(setter, fullgraph=False)
    p = _make()
    torch.testing.assert_close(fn(p, x), x * 2 + 1)
    assert cnt.frame_count == 2
    assert isinstance(p["c"], nn.Parameter)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_soft_target_update_lerp(backend):
    # Float leaves only: lerp_ of an integer buffer raises in eager on every torch
    # ("lerp_kernel_scalar" not implemented for 'Long'); torch 2.13's Dynamo traced
    # it anyway, 2.14 raises as eager does.
    def _make():
        return TensorDictParams(TensorDict(a=torch.randn(3), n={"b": torch.randn(3)}))

    online, target = _make(), _make()
    expected = target._param_td["a"].detach().lerp(online._param_td["a"].detach(), 0.1)

    def update(target, online):
        with torch.no_grad():
            target.lerp_(online, 0.1)

    fn, cnt = _compiled(update, backend)
    fn(target, online)
    torch.testing.assert_close(target["a"].detach(), expected)
    assert isinstance(target["a"], nn.Parameter)
    fn(_make(), _make())
    assert cnt.frame_count == 1


def test_construction_breaks_once_and_does_not_recompile():
    def build(x):
        p = TensorDictParams(TensorDict(a=x, b=x + 1))
        return p["a"] * 2 + p["b"]

    x = torch.randn(3)
    # The reason is pinned: the leaf conversion runs in one torch._dynamo.disable-d helper.
    with pytest.raises(torch._dynamo.exc.Unsupported, match="disable"):
        torch.compile(build, backend="eager", fullgraph=True)(x)
    torch._dynamo.reset()
    fn, cnt = _compiled(build, fullgraph=False)
    torch.testing.assert_close(fn(x), x * 3 + 1)
    frames = cnt.frame_count
    assert frames == 2
    with torch.compiler.set_stance("fail_on_recompile"):
        fn(torch.randn(3))
        fn(torch.randn(3))
    assert cnt.frame_count == frames


@pytest.mark.parametrize(
    "build",
    [
        lambda x: TensorDictParams(a=x, b=x + 1, lock=True),
        lambda x: TensorDictParams(TensorDict(a=x, b=(x * 3).long())),
        lambda x: TensorDictParams(TensorDict(a=x, b=x.long()), no_convert=True),
    ],
    ids=["kwargs-lock", "mixed-dtypes", "no-convert"],
)
def test_construction_forms_break_once_and_do_not_recompile(build):
    def fn(x):
        p = build(x)
        return p["a"] * 2, p.is_locked

    cfn, cnt = _compiled(fn, fullgraph=False)
    x = torch.randn(3)
    out, _ = cfn(x)
    torch.testing.assert_close(out, x * 2)
    frames = cnt.frame_count
    assert frames == 2
    with torch.compiler.set_stance("fail_on_recompile"):
        cfn(torch.randn(3))
    assert cnt.frame_count == frames


def test_construction_in_compiled_code_builds_the_object_once(monkeypatch):
    # Dynamo runs the __init__ call on what __new__ returned eagerly: it must not build again.
    builds = []
    build = TensorDictParams._build
    monkeypatch.setattr(
        TensorDictParams, "_build", lambda self, *args: builds.append(1) or build(self, *args)
    )

    def fn(x):
        p = TensorDictParams(TensorDict(a=x, b=x.long()), no_convert=True)
        return p["a"] * 2

    cfn, _ = _compiled(fn, fullgraph=False)
    torch.testing.assert_close(cfn(torch.ones(3)), torch.full((3,), 2.0))
    assert len(builds) == 1


def test_swap_from_it_with_fcall_and_a_target_network_module():
    import fcall

    class Target(nn.Module):
        def __init__(self, net: nn.Module):
            super().__init__()
            self.net = net
            self.target = TensorDictParams(TensorDict.from_module(net).detach().clone())

        def forward(self, x):
            with fcall.swap(self.target, self.net):
                return self.net(x)

    net = nn.Linear(3, 2)
    model = Target(net)
    with torch.no_grad():
        model.target.zero_()
    x = torch.randn(4, 3)
    cnt = CompileCounter()
    out = torch.compile(model, backend=cnt, fullgraph=True)(x)
    assert (out == 0).all() and cnt.frame_count == 1
    assert not (net(x) == 0).all()

    def call(p, x):
        return fcall.functional_call(net, p, (x,))

    cnt2 = CompileCounter()
    fn = torch.compile(call, backend=cnt2, fullgraph=True)
    p = TensorDictParams(TensorDict.from_module(net).detach().clone())
    torch.testing.assert_close(fn(p, x), net(x))
    q = TensorDictParams(TensorDict.from_module(net).detach().clone())
    with torch.compiler.set_stance("fail_on_recompile"):
        fn(q, x)
    assert cnt2.frame_count == 1


def test_inductor_read_and_lerp():
    online, target = _make(), _make()

    def step(target, online, x):
        with torch.no_grad():
            target.lerp_(online, 0.5)
        return target["a"] * x

    cnt = CompileCounterWithBackend("inductor")
    fn = torch.compile(step, backend=cnt, fullgraph=True)
    x = torch.randn(3)
    expected = (target._param_td["a"].detach() + online._param_td["a"].detach()) / 2 * x
    torch.testing.assert_close(fn(target, online, x), expected)
    assert cnt.frame_count == 1
