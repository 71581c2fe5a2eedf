"""MindFormers: per-stage recompute counts (recompute_config lists), offsets for uneven splits. Experts: its
parallel_core Qwen3-MoE and DeepSeek-V3 models (use_legacy: False)."""

from gplan.spec.engines.profile import ALL_ZERO, Capabilities, DCP_RESHARDS, EngineProfile, MemoryAccounting, Resharding

ENGINE = EngineProfile(
    name="mindformers", title="MindFormers", order=5, exporter="mindformers",
    capabilities=Capabilities("mindformers", frozenset({"1f1b", "interleaved_1f1b"}),
                              microbatches_at_least_stages=True, cp=False, tied_embeddings_across_stages=False,
                              recompute="per_stage", uneven_split=True, zero=ALL_ZERO, zero_with_pp=ALL_ZERO,
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
