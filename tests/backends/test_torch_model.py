"""The torch worker's model has the ModelSpec's shape: parameter counts equal the spec's (an explicit
head width, GQA, tied and untied heads, biases), and RoPE turns at the spec's base."""

from __future__ import annotations

import pytest

from gplan.spec.model import ModelSpec
from helpers import TINY_GPT, TINY_LLAMA, requires_engine

WIDE_HEADS = TINY_LLAMA.model_copy(update={"name": "wide-heads", "head_dim": 32, "rope_theta": 1e6})
"""4 heads of 32 on a 64-wide model (Mistral-Nemo's shape in small)."""


@requires_engine("torch", "torch")
@pytest.mark.parametrize("spec", [TINY_LLAMA, TINY_GPT, WIDE_HEADS], ids=lambda s: s.name)
def test_worker_model_has_the_specs_parameters(spec: ModelSpec):
    import torch

    from gplan.backends.torch.model import ModelArgs, Transformer

    args = ModelArgs.from_spec(spec, spec.seq_length)
    with torch.device("meta"):
        model = Transformer(args)
    assert sum(p.numel() for p in model.parameters()) == spec.total_params()
    assert args.head_dim == spec.kv_channels and args.rope_theta == spec.rope_theta


@requires_engine("torch", "torch")
def test_worker_trains_a_model_with_an_explicit_head_width():
    import torch

    from gplan.backends.torch.model import ModelArgs, Transformer

    torch.manual_seed(0)
    model = Transformer(ModelArgs.from_spec(WIDE_HEADS, 16))
    tokens = torch.randint(0, WIDE_HEADS.vocab_size, (2, 16))
    logits = model(tokens)
    assert logits.shape == (2, 16, WIDE_HEADS.vocab_size)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
    assert model.layers["0"].attention.wq.weight.shape == (4 * 32, 64)
