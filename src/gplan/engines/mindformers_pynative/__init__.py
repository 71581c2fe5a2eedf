"""MindFormers' PyNative trainer (mindformers/pynative, MindFormers 1.8+: its DeepSeek-V3 1B and DeepSeek-V4 recipes,
its Qwen3 models): torchtitan's layout ported to MindSpore. Its `ParallelDims` (pynative/distributed/parallel_dims.py)
shards every weight, gradient and optimizer state over the `data_parallel_shard` ranks (FSDP; HSDP replicas
outside them), carves expert parallelism out of those ranks × cp × tp (efsdp·ep = dp_shard·cp·tp), and runs tp
with sequence parallelism (required), cp and pipeline stages whose layers a YAML gives rank by rank and chunk by
chunk (`pipeline_parallel_layers_per_stage`). Its weights are bf16 with fp32 master copies, fp32 main gradients
reduced in fp32 and fp32 Adam states (pynative/optimizer/adamw.py, base_models/gpt/parallelize.py) — Megatron's
mixed-precision states, sharded. MindFormers' graph-mode YAMLs (`parallel_config`) are engines/mindformers."""

from gplan.engines.profile import Capabilities, DCP_RESHARDS, EngineProfile, MemoryAccounting, Resharding

FSDP_ZERO = frozenset({0, 2, 3})  # dp_shard 1 (replicas), weights kept gathered ("never"), resharded ("always")

ENGINE = EngineProfile(
    name="mindformers-pynative", title="MindFormers (PyNative trainer)", order=8,
    runs_in_short="FSDP (HSDP), ep inside FSDP·cp·tp, tp with sp, cp, 1F1B / interleaved / GPipe, full recompute by layer",
    memory_in_short="mixed-precision states, FSDP-sharded",
    capabilities=Capabilities("mindformers-pynative", frozenset({"1f1b", "interleaved_1f1b", "gpipe"}),
                              microbatches_at_least_stages=True, cp=True, tied_embeddings_across_stages=False,
                              recompute="per_stage", uneven_split=True, uneven_interleaved=True,
                              zero=FSDP_ZERO, zero_with_pp=FSDP_ZERO, encoder_decoder=False, llama_family_only=True,
                              # its recompute `select` names modules by path, not read: full or none
                              selective=False, recompute_modules=frozenset(),
                              experts=True, latent_attention=True, latent_attention_split=True,
                              # its grouped experts keep their width: ep folds into dp_shard·cp·tp, etp 1
                              expert_tp="etp1", ep_within_fsdp=True, expert_zero=FSDP_ZERO,
                              expert_families=frozenset({"deepseek_v3"}), mtp=True,
                              # moe_grouped_gemm: the local experts in one grouped kernel
                              per_expert_launches=False),
    memory=MemoryAccounting(),
    resharding=Resharding(
        "MindFormers' PyNative checkpoints (safetensors with their global layout)", DCP_RESHARDS,
        "its checkpoint section's load_balanced / reshard_worker_num: a checkpoint loads under another layout "
        "(mindformers/pynative/config/config.py CheckpointConfig)"),
)
