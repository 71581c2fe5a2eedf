"""Megatron-LM (and NeMo / Megatron-Bridge, which run Megatron-core): one --recompute-num-layers for every
chunk (arguments.py, --recompute-method block); --recompute-granularity selective takes no method: every
layer (validate_args)."""

from gplan.engines.profile import ALL_ZERO, Capabilities, DCP_RESHARDS, EngineProfile, MemoryAccounting, Resharding

ENGINE = EngineProfile(
    name="megatron", title="Megatron-LM", order=2,
    runs_in_short=("1F1B / interleaved, cp, block recompute, uneven interleaving, MoE any etp, MLA, MTP, "
                   "FP8/MXFP8/NVFP4, tp-comm overlap"),
    memory_in_short="mixed-precision states (Megatron's 18 bytes)",
    capabilities=Capabilities("megatron", frozenset({"1f1b", "interleaved_1f1b"}), microbatches_at_least_stages=False,
                              cp=True, tied_embeddings_across_stages=True, recompute="block", uneven_split=True,
                              zero=ALL_ZERO, zero_with_pp=ALL_ZERO, encoder_decoder=False, sliding_window=True,
                              attention_sinks=True, clamped_glu=True,
                              precisions=frozenset({"bf16", "fp16", "fp32", "fp8", "mxfp8", "nvfp4"}),
                              low_precision_experts=True, mtp=True,
                              experts=True, latent_attention=True, latent_attention_split=True, expert_tp="any",
                              # Megatron-FSDP (zero 2/3) with ep: experts sharded over the expert data-parallel
                              # group (megatron-core 0.16 distributed/fsdp/mcore_fsdp_adapter.py, expt_dp)
                              expert_zero=ALL_ZERO,
                              uneven_interleaved=True, token_dropping=True, grad_reduce_in_bf16=True,
                              fp8_param_gather=True, legacy_grouped_gemm=True, activation_offload=True, moe_a2a_overlap=True,
                              precision_aware_optimizer=True, adam_moments=True, master_weights=True,
                              optimizer_offload=True, optimizer_offload_overlap=True, moe_shared_expert_overlap=True,
                              moe_pad_to_capacity=True,
                              cuda_graphs=True, moe_dispatcher=frozenset({"alltoall", "allgather", "flex"}),
                              recompute_modules=frozenset({"core_attn", "mlp", "moe", "moe_act", "shared_experts",
                                                           "layernorm", "mla_up_proj"}),
                              tp_comm_overlap=frozenset({"bf16", "fp16", "fp8", "mxfp8"}),
                              no_param_gather_overlap=frozenset({"mxfp8"}), sharded_dp_overlaps=True),
    speed_reference=True,  # the catalogue's efficiencies are fitted on its runs (bench/accuracy.py --fit)
    memory=MemoryAccounting(),  # Megatron's theoretical_memory_usage: 18 bytes, the distributed optimizer's 6 + 12/d,
    resharding=Resharding(
        "torch_dist (--ckpt-format torch_dist, dist_checkpointing)", DCP_RESHARDS,
        "megatron-core 0.16.1 dist_checkpointing: weights load under any tp, pp, dp; the distributed optimizer's "
        "default 'dp_reshardable' state reshards over dp only, 'fully_reshardable' over tp and pp too "
        "(optimizer/distrib_optimizer.py, sharded_param_state)",
        optimizer_pins=frozenset({"tp", "pp", "vpp", "cp", "ep", "etp", "zero", "split"}),
        unpinned_by="--dist-ckpt-optim-fully-reshardable"),
)
