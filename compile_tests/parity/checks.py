"""The parity check: compiled gives what eager gives, in one graph, with no recompile.

``check_parity(spec, pspec, use, backend, impl=fcall)`` runs one example and
raises ``ParityError`` (an ``AssertionError``) on the first violated property,
with a self-contained reproducer in the message. ``impl`` is the namespace the
step calls (``impl.swap``, ``impl.to_module``, ``impl.functional_call``):
``fcall`` itself, or a deliberately broken stand-in (test_mutants.py).
"""

from __future__ import annotations

from typing import Any

import torch
import torch._dynamo
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters

import fcall
from fcall.testing._compare import weighted_sum

from . import generators as gen

# AOTAutograd's error on BatchNorm1d, and on a BatchNorm2d after a MultiheadAttention
# (torch bugs; not generated for AOT backends: generators.BN1D_BACKENDS and
# BN2D_AFTER_BACKENDS, test_regressions.py).
KNOWN_AOT_ERROR = "view size is not compatible with input tensor's size and stride"

TOLERANCES = {
    torch.float64: {"rtol": 1e-7, "atol": 1e-7},
    torch.float32: {"rtol": 1e-4, "atol": 1e-5},
    torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2},
}


class ParityError(AssertionError):
    """One violated parity property; ``prop`` names it."""

    def __init__(self, prop: str, detail: str, repro: str = "") -> None:
        self.prop = prop
        super().__init__(f"[{prop}] {detail}\n\n{repro}")


def _close(got, expected, what: str) -> None:
    if isinstance(expected, (tuple, list)):
        for i, (g, e) in enumerate(zip(got, expected)):
            _close(g, e, f"{what}[{i}]")
        return
    if got is None or expected is None:
        if got is not expected:
            raise ParityError("values", f"{what}: {got!r} vs {expected!r}")
        return
    tol = TOLERANCES.get(expected.dtype, {"rtol": 0, "atol": 0})
    try:
        torch.testing.assert_close(got.detach(), expected.detach(), **tol)
    except AssertionError as exc:
        raise ParityError("values", f"{what}: {exc}") from None


# ------------------------------------------------------------------ snapshots


def module_state(module: nn.Module) -> list[tuple]:
    """Every slot of every submodule: name, object identity, type, flags, value."""
    out = []
    for path, sub in module.named_modules(remove_duplicate=False):
        for kind in ("_parameters", "_buffers"):
            for name, value in getattr(sub, kind).items():
                out.append(
                    (
                        path,
                        kind,
                        name,
                        id(value),
                        type(value).__name__,
                        None if value is None else value.requires_grad,
                        None if value is None else value.detach().clone(),
                        None if value is None else value.grad,
                    )
                )
        for name in sorted(sub._non_persistent_buffers_set):
            out.append((path, "non_persistent", name))
        for name, value in vars(sub).items():
            if isinstance(value, torch.Tensor):
                out.append((path, "attribute", name, id(value)))
        out.append((path, "training", sub.training))
    return out


def compare_module(
    before: list[tuple], after: list[tuple], order_of: list[tuple] | None = None
) -> None:
    """The module holds the very objects of ``before``, each in its slot. The order of
    each dict: ``order_of``'s, the eager reference's after the same calls (``to_module``
    moves the names it writes to the end of their dict, as tensordict's does), else
    ``before``'s."""
    expected = [s[:3] for s in (before if order_of is None else order_of)]
    if [s[:3] for s in after] != expected:
        diff = [(e, a[:3]) for e, a in zip(expected, after) if e != a[:3]]
        raise ParityError("module", f"slot order differs from eager's: {diff[:4]}")
    if order_of is not None:  # same objects in the same slots, each dict's order aside
        before, after = _by_slot(before), _by_slot(after)
    if [s[:6] for s in before] != [s[:6] for s in after]:
        diff = [(b[:6], a[:6]) for b, a in zip(before, after) if b[:6] != a[:6]]
        if len(before) != len(after):
            diff.append(("slot count", len(before), len(after)))
        raise ParityError("module", f"registration/identity changed: {diff[:4]}")
    for b, a in zip(before, after):
        if len(b) > 6 and b[6] is not None:
            if not torch.equal(b[6], a[6]):
                raise ParityError("module", f"value of {b[0]}.{b[2]} changed")
            if a[7] is not None:
                raise ParityError("module", f"{b[0]}.{b[2]} of the module got a .grad")


def params_state(params) -> list[tuple]:
    return [
        (k, id(v), type(v).__name__, v.requires_grad, v.detach().clone())
        for k, v in gen.leaves(params)
    ]


# -------------------------------------------------------------------- running


def _loss(out) -> torch.Tensor:
    """A weighted sum of the outputs (fixed weights, no RNG). A plain ``sum()`` after a
    train-mode BatchNorm is constant in its input, so every gradient above it is rounding
    noise: a deep-profile example compared 8e-5 of it with float32's ``atol`` of 1e-5, and
    ``torch.func.functional_call`` differed from eager just as much."""
    if isinstance(out, (tuple, list)):
        return sum(_loss(o) for o in out)
    return weighted_sum(out)


def _grads(params) -> list:
    return [v.grad for _, v in gen.leaves(params) if v.requires_grad]


def _run(step, target, params, x, idx, grad: bool):
    out = step(target, params, x, idx)
    if grad and _loss(out).requires_grad:
        _loss(out).backward()
    return out


def _for_api(pspec, use):
    """to_module writes the keys it is given, as tensordict's does (no tie follows a given
    name): its sets give every name, as ``from_module`` does."""
    return dict(pspec, every_name=True) if use["api"] == "to_module" else pspec


def check_parity(spec, pspec, use, backend: str, impl: Any = fcall) -> None:
    """Runs one example; raises ``ParityError`` naming the first violated property."""
    pspec = _for_api(pspec, use)
    repro = gen.reproducer(spec, pspec, use, backend)
    try:
        _check(spec, pspec, use, backend, impl)
    except ParityError as exc:
        raise ParityError(exc.prop, str(exc).split("] ", 1)[1].rstrip(), repro) from None
    except Exception as exc:
        raise ParityError("error", f"{type(exc).__name__}: {exc}", repro) from exc


def _check(spec, pspec, use, backend, impl) -> None:
    torch._dynamo.reset()
    counters.clear()
    stack = 2 if use["vmap"] else 0
    grad = gen.needs_grad(use)
    step = gen.build_step(use, impl)
    x, idx = gen.make_inputs(spec)
    pspec2 = dict(pspec, seed=pspec["seed"] + 1)

    # Eager reference, on its own module and param sets built from the same seeds,
    # always with the real fcall (a broken ``impl`` must not be its own oracle).
    eager_step = gen.build_step(use, fcall)
    eager_model = gen.build_module(spec)
    p_eager = gen.make_params(eager_model, pspec, stack)
    q_eager = gen.make_params(eager_model, pspec2, stack)
    out_eager = _run(eager_step, eager_model, p_eager, x, idx, grad)
    out2_eager = _run(eager_step, eager_model, q_eager, x, idx, False)

    model = gen.build_module(spec)
    p = gen.make_params(model, pspec, stack)
    q = gen.make_params(model, pspec2, stack)
    before, p_before = module_state(model), params_state(p)
    counter = CompileCounterWithBackend(backend)
    if use["entry"] == "step":
        run, target = torch.compile(step, backend=counter, fullgraph=True), model
    else:
        run, target = step, torch.compile(model, backend=counter, fullgraph=True)

    out = _run(run, target, p, x, idx, grad)
    _close(out, out_eager, "output")
    if grad:
        _close(_grads(p), _grads(p_eager), "gradients of the params leaves")
    eager_order = module_state(eager_model)  # after both eager calls: each leaves one order
    compare_module(before, module_state(model), eager_order)
    _compare_params(p_before, p, p_eager)
    if counter.frame_count != 1:
        raise ParityError("graphs", f"{counter.frame_count} graphs for one call, expected 1")
    if counters["graph_break"]:
        raise ParityError("graph_breaks", f"graph breaks: {dict(counters['graph_break'])}")

    # A second param set of the same structure compiles nothing new. Where the first call
    # changed the order of some dict (to_module registers the names it writes again, at the
    # end, as tensordict's does), a guard on that order (where Dynamo reads it) recompiles
    # once first, as for tensordict's to_module: the order is stable from the second call on.
    frames = 1
    if [s[:3] for s in eager_order] != [s[:3] for s in before]:
        _run(run, target, p, x, idx, False)
        frames = counter.frame_count
        if frames > 2:
            raise ParityError("recompile", f"{frames} graphs after a reordering call, expected 2")
    try:
        with torch.compiler.set_stance("fail_on_recompile"):
            out2 = _run(run, target, q, x, idx, False)
    except RuntimeError as exc:
        if "recompil" in str(exc).lower():
            raise ParityError("recompile", f"second param set recompiled: {exc}") from None
        raise
    if counter.frame_count != frames:
        raise ParityError("recompile", f"{counter.frame_count} graphs after the second set")
    _close(out2, out2_eager, "output with the second param set")
    compare_module(before, module_state(model), eager_order)


def _compare_params(before, params, reference) -> None:
    after = params_state(params)
    ref = params_state(reference)
    if [a[0] for a in after] != [b[0] for b in before]:
        raise ParityError("params", "the params container's keys changed")
    for b, a, r in zip(before, after, ref):
        if a[1:4] != b[1:4]:
            raise ParityError("params", f"leaf {a[0]!r} changed identity/type/requires_grad")
        _close(a[4], r[4], f"params leaf {a[0]!r} afterwards")


def _by_slot(state: list[tuple]) -> list[tuple]:
    """``state`` sorted by (path, kind, name) for the slot rows; stable."""
    slots = ("_parameters", "_buffers")
    return sorted(state, key=lambda s: (s[0], s[1], s[2] if s[1] in slots else ""))


# ------------------------------------------------------------------ bad inputs

BAD_KINDS = ("typo", "not_tensor", "strict_missing", "tied_conflict", "memo", "state_dict_inplace")


def bad_call(kind: str, api: str):
    """A step raising on a bad input: ``(step(model, params, x, idx), needs)``."""
    if kind == "typo":
        mangle = "params = dict(params); params[next(iter(params)) + 'x'] = x\n"
    elif kind == "not_tensor":
        mangle = "params = dict(params); params[next(iter(params))] = 1.5\n"
    elif kind == "strict_missing":
        # the first key: a tied name's first occurrence, never an alias the tie covers
        mangle = "params = dict(list(params.items())[1:])\n"
    elif kind == "tied_conflict":
        mangle = "params = dict(params); params['head.weight'] = params['head.weight'] * 2\n"
    else:
        mangle = ""
    if api == "swap":
        strict = kind == "strict_missing"
        call = f"with fcall.swap(params, model, strict={strict}):\n        return model(x, idx)"
    elif api == "functional_call":
        strict = kind == "strict_missing"
        # torch.func sets a key the module lacks as an attribute: ask for fcall's KeyError
        raises = ', unknown_keys="raise"' if kind == "typo" else ""
        call = f"return fcall.functional_call(model, params, (x, idx), strict={strict}{raises})"
    else:
        extra = {"memo": ", memo={}", "state_dict_inplace": ", use_state_dict=True, inplace=False"}
        call = (
            f"with fcall.to_module(params, model{extra.get(kind, '')}):\n"
            "        return model(x, idx)"
        )
    lines = ["def step(model, params, x, idx):"]
    if mangle:
        lines.append("    " + mangle.rstrip("\n"))
    lines.append("    " + call)
    return "\n".join(lines) + "\n"


def check_bad_input(spec, kind: str, api: str, backend: str, impl: Any = fcall) -> None:
    """Same exception type and message compiled (fullgraph=False) as eager; module untouched."""
    src = bad_call(kind, api)
    torch._dynamo.reset()
    namespace: dict[str, Any] = {"torch": torch, "fcall": impl}
    exec(src, namespace)
    step = namespace["step"]
    x, idx = gen.make_inputs(spec)
    caught = []
    for compiled in (False, True):
        model = gen.build_module(spec)
        flat = {
            k: v.detach().clone() for k, v in fcall.from_module(model).flatten_keys(".").items()
        }
        before = module_state(model)
        run = torch.compile(step, backend=backend, fullgraph=False) if compiled else step
        try:
            run(model, flat, x, idx)
        except Exception as exc:
            caught.append((type(exc), str(exc)))
        else:
            caught.append((None, ""))
        try:
            compare_module(before, module_state(model))
        except ParityError as exc:
            raise ParityError("bad_input_module", f"{kind}/{api}: {exc}\n{src}") from None
    (etype, emsg), (ctype, cmsg) = caught
    if etype is None:
        raise ParityError("bad_input", f"{kind}/{api}: eager raised nothing\n{src}")
    if (etype, emsg) != (ctype, cmsg):
        raise ParityError(
            "bad_input",
            f"{kind}/{api}: eager raised {etype.__name__}({emsg!r}), "
            f"compiled raised {getattr(ctype, '__name__', None)}({cmsg!r})\n{src}",
        )


# ------------------------------------------- instances, late ties, shared submodules


def tied(spec) -> bool:
    """Whether the generated module has tied names (its tie marks then make a compiled
    function look its ties up per instance, fcall/_core/ties.py)."""
    return bool(spec["tie"] or spec.get("tie_later") or spec.get("shared"))


def _prepared(spec, cls: type, seed: int, pspec, use) -> nn.Module:
    """An instance of ``spec``'s architecture; with ``tie_later``, swapped once eagerly
    (its plan cached) and then tied."""
    model = gen.build_module(dict(spec, seed=seed), cls)
    if spec.get("tie_later"):
        with torch.no_grad():
            gen.build_step(use, fcall)(model, gen.make_params(model, pspec), *gen.make_inputs(spec))
        model.tie_late()
    return model


def check_instances(spec, pspec, use, backend: str, instances: int) -> None:
    """One compiled step (the module is its argument) called with ``instances``
    instances of one architecture: each gives what eager gives, the module untouched;
    one graph for all when nothing is tied (as torch.func), else at most one each."""
    pspec = _for_api(pspec, use)
    repro = gen.reproducer(spec, pspec, use, backend)
    try:
        _check_instances(spec, pspec, use, backend, instances)
    except ParityError as exc:
        raise ParityError(exc.prop, str(exc).split("] ", 1)[1].rstrip(), repro) from None
    except Exception as exc:
        raise ParityError("error", f"{type(exc).__name__}: {exc}", repro) from exc


def _check_instances(spec, pspec, use, backend: str, instances: int) -> None:
    torch._dynamo.reset()
    counters.clear()
    grad = gen.needs_grad(use)
    step, eager_step = gen.build_step(use), gen.build_step(use, fcall)
    x, idx = gen.make_inputs(spec)
    counter = CompileCounterWithBackend(backend)
    run = torch.compile(step, backend=counter, fullgraph=True)
    cls = gen.module_class(spec)  # one class: instances of one architecture
    for i in range(instances):
        seed = spec["seed"] + i
        model, eager_model = (_prepared(spec, cls, seed, pspec, use) for _ in range(2))
        p, p_eager = gen.make_params(model, pspec), gen.make_params(eager_model, pspec)
        before = module_state(model)
        out = _run(run, model, p, x, idx, grad)
        _close(out, _run(eager_step, eager_model, p_eager, x, idx, grad), f"instance {i}")
        if grad:
            _close(_grads(p), _grads(p_eager), f"gradients, instance {i}")
        compare_module(before, module_state(model), module_state(eager_model))
    if counters["graph_break"]:
        raise ParityError("graph_breaks", f"graph breaks: {dict(counters['graph_break'])}")
    most = instances if tied(spec) else 1
    if not 1 <= counter.frame_count <= most:
        raise ParityError("graphs", f"{counter.frame_count} graphs for {instances} instances")
