"""MindFormers: the `parallel_config`, `parallel` and `recompute_config` sections of a MindFormers
training YAML, and the model's per-stage layer `offset`.

MindFormers gives stage i `num_layers // pipeline_stage + offset[i]` layers (offsets sum to
`num_layers % pipeline_stage`), and recomputes the first `recompute[i]` layers of stage i fully and
`select_recompute[i]` selectively — so the plan's uneven split and per-stage recompute carry over
exactly. zero ≥ 1 turns on MindSpore's optimizer parallel, zero 3 with `gradient_accumulation_shard`
(MindFormers runs zero 0, 1 and 3: engines/mindformers); vocabulary-parallel embedding is
`vocab_emb_dp: False`.

The global batch follows MindFormers' trainer rule: with pipeline stages it is
`batch_size × data_parallel × micro_batch_num`, without them `micro_batch_num` is reset to 1 and it is
`batch_size × data_parallel × gradient_accumulation_steps` — so the plan's micro-batch count goes to
whichever of the two MindFormers reads.

Mixtures of experts go to MindFormers' parallel_core models (`use_legacy: False`): a Qwen3-MoE shape as
`qwen3_moe`, a DeepSeek-V3 shape as `deepseek_v3`, their model configs in Hugging Face names (which
MindFormers converts to its TransformerConfig), `expert_parallel` in `parallel_config` and all-to-all
enabled. MindFormers never tp-shards its experts (etp 1) and folds ep into dp·tp.
"""

from __future__ import annotations

import yaml

from gplan.backends.exporters import Export, ExportContext, recompute_counts, stage_sizes, stamp
from gplan.backends.mindspore.strategy import optimizer_parallel_note
from gplan.errors import InputError
from gplan.plan import Plan, layouts_of
from gplan.spec.parallel import StageLayout, chunk_sizes
from gplan.spec.targets import expert_family

VERSIONS = {"2.1": "MindFormers 2.1 (LlamaConfig, TransformerOpParallelConfig) on MindSpore 2.10"}

EXACT = (
    "model shape (hidden, heads, kv heads, MLP, vocabulary, rope `theta`); dp/mp/pp, sp; per-stage offsets "
    "and full/selective counts; micro-batches (`micro_batch_num` with pp, `gradient_accumulation_steps` "
    "without)")
"""What its files run exactly as the plan priced it (docs/exporting.md's table, from bench/engine_tables.py)."""
APPROXIMATED = (
    "its `select_recompute` recomputes its default operators, and optimizer parallel slices the weights as "
    "zero 3 (noted); no `head_dim`; Llama family only")
"""What it runs differently (re-priced, noted) or refuses."""

COMPUTE_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}

SEMI_AUTO_PARALLEL = 1
"""MindFormers' `parallel_mode` code: 0 data, 1 semi-auto, 2 auto, 3 hybrid parallel."""


def sections(plan: Plan, layouts: list[StageLayout] | None = None) -> dict:
    c, m = plan.parallel, plan.model
    layouts = layouts or layouts_of(plan)
    sizes = stage_sizes(layouts)
    pipelined = c.pp > 1
    parallel_config = {
        "data_parallel": c.dp, "model_parallel": c.tp, "pipeline_stage": c.pp, "context_parallel": c.cp,
        "use_seq_parallel": bool(c.sp and c.tp > 1), "micro_batch_num": c.num_microbatches if pipelined else 1,
        # MindFormers turns vocab_emb_dp off under pipeline stages itself; say what it will run.
        "vocab_emb_dp": c.tp == 1 and not pipelined, "gradient_aggregation_group": 4,
    }
    parallel = {
        "parallel_mode": SEMI_AUTO_PARALLEL, "gradients_mean": False, "full_batch": True,
        "enable_parallel_optimizer": c.zero >= 1, "search_mode": "sharding_propagation",
        "strategy_ckpt_save_file": "./ckpt_strategy.ckpt",
        "parallel_optimizer_config": {"gradient_accumulation_shard": c.zero == 3, "parallel_optimizer_threshold": 64},
    }
    if c.vpp > 1:
        parallel["pipeline_config"] = {"pipeline_interleave": True, "pipeline_scheduler": "1f1b"}
    full, selective = recompute_counts(layouts, "full"), recompute_counts(layouts, "selective")
    recompute_config = {"recompute": full if any(full) else False,
                        "select_recompute": selective if any(selective) else False,
                        "parallel_optimizer_comm_recompute": False, "mp_comm_recompute": True}
    if not m.is_moe:  # the legacy models only: parallel_core refuses it (TransformerConfig.__post_init__)
        recompute_config["recompute_slice_activation"] = True
    if m.is_moe:
        parallel_config["expert_parallel"] = c.ep
        parallel["enable_alltoall"] = True  # the expert dispatch's all-to-all (MindSpore's auto-parallel context)
    elif m.head_dim:
        raise InputError(f"MindFormers' LlamaConfig has no head_dim: it derives {m.hidden_size // m.num_attention_heads} "
                         f"from hidden/heads, the model has {m.head_dim}", hint="export to megatron or torchtitan")
    # The model's shape, so that MindFormers builds the plan's model whatever YAML it is merged into.
    model_config = {"num_layers": m.num_layers, "offset": offsets(sizes, m.num_layers, c.pp, c.vpp),
                    "seq_length": plan.training.seq_length, "hidden_size": m.hidden_size,
                    "num_heads": m.num_attention_heads, "n_kv_heads": m.kv_heads, "intermediate_size": m.ffn_size,
                    "vocab_size": m.vocab_size, "theta": m.rope_theta,
                    "compute_dtype": COMPUTE_DTYPE[plan.training.precision]}
    if m.is_moe:
        model_config = expert_model_config(plan, model_config["offset"])
    if c.vpp > 1:
        model_config["pp_interleave_num"] = c.vpp
    return {"run_mode": "train", "use_parallel": True, "micro_batch_interleave_num": 1,
            **({"use_legacy": False} if m.is_moe else {}),
            "parallel_config": parallel_config, "parallel": parallel, "recompute_config": recompute_config,
            "model": {"model_config": model_config},
            "runner_config": {"batch_size": c.mbs,
                              "gradient_accumulation_steps": 1 if pipelined else c.num_microbatches}}


def offsets(sizes: list[int], layers: int, pp: int, vpp: int) -> list[int] | list[list[int]] | int:
    """MindFormers' `offset`: each stage's layers beyond `layers // pp`; interleaved, one row per chunk of
    each stage's layers beyond `layers // (pp·vpp)` (LayerSetting's (pp_interleave_num, pp) offset,
    mindformers parallel_core/training_graph/transformer/utils.py), the chunks split as gplan's other
    exports split them (spec.parallel.chunk_sizes); 0 where the split is even."""
    if vpp == 1:
        return [n - layers // pp for n in sizes]
    chunks = [chunk_sizes(n, vpp, first=r == 0, last=r == pp - 1) for r, n in enumerate(sizes)]
    table = [[chunks[r][v] - layers // (pp * vpp) for r in range(pp)] for v in range(vpp)]
    return 0 if not any(any(row) for row in table) else table


MOE_ARCHITECTURES = {"qwen3_moe": "Qwen3MoeForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM"}


def expert_model_config(plan: Plan, offset) -> dict:
    """A parallel_core model config in the Hugging Face names MindFormers' converter maps
    (`parallel_core/transformer_config_utils.py`, COMMON_CONFIG_MAPPING)."""
    m, family = plan.model, expert_family(plan.model)  # one of MOE_ARCHITECTURES: the target's capability
    config = {"model_type": family, "architectures": MOE_ARCHITECTURES[family], "offset": offset,
              "num_hidden_layers": m.num_layers, "seq_length": plan.training.seq_length,
              "max_position_embeddings": max(plan.training.seq_length, m.seq_length), "hidden_size": m.hidden_size,
              "intermediate_size": m.ffn_size, "num_attention_heads": m.num_attention_heads,
              "num_key_value_heads": m.kv_heads, "vocab_size": m.vocab_size, "rope_theta": m.rope_theta,
              "tie_word_embeddings": m.tie_embeddings, "compute_dtype": COMPUTE_DTYPE[plan.training.precision],
              "use_flash_attention": True, "num_experts": m.num_experts, "num_experts_per_tok": m.top_k,
              "moe_intermediate_size": m.expert_ffn_size, "moe_grouped_gemm": True,
              "moe_token_dispatcher_type": "alltoall"}
    if m.capacity_factor is not None:
        config["moe_expert_capacity_factor"] = m.capacity_factor  # its name in the converter; "capacity_factor" is dropped
    if family == "qwen3_moe":
        return {**config, "head_dim": m.kv_channels, "qk_layernorm": True}
    return {**config, "multi_latent_attention": True, "qk_layernorm": True, "q_lora_rank": m.q_lora_rank,
            "kv_lora_rank": m.kv_lora_rank, "qk_nope_head_dim": m.kv_channels, "qk_rope_head_dim": m.qk_rope_head_dim,
            "v_head_dim": m.v_head_dim or m.kv_channels, "n_shared_experts": m.num_shared_experts,
            # its DeepseekV3Config drops `scoring_func` ("useless") and routes by moe_router_score_function
            "first_k_dense_replace": m.first_dense_layers, "moe_layer_freq": 1, "moe_router_score_function": m.router,
            "moe_router_enable_expert_bias": m.router == "sigmoid", "num_nextn_predict_layers": m.mtp_layers,
            # its DeepseekV3Config's own names, which would otherwise keep DeepSeek-V3 671B's defaults (256 experts,
            # top 8, 8 groups of which 4 routed to: a 64-expert, top-6 shape with them is refused by its converter)
            "n_routed_experts": m.num_experts, "n_group": m.router_groups or 1, "topk_group": m.router_group_topk or 1,
            **({"routed_scaling_factor": m.router_topk_scale} if m.router_topk_scale else {})}


def notes(plan: Plan, layouts: list[StageLayout]) -> list[str]:
    """Where MindFormers runs something other than what the plan priced."""
    found = []
    if any(recompute_counts(layouts, "selective")):
        found.append("MindFormers' select_recompute recomputes its default operators (the FFN gate multiply and "
                     "activation), not Megatron's attention core that the plan priced; give select_recompute a "
                     "pattern dict to choose other operators")
    if plan.model.is_moe:
        found.append("routing details gplan does not model (expert groups, route scaling, the auxiliary loss) take "
                     "MindFormers' defaults: set them in model_config if your run needs them")
    sharding = optimizer_parallel_note(plan.parallel.zero)
    return found + ([sharding] if sharding else [])


def export(plan: Plan, context: ExportContext) -> Export:
    found = notes(plan, context.layouts)
    text = (stamp(plan, context.version) + "\n# Merge into your MindFormers training YAML (these sections replace "
            "yours).\n" + "".join(f"# note: {n}\n" for n in context.notes + found))
    body = yaml.safe_dump(sections(plan, context.layouts), sort_keys=False)
    return Export({"mindformers_parallel.yaml": text + body}, found)
