"""Hypothesis strategies for the compile-parity suite, and the code they render.

Everything an example needs is a *spec*: small plain data (dicts, lists, strings,
ints) drawn by hypothesis. A spec is turned into Python *source* (the module
class, the use of the swap API) which is then ``exec``-ed, so the code that runs
in a test and the reproducer printed on failure are the same text.

* ``module_specs()``: a tree of blocks (``BLOCKS``) inside nested Sequential /
  ModuleList / ModuleDict containers, a dtype, tied weights, persistent and
  non-persistent buffers, frozen blocks, BatchNorm train/eval, a seed.
* ``param_specs()``: leaf kinds (Parameter, plain tensor, tensor requiring grad),
  container kind (TensorDict, nested dict, flat dict, TensorDictParams), a seed.
* ``use_specs()``: ``fcall.swap`` / ``fcall.to_module`` (random valid keywords)
  / ``fcall.functional_call``, entry point (compiled step or compiled model),
  optionally ``torch.vmap`` over stacked param sets.

To add a module family, see docs/parity.md ("Adding a module family").
"""

from __future__ import annotations

import inspect
import pprint
import textwrap
from typing import Any

import torch
from hypothesis import strategies as st
from tensordict import TensorDict, TensorDictBase
from torch import nn

import fcall

# The TensorDictParams container kind is generated only when fcall exports it.
HAS_TDPARAMS = hasattr(fcall, "TensorDictParams")
# Containers that carry tensordict state (see ``with_tensordict_state``): a TensorDict
# whose own ops left a ``_last_op`` record, a TensorDictParams after
# ``clear_refs_for_compile_()`` (as TorchRL's losses leave it).
STATEFUL_CONTAINERS = ("td_last_op", *(("tdparams_cleared",) if HAS_TDPARAMS else ()))
CONTAINERS = (
    "td",
    "nested",
    "flat",
    *(("tdparams",) if HAS_TDPARAMS else ()),
    *STATEFUL_CONTAINERS,
)

BATCH, TIME, VOCAB = 2, 3, 5
DTYPES = ("float32", "float64", "bfloat16")
LEAF_KINDS = ("param", "plain", "grad")

# name -> (constructor template, forward template). ``{F}`` is the feature size,
# ``{H}`` a head count dividing it, ``{ref}`` the path of the block in the tree.
# Every block maps ``x`` of shape (BATCH, TIME, F) to the same shape.
BLOCKS: dict[str, tuple[str, str]] = {
    "linear": ("nn.Linear({F}, {F})", "x = {ref}(x)"),
    "conv1d": ("nn.Conv1d({F}, {F}, 3, padding=1)", "x = {ref}(x.transpose(1, 2)).transpose(1, 2)"),
    "conv2d": (
        "nn.Conv2d({F}, {F}, 3, padding=1)",
        "x = {ref}(x.transpose(1, 2).unsqueeze(-1)).squeeze(-1).transpose(1, 2)",
    ),
    "bn1d": ("nn.BatchNorm1d({F})", "x = {ref}(x.transpose(1, 2)).transpose(1, 2)"),
    "bn2d": (
        "nn.BatchNorm2d({F})",
        "x = {ref}(x.transpose(1, 2).unsqueeze(-1)).squeeze(-1).transpose(1, 2)",
    ),
    "layernorm": ("nn.LayerNorm({F})", "x = {ref}(x)"),
    "embedding": (f"nn.Embedding({VOCAB}, {{F}})", "x = x + {ref}(idx)"),
    "mha": (
        "nn.MultiheadAttention({F}, {H}, batch_first=True)",
        "x = {ref}(x, x, x, need_weights=False)[0]",
    ),
    "encoder": (
        "nn.TransformerEncoderLayer({F}, {H}, dim_feedforward={F2}, dropout=0.0, batch_first=True)",
        "x = {ref}(x)",
    ),
    "gru": ("nn.GRU({F}, {F}, batch_first=True)", "x = {ref}(x)[0]"),
    "lstm": ("nn.LSTM({F}, {F}, batch_first=True)", "x = {ref}(x)[0]"),
    "dropout": ("nn.Dropout(p=0.0)", "x = {ref}(x)"),
    "tanh": ("nn.Tanh()", "x = {ref}(x)"),
}
RNNS = ("gru", "lstm")
BATCHNORMS = ("bn1d", "bn2d")
# Blocks that torch.vmap cannot run with batched weights (in-place running stats
# on unbatched inputs, cuDNN-style flat weights).
NO_VMAP = (*RNNS, *BATCHNORMS)
# BatchNorm1d (on its (N, C, L) input) is generated only for these backends. Under
# AOTAutograd (aot_eager, inductor) on CPU torch fails on it with "view size is not
# compatible with input tensor's size and stride": with or without fcall, without
# any swap at all (a plain compiled module), in forward for a transposed input (the
# eager kernel returns a contiguous output, the fake/meta kernel predicts the
# input's strides) and in backward after a Linear even for a contiguous input.
# Pinned in test_regressions.py; see docs/parity.md.
BN1D_BACKENDS = ("eager",)
# A BatchNorm2d in eval mode right after another BatchNorm2d (through the blocks'
# transpose(1, 2).unsqueeze(-1) / squeeze(-1).transpose(1, 2)) only for these backends:
# under AOTAutograd on CPU the first one's weight and bias gradients differ from eager
# (every element), with no fcall involved (a plain compiled module). Pinned in
# test_regressions.py; module_specs turns such a second BatchNorm2d to train mode.
BN2D_EVAL_AFTER_BN2D_BACKENDS = ("eager",)
# A BatchNorm2d (train or eval) whose input comes from a MultiheadAttention or a
# convolution, directly or through blocks that keep its strides (dropout, tanh, an
# embedding added): only for these backends. Under AOTAutograd on CPU, with no fcall
# involved (a plain compiled module), the backward after an attention fails with "view
# size is not compatible with input tensor's size and stride", and after a Conv1d or
# Conv2d the gradients differ from eager in every element once an elementwise op
# follows the BatchNorm (`x * self.scale`, a tanh). Pinned in test_regressions.py;
# module_specs turns such a BatchNorm2d into a LayerNorm for the other backends.
BN2D_AFTER_BACKENDS = ("eager",)
BN2D_BAD_INPUTS = ("mha", "conv1d", "conv2d")
# Blocks whose output keeps the strides of their input.
STRIDE_KEEPING = ("dropout", "tanh", "embedding")
# GRU / LSTM likewise, for the eager backend only: AOTAutograd (allow_rnn is
# experimental) fails on swapped RNN weights that mix Parameters, plain tensors and
# tensors that require grad with "expected all tensors_saved_with_vc_check to be
# Tensors" (oneDNN's "could not create a primitive descriptor for the LSTM forward
# propagation primitive" on some shapes) - with torch.func.functional_call exactly
# as with fcall. Pinned in test_regressions.py.
RNN_BACKENDS = ("eager",)


# --------------------------------------------------------------------------- specs


@st.composite
def _block(draw, kinds):
    kind = draw(st.sampled_from(kinds))
    block: dict[str, Any] = {"kind": kind}
    if kind in BATCHNORMS:
        block["train"] = draw(st.booleans())
    return block


def _tree(kinds, depth):
    leaf = _block(kinds)
    if depth == 0:
        return leaf
    node = st.fixed_dictionaries(
        {
            "container": st.sampled_from(("seq", "list", "dict")),
            "children": st.lists(_tree(kinds, depth - 1), min_size=1, max_size=3),
        }
    )
    return st.one_of(leaf, node)


# Blocks with no parameter and no buffer.
STATELESS_BLOCKS = ("dropout", "tanh")


@st.composite
def module_specs(
    draw,
    backend,
    kinds=tuple(BLOCKS),
    dtypes=DTYPES,
    max_blocks=4,
    conformance=False,
    needs_tensors=False,
):
    """A module tree for ``backend``; ``kinds`` restricts the block families drawn.

    ``conformance``: also draw a block registered at a second path (``shared``) and a
    tie made after a first swap (``tie_later``, see ``module_source``). ``needs_tensors``:
    the module has at least one parameter or buffer (``torch.vmap`` over a param set needs
    a tensor to map over): a tree of stateless blocks only gets the ``scale`` buffer."""
    if backend not in BN1D_BACKENDS:
        kinds = tuple(k for k in kinds if k != "bn1d")
    if backend not in RNN_BACKENDS:
        kinds = tuple(k for k in kinds if k not in RNNS) or ("linear",)
    children = draw(st.lists(_tree(kinds, 2), min_size=1, max_size=3))
    features = draw(st.sampled_from((2, 4, 6, 8)))
    spec = {
        "seed": draw(st.integers(0, 2**16)),
        "features": features,
        "heads": draw(st.sampled_from([h for h in (1, 2) if features % h == 0])),
        "dtype": draw(st.sampled_from(dtypes)),
        "body": {"container": draw(st.sampled_from(("seq", "list", "dict"))), "children": []},
        "tie": draw(st.booleans()),
        "buffers": draw(st.sampled_from(("none", "persistent", "both"))),
        "frozen": [],
    }
    # Keep the tree small: cut it at max_blocks leaves.
    budget = [max_blocks]

    def cut(node):
        if "kind" in node:
            if budget[0] <= 0:
                return None
            budget[0] -= 1
            return node
        kept = [c for c in (cut(c) for c in node["children"]) if c is not None]
        return {"container": node["container"], "children": kept} if kept else None

    spec["body"]["children"] = [c for c in (cut(c) for c in children) if c is not None]
    if backend not in BN2D_EVAL_AFTER_BN2D_BACKENDS:
        _no_bn2d_eval_after_bn2d(spec)
    if backend not in BN2D_AFTER_BACKENDS:
        _no_bn2d_after_bad_inputs(spec)
    n = len(block_refs(spec))
    if (
        needs_tensors
        and spec["buffers"] == "none"
        and not spec["tie"]
        and all(block["kind"] in STATELESS_BLOCKS for _, block in block_refs(spec))
    ):
        spec["buffers"] = "persistent"
    spec["frozen"] = draw(st.lists(st.integers(0, n - 1), max_size=2, unique=True))
    if conformance:
        spec["shared"] = draw(st.booleans())
        spec["tie_later"] = draw(st.booleans())
    return spec


@st.composite
def param_specs(draw, containers=CONTAINERS):
    return {
        "seed": draw(st.integers(0, 2**16)),
        "kinds": draw(
            st.lists(st.sampled_from(("param", "plain", "grad")), min_size=1, max_size=4)
        ),
        "container": draw(st.sampled_from(containers)),
        "drop_alias": draw(st.booleans()),
    }


TO_MODULE_FORMS = ("with", "manual")


@st.composite
def to_module_keywords(draw):
    """A random valid combination of ``fcall.to_module`` keywords and a form of use."""
    form = draw(st.sampled_from(TO_MODULE_FORMS))
    use_state_dict = draw(st.booleans())
    inplace = None if use_state_dict else draw(st.sampled_from((None, False, True)))
    kw: dict[str, Any] = {
        "inplace": inplace,
        "use_state_dict": use_state_dict,
        "non_blocking": draw(st.booleans()),
        "preserve_module_state": draw(st.booleans()),
    }
    # swap_dest: a TensorDict made inside the step (one passed in is a documented
    # limit for the ``with`` form).
    kw["swap_dest"] = draw(st.sampled_from(("none", "td")))
    return {"form": form, "kw": kw}


@st.composite
def use_specs(draw, apis=("swap", "to_module", "functional_call"), entries=("step", "model")):
    api = draw(st.sampled_from(apis))
    use: dict[str, Any] = {"api": api, "entry": draw(st.sampled_from(entries)), "vmap": False}
    if api == "to_module":
        use.update(draw(to_module_keywords()))
    else:
        use["kw"] = {"tie_weights": True, "strict": draw(st.booleans())}
    if use["entry"] == "model":
        # fcall accepts the compiled wrapper itself (the _orig_mod. prefix is optional).
        # functional_call calls its target, so it must be given the compiled module.
        targets = ("compiled",) if api == "functional_call" else ("compiled", "original")
        use["target"] = draw(st.sampled_from(targets))
    return use


def _no_bn2d_eval_after_bn2d(spec) -> None:
    """Turn a BatchNorm2d in eval mode that follows another BatchNorm2d in forward order
    (a zero-probability Dropout between them passes the tensor on) to train mode: the
    torch limit of ``BN2D_EVAL_AFTER_BN2D_BACKENDS``."""
    previous = None
    for _, block in block_refs(spec):
        if block["kind"] == "dropout":
            continue
        if block["kind"] == "bn2d" and previous == "bn2d" and not block["train"]:
            block["train"] = True
        previous = block["kind"]


def _no_bn2d_after_bad_inputs(spec) -> None:
    """Turn a BatchNorm2d whose input comes from one of ``BN2D_BAD_INPUTS`` (through
    ``STRIDE_KEEPING`` blocks only) into a LayerNorm: the torch limit of
    ``BN2D_AFTER_BACKENDS``."""
    previous = None
    for _, block in block_refs(spec):
        if block["kind"] in STRIDE_KEEPING:
            continue
        if block["kind"] == "bn2d" and previous in BN2D_BAD_INPUTS:
            block.clear()
            block["kind"] = "layernorm"
        previous = block["kind"]


# ------------------------------------------------------------------ module source


def _walk(node, path, out):
    if "kind" in node:
        out.append((path, node))
        return
    for i, child in enumerate(node["children"]):
        key = f'["b{i}"]' if node["container"] == "dict" else f"[{i}]"
        _walk(child, path + key, out)


def block_refs(spec) -> list[tuple[str, dict]]:
    """``(python path, block)`` of every block, in forward order."""
    out: list[tuple[str, dict]] = []
    _walk(spec["body"], "self.body", out)
    return out


def _ctor(node, spec, indent):
    fmt = {"F": spec["features"], "H": spec["heads"], "F2": 2 * spec["features"]}
    if "kind" in node:
        return BLOCKS[node["kind"]][0].format(**fmt)
    pad = "    " * (indent + 1)
    items = [_ctor(c, spec, indent + 1) for c in node["children"]]
    if node["container"] == "dict":
        body = "".join(f'{pad}"b{i}": {item},\n' for i, item in enumerate(items))
        return "nn.ModuleDict({\n" + body + "    " * indent + "})"
    name = "nn.Sequential(" if node["container"] == "seq" else "nn.ModuleList([\n"
    body = "".join(f"{pad}{item},\n" for item in items)
    return (
        name
        + ("\n" if node["container"] == "seq" else "")
        + body
        + "    " * indent
        + (")" if node["container"] == "seq" else "])")
    )


def module_source(spec) -> str:
    """The source of ``class Net(nn.Module)`` for ``spec``."""
    refs = block_refs(spec)
    F = spec["features"]
    init = [f"self.body = {_ctor(spec['body'], spec, 2)}"]
    fwd = []
    for path, block in refs:
        if block["kind"] in BATCHNORMS and not block["train"]:
            init.append(f"{path}.eval()")
        fwd.append(BLOCKS[block["kind"]][1].format(ref=path))
    for i in spec["frozen"]:
        init.append(f"for p in {refs[i][0]}.parameters():\n    p.requires_grad_(False)")
    if spec["tie"]:
        linears = [path for path, b in refs if b["kind"] == "linear"]
        init.append(f"self.head = nn.Linear({F}, {F}, bias=False)")
        if linears:
            init.append(f"self.head.weight = {linears[0]}.weight  # tied")
        else:
            init.append(f"self.head2 = nn.Linear({F}, {F}, bias=False)")
            init.append("self.head2.weight = self.head.weight  # tied")
            fwd.append("x = self.head2(x)")
        fwd.append("x = self.head(x)")
    if spec.get("shared"):  # the first block at a second path too: its names are tied
        init.append(f"self.again = nn.ModuleList([{refs[0][0]}])")
    tie_later = []
    if spec.get("tie_later"):  # tie_late() is called after a first swap (checks.py)
        linears = [path for path, b in refs if b["kind"] == "linear"]
        init.append(f"self.late = nn.Linear({F}, {F}, bias=False)")
        if not linears:
            init.append(f"self.late0 = nn.Linear({F}, {F}, bias=False)")
            fwd.append("x = self.late0(x)")
        fwd.append("x = self.late(x)")
        tie_later = [
            "    def tie_late(self):",
            f"        self.late.weight = {(linears or ['self.late0'])[0]}.weight",
        ]
    if spec["buffers"] != "none":
        init.append(f'self.register_buffer("scale", torch.rand({F}) + 0.5)')
        fwd.append("x = x * self.scale")
    if spec["buffers"] == "both":
        init.append(f'self.register_buffer("shift", torch.randn({F}), persistent=False)')
        fwd.append("x = x + self.shift")
    init.append(f"self.to(torch.{spec['dtype']})")
    fwd.append("return x")
    init_src = textwrap.indent("\n".join(init), " " * 8)
    fwd_src = textwrap.indent("\n".join(fwd), " " * 8)
    return (
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        f"{init_src}\n\n"
        "    def forward(self, x, idx):\n"
        f"{fwd_src}\n" + ("\n" + "\n".join(tie_later) + "\n" if tie_later else "")
    )


def module_class(spec) -> type:
    namespace: dict[str, Any] = {"torch": torch, "nn": nn}
    exec(module_source(spec), namespace)
    return namespace["Net"]


def build_module(spec, cls: type | None = None) -> nn.Module:
    """An instance of ``spec``'s ``Net`` (of ``cls``, its class made once, for several
    instances of one architecture)."""
    cls = module_class(spec) if cls is None else cls
    torch.manual_seed(spec["seed"])
    return cls()


def make_inputs(spec):
    g = torch.Generator().manual_seed(spec["seed"] + 1)
    shape = (BATCH, TIME, spec["features"])
    x = torch.randn(shape, generator=g).to(getattr(torch, spec["dtype"]))
    idx = torch.randint(0, VOCAB, (BATCH, TIME), generator=g)
    return x, idx


# --------------------------------------------------------------------- param sets


def make_params(module, pspec, stack=0):
    """A param set for ``module``: every parameter and buffer, new random values.

    Tied names share one tensor (with ``drop_alias`` only the first name is given, unless
    ``every_name``: to_module's sets, see checks._for_api).
    Leaf kinds cycle through ``pspec["kinds"]`` over the parameters; buffers are
    plain tensors. ``stack=N`` stacks N sets along a new dim 0 (for vmap).
    """
    g = torch.Generator().manual_seed(pspec["seed"])
    names = dict(module.named_parameters(remove_duplicate=False))
    entries = list(names.items()) + list(module.named_buffers(remove_duplicate=False))
    made, flat, i = {}, {}, 0
    for name, old in entries:
        if id(old) in made:
            # TensorDictParams wraps each leaf on its own, so two keys never share
            # one tensor there: tied names are given once (see docs/parity.md).
            if pspec.get("every_name") or (
                not pspec["drop_alias"]
                and pspec["container"] not in ("tdparams", "tdparams_cleared")
            ):
                flat[name] = made[id(old)]
            continue
        shape = (stack, *old.shape) if stack else old.shape
        if old.is_floating_point():
            value = torch.randn(shape, generator=g, dtype=torch.float64) * 0.5
            if name.endswith("running_var"):
                value = value.abs() + 0.5
            value = value.to(old.dtype)
        else:
            value = old.detach().clone().expand(shape).clone()
        if name in names:
            kind = pspec["kinds"][i % len(pspec["kinds"])]
            i += 1
            if kind == "param":
                value = nn.Parameter(value, requires_grad=old.requires_grad)
            elif kind == "grad":
                value.requires_grad_(True)
        made[id(old)] = flat[name] = value
    if pspec["container"] == "flat":
        return flat
    if pspec["container"] == "tuple":  # torch.func's (params, buffers) form
        return (
            {k: v for k, v in flat.items() if k in names},
            {k: v for k, v in flat.items() if k not in names},
        )
    nested: dict = {}
    for name, value in flat.items():
        *path, last = name.split(".")
        node = nested
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    if pspec["container"] == "nested":
        return nested
    # A stacked set is batched along dim 0, so that torch.vmap maps over it.
    td = TensorDict(nested, batch_size=[stack] if stack else [])
    if pspec["container"] in ("tdparams", "tdparams_cleared"):
        # Its float -> Parameter(requires_grad=True) rule breaks BatchNorm's running
        # stats (not differentiable), eagerly too: keep leaves as given there.
        bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())
        td = fcall.TensorDictParams(td, no_convert=bn)
    return with_tensordict_state(td, pspec["container"])


def with_tensordict_state(td, container: str):
    """``td`` carrying the tensordict state that ``container`` names (``STATEFUL_CONTAINERS``),
    as users' params arrive: ``td_last_op``, a ``_last_op`` record left by tensordict's own
    ``lock_()`` / ``unlock_()`` (a ``with`` record holding a weakref, as ``to_module``'s);
    ``tdparams_cleared``, ``clear_refs_for_compile_()`` writing ``_last_op = None`` into a
    TensorDictParams and its nodes. Any other container comes back as it is."""
    if container == "td_last_op":
        td.lock_().unlock_()
        assert td.__dict__["_last_op"][0] == "unlock_"
    elif container == "tdparams_cleared":
        td.clear_refs_for_compile_()
        assert "_last_op" in td.__dict__
    return td


def leaves(params) -> list[tuple[str, torch.Tensor]]:
    """``(dotted key, tensor)`` of a params container, in order."""
    if isinstance(params, tuple):
        return [leaf for part in params for leaf in leaves(part)]
    if isinstance(params, TensorDictBase):
        return [
            (".".join(k) if isinstance(k, tuple) else k, v)
            for k, v in params.items(include_nested=True, leaves_only=True)
        ]
    out = []

    def walk(node, prefix):
        for k, v in node.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                out.append((f"{prefix}{k}", v))

    walk(params, "")
    return out


# ------------------------------------------------------------------------- uses


def _kw_source(kw) -> str:
    parts = []
    for key, value in kw.items():
        if key == "swap_dest":
            if value == "none":
                continue
            parts.append("swap_dest=TensorDict()")
        else:
            parts.append(f"{key}={value!r}")
    return ", ".join(parts)


def use_source(use) -> str:
    """The source of ``step(model, params, x, idx)``: swap, call, restore.

    For ``entry="model"`` the caller passes the compiled model as ``model``;
    the swap runs eagerly around the compiled forward.
    """
    api, kw = use["api"], _kw_source(use["kw"])
    target = "model"
    if use.get("target") == "original":
        target = 'getattr(model, "_orig_mod", model)'
    if use["entry"] == "step":
        target = "model"
    call = "model(x, idx)"
    if use["vmap"]:
        body = (
            f"def one(p):\n    return fcall.functional_call({target}, p, (x, idx), {kw})\n"
            if api == "functional_call"
            else f"def one(p):\n    with fcall.swap(p, {target}, {kw}):\n        return {call}\n"
        )
        body += "return torch.vmap(one)(params)\n"
    elif api == "swap":
        body = f"with fcall.swap(params, {target}, {kw}):\n    return {call}\n"
    elif api == "functional_call":
        body = f"return fcall.functional_call({target}, params, (x, idx), {kw})\n"
    elif use["form"] == "with":
        body = f"with fcall.to_module(params, {target}, {kw}):\n    return {call}\n"
    else:
        restore = f", inplace={use['kw']['inplace']!r}" if use["kw"]["inplace"] else ""
        body = (
            f"old = fcall.to_module(params, {target}, {kw})\n"
            f"out = {call}\n"
            f"fcall.to_module(old, {target}{restore})\n"
            f"return out\n"
        )
    if use["api"] == "to_module" and use["kw"]["inplace"]:
        # inplace=True copies back over tensors saved for backward: no_grad only.
        body = "with torch.no_grad():\n" + textwrap.indent(body, "    ")
    return "def step(model, params, x, idx):\n" + textwrap.indent(body, "    ")


def build_step(use, impl=fcall):
    namespace: dict[str, Any] = {"torch": torch, "fcall": impl, "TensorDict": TensorDict}
    exec(use_source(use), namespace)
    return namespace["step"]


def needs_grad(use) -> bool:
    return not (use["api"] == "to_module" and use["kw"]["inplace"])


# -------------------------------------------------------------------- reproducer


def reproducer(spec, pspec, use, backend) -> str:
    """Self-contained Python code that re-runs one example eagerly and compiled."""
    helpers = inspect.getsource(make_params) + "\n\n" + inspect.getsource(with_tensordict_state)
    return f"""\
# ---- fcall compile-parity reproducer ----
import torch, fcall
from torch import nn
from tensordict import TensorDict
from torch._dynamo.testing import CompileCounterWithBackend
torch._dynamo.config.allow_rnn = True

{module_source(spec)}

{helpers}
{use_source(use)}
spec = {pprint.pformat(spec, width=90)}
pspec = {pprint.pformat(pspec, width=90)}
use = {pprint.pformat(use, width=90)}
stack = {2 if use["vmap"] else 0}

def build():
    torch.manual_seed(spec["seed"])
    return Net()

g = torch.Generator().manual_seed(spec["seed"] + 1)
x = torch.randn({BATCH}, {TIME}, spec["features"], generator=g).to(torch.{spec["dtype"]})
idx = torch.randint(0, {VOCAB}, ({BATCH}, {TIME}), generator=g)
eager_model, model = build(), build()
expected = step(eager_model, make_params(eager_model, pspec, stack), x, idx)
counter = CompileCounterWithBackend({backend!r})
if use["entry"] == "step":
    run = torch.compile(step, backend=counter, fullgraph=True)
    target = model
else:
    run, target = step, torch.compile(model, backend=counter, fullgraph=True)
got = run(target, make_params(model, pspec, stack), x, idx)
torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)
pspec2 = dict(pspec, seed=pspec["seed"] + 1)
with torch.compiler.set_stance("fail_on_recompile"):
    run(target, make_params(model, pspec2, stack), x, idx)
print("graphs:", counter.frame_count)
"""
