"""Small plans for the backend tests: a tiny Llama (GQA, swiglu, RMSNorm, RoPE, untied) and a tiny
GPT (gelu, LayerNorm with biases, learned positions, tied embeddings), on the local-cpu cluster."""

from __future__ import annotations

from pathlib import Path

from gplan.plan import Plan, write_plan
from gplan.planner.build import make_plan
from gplan.profiles.catalogue import load_cluster
from gplan.spec.model import ModelSpec
from gplan.spec.parallel import LayerCount, ParallelConfig, StageLayout
from gplan.spec.training import TrainingSpec

TINY_LLAMA = ModelSpec(name="tiny-llama", num_layers=4, hidden_size=64, num_attention_heads=4, num_kv_heads=2,
                       ffn_hidden_size=176, ffn_kind="swiglu", vocab_size=256, seq_length=32, norm="rmsnorm",
                       position_embedding="rope")
TINY_GPT = ModelSpec(name="tiny-gpt", num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=256,
                     seq_length=32, tie_embeddings=True, bias=True)
SMALL_LLAMA = ModelSpec(name="small-llama", num_layers=4, hidden_size=256, num_attention_heads=8, num_kv_heads=4,
                        ffn_hidden_size=688, ffn_kind="swiglu", vocab_size=1024, seq_length=128, norm="rmsnorm",
                        position_embedding="rope")
"""Big enough that compute, not Python overhead, fills a CPU step (for timing and calibration)."""
TRAINING = TrainingSpec(gbs=8, seq_length=32, precision="fp32")


def tiny_plan(path: Path, model: ModelSpec = TINY_LLAMA, stages: list[list[tuple[str, int]]] | None = None,
              training: TrainingSpec = TRAINING, **degrees) -> Path:
    """Write a plan; `stages` gives each stage's (recompute, layers) in order, e.g. [[("none", 1)],
    [("full", 2), ("none", 1)]]; default: the uniform split."""
    config = ParallelConfig(**degrees)
    cluster = load_cluster("local-cpu", config.world_size).sized(config.world_size)
    layouts = None
    if stages:
        layouts = [StageLayout(layers=[LayerCount(kind="decoder", recompute=r, count=n) for r, n in stage],
                               embedding=i == 0, head=i == len(stages) - 1) for i, stage in enumerate(stages)]
    plan: Plan = make_plan(model, training, cluster, config, layouts)
    write_plan(plan, path)
    return path
