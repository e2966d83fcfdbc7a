"""Dogfood: fcall.testing over real architectures built from configs, random init, no download.

From transformers: GPT-2 (its head tied to the token embedding), Llama, T5 (encoder,
decoder and head tied to one embedding); from timm: a ResNet, a ViT, an EfficientNet. Tiny
sizes, eval and train mode, the three APIs spread over them, backends eager and aot_eager:
no graph break beyond the model's own (counted with a plain ``torch.compile`` of the model),
no recompile over 3 sets, compiled == eager (outputs, gradients, buffers), exact restore.

Needs the ``zoo`` extra (``pip install -e ".[zoo]"``). timm and transformers import
torchvision, which the index only ships beside torch 2.14+ here: the noxfile's
torch2.14.1 stack installs the extra; elsewhere these tests skip.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
import torch
import torch._dynamo
from torch import nn

from fcall.testing import check_swap_parity

BACKENDS = ("eager", "aot_eager")
SETS = 3


def _library(name: str) -> ModuleType:
    """The library, or a skip: the zoo extra is installed on the torch 2.14.1 stack only."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:  # not installed, or torchvision that cannot load beside torch
        pytest.skip(f"{name} is not importable here (the zoo extra): {exc}")


@pytest.fixture(autouse=True)
def _reset_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# ---------------------------------------------------------------------------- the models


def gpt2() -> tuple[nn.Module, tuple[Any, ...]]:
    tf = _library("transformers")
    config = tf.GPT2Config(
        vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2, use_cache=False,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    model = tf.GPT2LMHeadModel(config)
    assert model.lm_head.weight is model.transformer.wte.weight  # the tied head
    return model, (torch.randint(0, 64, (2, 8)),)


def llama() -> tuple[nn.Module, tuple[Any, ...]]:
    tf = _library("transformers")
    config = tf.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, use_cache=False,
    )  # fmt: skip
    return tf.LlamaForCausalLM(config), (torch.randint(0, 64, (2, 8)),)


def t5() -> tuple[nn.Module, tuple[Any, ...]]:
    tf = _library("transformers")
    config = tf.T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        dropout_rate=0.0, use_cache=False, decoder_start_token_id=0,
    )  # fmt: skip
    model = tf.T5ForConditionalGeneration(config)
    ids = torch.randint(0, 64, (2, 8))
    return model, (ids, None, ids[:, :5])  # input_ids, attention_mask, decoder_input_ids


def _timm(name: str, **kwargs: Any) -> Callable[[], tuple[nn.Module, tuple[Any, ...]]]:
    def build() -> tuple[nn.Module, tuple[Any, ...]]:
        timm = _library("timm")
        model = timm.create_model(name, pretrained=False, num_classes=5, **kwargs)
        return model, (torch.randn(2, 3, 32, 32),)

    build.__name__ = name
    return build


# timm's own tiny variants of each architecture (made for its CI)
resnet = _timm("test_resnet", drop_rate=0.0)
vit = _timm("test_vit", img_size=32, drop_rate=0.0)
efficientnet = _timm("test_efficientnet", drop_rate=0.0, drop_path_rate=0.0)

# (model, mode, API): every model in both modes, every API on transformers and timm models.
CASES = [
    (gpt2, "eval", "swap"),
    (gpt2, "train", "functional_call"),
    (llama, "eval", "to_module"),
    (llama, "train", "swap"),
    (t5, "eval", "functional_call"),
    (t5, "train", "to_module"),
    (resnet, "eval", "functional_call"),
    (resnet, "train", "swap"),
    (vit, "eval", "swap"),
    (vit, "train", "to_module"),
    (efficientnet, "eval", "to_module"),
    (efficientnet, "train", "functional_call"),
]


def param_sets(model: nn.Module, n: int) -> list[dict[str, torch.Tensor]]:
    """``n`` sets with the model's keys, tied names given once (the swap ties them), float
    values perturbed; the parameters of the first block require grad (gradients checked)."""
    gen = torch.Generator().manual_seed(0)
    named = [*model.named_parameters(), *model.named_buffers()]  # duplicates removed
    first = named[0][0].rsplit(".", 1)[0]
    out = []
    for i in range(n):
        values = {}
        for key, value in named:
            v = value.detach().clone()
            if v.is_floating_point() and i:
                v += 0.01 * i * torch.randn(v.shape, generator=gen).abs()
            if isinstance(value, nn.Parameter) and key.startswith(first):
                v.requires_grad_(True)
            values[key] = v
        out.append(values)
    return out


def own_breaks(model: nn.Module, inputs: tuple[Any, ...]) -> int:
    """Graph breaks of the model itself under a plain ``torch.compile``, without fcall."""
    torch._dynamo.reset()
    found = torch._dynamo.explain(model)(*inputs)
    torch._dynamo.reset()
    return len(found.break_reasons)


@pytest.mark.parametrize(
    "build, mode, api", CASES, ids=[f"{b.__name__}-{m}-{a}" for b, m, a in CASES]
)
def test_zoo(build: Callable[[], tuple[nn.Module, tuple[Any, ...]]], mode: str, api: str) -> None:
    torch.manual_seed(0)
    model, inputs = build()
    model.train(mode == "train")
    breaks = own_breaks(model, inputs)
    report = check_swap_parity(
        model,
        param_sets(model, SETS),
        inputs,
        api=api,
        backends=BACKENDS,
        fullgraph=breaks == 0,
        max_graph_breaks=breaks,
        atol=1e-4,
        rtol=1e-4,
    )
    for backend in report.backends:
        assert backend.recompiles == ()
        assert len(backend.graph_breaks) <= breaks
