# gplan export of plan 48660b8c4549f069 (layout 87a0eec3aee1c53c; llama3-70b: dp=16 tp=4 pp=1 mbs=1 zero=3 sp, recompute 2 full of 80 layers, predicted 62.268 s/step)
# written for torchtitan 0.3.0 (torchtitan.train, ConfigManager; checked by its own parser)
"""The plan's model and pipeline chunks as a torchtitan config function: `--module gplan_torchtitan --config
gplan_plan`. Built from torchtitan's public config classes (its llama3 block, GQA and FFN config helpers),
initialised as its llama3 builder does, so the model is torchtitan's Llama with the plan's shape."""

import dataclasses

from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
from functools import partial

import torch.nn as nn
from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
from torchtitan.models.common.config_utils import get_attention_config, make_ffn_config, make_gqa_config
from torchtitan.models.common.param_init import depth_scaled_std
from torchtitan.models.llama3 import Llama3Model, model_registry
from torchtitan.models.llama3.config_registry import llama3_8b
from torchtitan.models.llama3.model import Llama3TransformerBlock

SHAPE = {'dim': 8192, 'n_layers': 80, 'n_heads': 64, 'n_kv_heads': 8, 'hidden_dim': 28672, 'vocab_size': 128256, 'rope_theta': 500000.0, 'max_seq_len': 8192, 'tie_embeddings': False}
MODULE_FQNS_PER_MODEL_PART = None
ACTIVATION_CHECKPOINT = 'full'
LOSS_CHUNKS = 8
DISABLE_CUDA_GRAPHS = None



def init(std: float) -> dict:
    """Truncated-normal weights and zero biases: torchtitan's llama3 initialisation."""
    return {"weight": partial(nn.init.trunc_normal_, std=std), "bias": nn.init.zeros_}


def layer(layer_id: int, rope) -> Llama3TransformerBlock.Config:
    s = SHAPE
    dim, depth = s["dim"], init(depth_scaled_std(0.02, layer_id))  # outputs scaled by depth, as torchtitan's
    return Llama3TransformerBlock.Config(
        attention_norm=RMSNorm.Config(normalized_shape=dim, param_init={"weight": nn.init.ones_}),
        ffn_norm=RMSNorm.Config(normalized_shape=dim, param_init={"weight": nn.init.ones_}),
        attention=make_gqa_config(dim=dim, n_heads=s["n_heads"], n_kv_heads=s["n_kv_heads"], wqkv_param_init=init(0.02),
                                  wo_param_init=depth, inner_attention=get_attention_config("flex"), fuse_qkv=True,
                                  rope=rope),
        feed_forward=make_ffn_config(dim=dim, hidden_dim=s["hidden_dim"], w1_param_init=init(0.02),
                                     w2w3_param_init=depth),
    )


def model_config() -> Llama3Model.Config:
    s = SHAPE
    dim, vocab = s["dim"], s["vocab_size"]
    rope = ComplexRoPE.Config(dim=dim // s["n_heads"], max_seq_len=s["max_seq_len"], theta=s["rope_theta"])
    output_std = dim ** -0.5
    return Llama3Model.Config(
        dim=dim, vocab_size=vocab, enable_weight_tying=s["tie_embeddings"],
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim,
                                        param_init={"weight": partial(nn.init.normal_, std=1.0)}),
        norm=RMSNorm.Config(normalized_shape=dim, param_init={"weight": nn.init.ones_}),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init={
            "weight": partial(nn.init.trunc_normal_, std=output_std, a=-3 * output_std, b=3 * output_std),
            "bias": nn.init.zeros_}),
        layers=[layer(i, rope) for i in range(s["n_layers"])],
    )


def converters() -> list:
    return []


def gplan_plan():
    config = llama3_8b()
    model = model_config()
    for converter in converters():  # as model_registry(converters=...) applies them
        model = converter.build().convert(model)
    config.model_spec = dataclasses.replace(model_registry('8B'), flavor="gplan", model=model)
    config.loss.loss_fn.global_vocab_size = SHAPE["vocab_size"]
    if LOSS_CHUNKS > 1:  # the trainer's ChunkedLossWrapper, at the plan's chunks
        config.loss.num_chunks = LOSS_CHUNKS
    else:  # the loss over the whole sequence, as the plan priced it
        config.loss = config.loss.loss_fn
    if DISABLE_CUDA_GRAPHS is not None:  # as priced, whatever the family's registered trainer config says
        config.training.disable_cuda_graphs = DISABLE_CUDA_GRAPHS
    policy = {"full": FullAC, "selective": SelectiveAC}.get(ACTIVATION_CHECKPOINT)
    config.activation_checkpoint = policy.Config() if policy else None
    if MODULE_FQNS_PER_MODEL_PART:
        config.parallelism.module_fqns_per_model_part = MODULE_FQNS_PER_MODEL_PART
    return config
