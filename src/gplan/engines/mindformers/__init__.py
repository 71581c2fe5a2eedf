"""MindFormers: per-stage recompute counts (recompute_config lists), offsets for uneven splits. Experts: its
parallel_core Qwen3-MoE and DeepSeek-V3 models (use_legacy: False).

Zero levels are what MindSpore's optimizer parallel runs: it slices the weights with the optimizer states and
gathers them before use, and `gradient_accumulation_shard` slices the accumulated gradients too — zero 3. Without
it the gradients stay whole: written and read as zero 1 (the weights priced whole: more memory than it takes).
No switch shards gradients while keeping the weights whole, so zero 2 is not a layout MindFormers runs."""

from gplan.engines.profile import Capabilities, DCP_RESHARDS, EngineProfile, MemoryAccounting, Resharding

OPTIMIZER_PARALLEL_ZERO = frozenset({0, 1, 3})  # off; on; on with gradient_accumulation_shard

ENGINE = EngineProfile(
    name="mindformers", title="MindFormers", order=5,
    runs_in_short="1F1B / interleaved, per-stage recompute counts, offsets, Qwen3/DeepSeek-V3 MoE, MTP",
    memory_in_short="mixed-precision states",
    capabilities=Capabilities("mindformers", frozenset({"1f1b", "interleaved_1f1b"}),
                              microbatches_at_least_stages=True, cp=False, tied_embeddings_across_stages=False,
                              recompute="per_stage", uneven_split=True, uneven_interleaved=True, zero=OPTIMIZER_PARALLEL_ZERO,
                              zero_with_pp=OPTIMIZER_PARALLEL_ZERO,
                              encoder_decoder=False, llama_family_only=True, experts=True, latent_attention=True,
                              latent_attention_split=True, expert_tp="etp1", token_dropping=True,
                              expert_families=frozenset({"qwen3_moe", "deepseek_v3"}), mtp=True),
    memory=MemoryAccounting(),
    resharding=Resharding(
        "MindSpore checkpoints with their strategy files", DCP_RESHARDS,
        "MindSpore's distributed checkpoint transformation (mindspore.transform_checkpoints, with the source and "
        "destination strategy files; MindFormers' auto_trans_ckpt runs it at load)",
        conversion="mindspore.transform_checkpoints(src_dir, dst_dir, prefix, src_strategy_file, dst_strategy_file), "
                   "or load_checkpoint with auto_trans_ckpt: True and the old strategy file"),
)
