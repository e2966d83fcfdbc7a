"""Compile parity: every generated example, eager vs compiled, one graph, no recompile.

See docs/parity.md. Each test draws (module spec, param set spec, use spec) and
runs ``checks.check_parity``; a failure prints a self-contained reproducer.
"""

from __future__ import annotations

import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from . import checks
from . import generators as gen
from .conftest import examples

BACKENDS = ("eager", "aot_eager")

FAMILIES = {
    "linear": ("linear", "tanh", "dropout"),
    "conv": ("conv1d", "conv2d", "tanh"),
    "batchnorm": ("bn1d", "bn2d", "linear"),
    "norm_embedding": ("layernorm", "embedding", "linear"),
    "attention": ("mha", "encoder", "layernorm"),
    "rnn": ("gru", "lstm", "linear"),
    "everything": tuple(gen.BLOCKS),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("entry", ("step", "model"))
@pytest.mark.parametrize("api", ("swap", "to_module", "functional_call"))
@settings(max_examples=examples(4))
@given(data=st.data())
def test_parity_by_api(api, entry, backend, data):
    spec = data.draw(gen.module_specs(backend, max_blocks=3), "module")
    pspec = data.draw(gen.param_specs(), "params")
    use = data.draw(gen.use_specs(apis=(api,), entries=(entry,)), "use")
    checks.check_parity(spec, pspec, use, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
@settings(max_examples=examples(3))
@given(data=st.data())
def test_parity_by_module_family(family, backend, data):
    spec = data.draw(gen.module_specs(backend, kinds=FAMILIES[family]), "module")
    pspec = data.draw(gen.param_specs(), "params")
    use = data.draw(gen.use_specs(), "use")
    checks.check_parity(spec, pspec, use, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", gen.DTYPES)
@settings(max_examples=examples(3))
@given(data=st.data())
def test_parity_by_dtype(dtype, backend, data):
    spec = data.draw(gen.module_specs(backend, dtypes=(dtype,), max_blocks=3), "module")
    pspec = data.draw(gen.param_specs(), "params")
    use = data.draw(gen.use_specs(), "use")
    checks.check_parity(spec, pspec, use, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("container", gen.CONTAINERS)
@settings(max_examples=examples(3))
@given(data=st.data())
def test_parity_by_container(container, backend, data):
    spec = data.draw(gen.module_specs(backend, max_blocks=3), "module")
    pspec = data.draw(gen.param_specs(containers=(container,)), "params")
    use = data.draw(gen.use_specs(), "use")
    checks.check_parity(spec, pspec, use, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("api", ("swap", "functional_call"))
@settings(max_examples=examples(3))
@given(data=st.data())
def test_parity_under_vmap(api, backend, data):
    kinds = tuple(k for k in gen.BLOCKS if k not in gen.NO_VMAP)
    spec = data.draw(
        gen.module_specs(backend, kinds=kinds, dtypes=("float32", "float64"), needs_tensors=True),
        "module",
    )
    pspec = data.draw(gen.param_specs(containers=("td", "nested", "flat")), "params")
    # Under vmap two keys holding one tensor arrive as two batched tensors, which
    # tie_weights=True refuses (as torch.func.functional_call does): give it once.
    pspec["drop_alias"] = True
    use = data.draw(gen.use_specs(apis=(api,), entries=("step",)), "use")
    use["vmap"] = True
    checks.check_parity(spec, pspec, use, backend)


# Inductor: a small deterministic sample (compiling C++ is slow on 2 cores).
INDUCTOR_SAMPLE = [
    (
        {
            "seed": 3,
            "features": 4,
            "heads": 2,
            "dtype": "float32",
            "body": {
                "container": "seq",
                "children": [
                    {"kind": "linear"},
                    {"kind": "bn2d", "train": True},
                    {"container": "dict", "children": [{"kind": "layernorm"}]},
                ],
            },
            "tie": True,
            "buffers": "both",
            "frozen": [2],
        },
        {"seed": 7, "kinds": ["param", "grad", "plain"], "container": "td", "drop_alias": False},
        {
            "api": "swap",
            "entry": "step",
            "vmap": False,
            "kw": {"tie_weights": True, "strict": True},
        },
    ),
    (
        {
            "seed": 5,
            "features": 4,
            "heads": 2,
            "dtype": "float32",
            "body": {"container": "list", "children": [{"kind": "conv1d"}, {"kind": "mha"}]},
            "tie": False,
            "buffers": "persistent",
            "frozen": [],
        },
        {"seed": 9, "kinds": ["grad"], "container": "flat", "drop_alias": True},
        {
            "api": "to_module",
            "entry": "model",
            "target": "compiled",
            "vmap": False,
            "form": "with",
            "kw": {
                "inplace": None,
                "use_state_dict": False,
                "non_blocking": False,
                "preserve_module_state": True,
                "swap_dest": "none",
            },
        },
    ),
    (
        {
            "seed": 11,
            "features": 2,
            "heads": 1,
            "dtype": "float64",
            "body": {"container": "dict", "children": [{"kind": "embedding"}, {"kind": "linear"}]},
            "tie": False,
            "buffers": "none",
            "frozen": [],
        },
        {"seed": 13, "kinds": ["param"], "container": "nested", "drop_alias": False},
        {
            "api": "functional_call",
            "entry": "step",
            "vmap": False,
            "kw": {"tie_weights": True, "strict": False},
        },
    ),
]


@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="no C++")
@pytest.mark.parametrize("case", range(len(INDUCTOR_SAMPLE)))
def test_parity_inductor_sample(case):
    spec, pspec, use = INDUCTOR_SAMPLE[case]
    checks.check_parity(spec, pspec, use, "inductor")


# ------------------------------------------------------------------ bad inputs

TIED = {
    "seed": 1,
    "features": 4,
    "heads": 1,
    "dtype": "float32",
    "body": {"container": "seq", "children": [{"kind": "linear"}, {"kind": "bn2d", "train": True}]},
    "tie": True,
    "buffers": "both",
    "frozen": [],
}
BAD = [
    (kind, api)
    for kind in checks.BAD_KINDS
    for api in ("swap", "to_module", "functional_call")
    if not (kind in ("memo", "state_dict_inplace") and api != "to_module")
    and not (kind == "strict_missing" and api == "to_module")
    and not (kind == "tied_conflict" and api == "to_module")
]


@pytest.mark.parametrize(("kind", "api"), BAD)
def test_bad_input_same_error_compiled_and_module_untouched(kind, api):
    checks.check_bad_input(TIED, kind, api, "eager")


# ------------------- modules as arguments: instances, late ties, shared submodules, tuples


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("api", ("swap", "to_module", "functional_call"))
@settings(max_examples=examples(1))  # ci: one example per (api, backend), ~+8% of the suite
@given(data=st.data())
def test_parity_instances_of_one_architecture(api, backend, data):
    kinds = tuple(k for k in gen.BLOCKS if k not in gen.RNNS)
    spec = data.draw(gen.module_specs(backend, kinds, max_blocks=2, conformance=True), "module")
    containers = (*gen.CONTAINERS, "tuple") if api == "functional_call" else gen.CONTAINERS
    pspec = data.draw(gen.param_specs(containers=containers), "params")
    use = data.draw(gen.use_specs(apis=(api,), entries=("step",)), "use")
    instances = data.draw(st.integers(2, 3), "instances")
    checks.check_instances(spec, pspec, use, backend, instances)
